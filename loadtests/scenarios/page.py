"""A 100-row page: account_page (pgbench_accounts joined to pgbench_branches) from a random start, page_size=100."""
from __future__ import annotations

from locust import FastHttpUser, tag, task

from .common import default_wait, describe, error_code, random_aid, rows_of, secret
from .provision import PAGE_SIZE


class AccountPage(FastHttpUser):
    """GET /q/account_page?start=<random>&page_size=100: 100 rows, aids start..start+99 in order."""
    weight = 2
    wait_time = default_wait()

    def on_start(self):
        self.headers = {'X-API-Key': secret('plain')}

    @tag('page', 'read')
    @task
    def account_page(self):
        start = random_aid(span=PAGE_SIZE - 1)
        with self.client.get(f'/q/account_page?start={start}&page_size={PAGE_SIZE}', headers=self.headers,
                             name='/q/account_page [100 rows]', catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f'{response.status_code} {error_code(response) or describe(response)}')
                return
            rows = rows_of(response)
            if rows is None or [r.get('aid') for r in rows] != list(range(start, start + PAGE_SIZE)):
                response.failure(f'wrong page from start={start}: {len(rows or [])} rows')
                return
            response.success()
