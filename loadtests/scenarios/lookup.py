"""Primary-key lookups: a plain key, and a governed key (a query and a key of its own, so governance - a table
allow-list, masking - is added to them alone: LOADTEST_GOVERNED_GRANTS / LOADTEST_GOVERNED_QUERY)."""
from __future__ import annotations

from locust import FastHttpUser, tag, task

from .common import check_lookup, default_wait, random_aid, secret


class PlainLookup(FastHttpUser):
    """GET /q/account?aid=<random> with the plain key; the answer must be that one row."""
    weight = 4
    wait_time = default_wait()

    def on_start(self):
        self.headers = {'X-API-Key': secret('plain')}

    @tag('lookup', 'read')
    @task
    def account(self):
        aid = random_aid()
        with self.client.get(f'/q/account?aid={aid}', headers=self.headers, name='/q/account [plain]',
                             catch_response=True) as response:
            check_lookup(response, aid)


class GovernedLookup(FastHttpUser):
    """GET /q/account_governed?aid=<random> with the governed key (a rate limit and quota far above the load, so
    admission runs on every call; allowed_tables / mask once the gateway has them)."""
    weight = 2
    wait_time = default_wait()

    def on_start(self):
        self.headers = {'X-API-Key': secret('governed')}

    @tag('governed', 'read')
    @task
    def account_governed(self):
        aid = random_aid()
        with self.client.get(f'/q/account_governed?aid={aid}', headers=self.headers,
                             name='/q/account_governed [governed]', catch_response=True) as response:
            check_lookup(response, aid)
