"""Management churn while readers run: no stale answer, no stale key.

- ``ManagementChurn`` (one user in the whole test, fixed_count = 1) loops, every LOADTEST_CHURN_WAIT_S seconds
  (default 0.5): publish a new version of account_versioned whose SQL answers its own number (N AS version,
  alternating between two statement shapes), or cycle a throwaway key: create it, call with it (must answer 200
  at once), rotate it (the old secret must answer 401 at once, the new one 200), delete it (401 at once).
- ``ChurnReader`` calls account_versioned and fails any answer older than the newest version whose publish call
  had returned in this process *before the read was sent* (the gateway's promise: once a management call has
  returned, no worker serves the old state). Readers in other locust processes (distributed runs) only know the
  version published when the test started, so run churn in one process for the strict check.
"""
from __future__ import annotations

import itertools
import os

from locust import FastHttpUser, constant, tag, task

from . import provision
from .common import STATE, default_wait, describe, env_float, error_code, random_aid, rows_of, secret

READ_NAME = '/q/account_versioned [churn reader]'
_victims = itertools.count(1)


def check_version(response, aid: int, floor: int) -> int | None:
    """The version an answer shows, after checking it is the row for `aid` and not older than `floor`."""
    if response.status_code != 200:
        response.failure(f'{response.status_code} {error_code(response) or describe(response)}')
        return None
    rows = rows_of(response)
    if not rows or len(rows) != 1 or rows[0].get('aid') != aid or not isinstance(rows[0].get('version'), int):
        response.failure(f'wrong answer for aid={aid}: {describe(response)}')
        return None
    seen = rows[0]['version']
    if seen < floor:
        STATE.count('stale_answers')
        response.failure(f'STALE: answered version {seen}, but the publish of version {floor} had returned '
                         'before this call was sent')
        return seen
    response.success()
    return seen


class ChurnReader(FastHttpUser):
    weight = 2
    wait_time = default_wait()

    def on_start(self):
        self.headers = {'X-API-Key': secret('churn')}

    @tag('churn')
    @task
    def read_versioned(self):
        aid = random_aid()
        floor = STATE.newest_version     # taken before sending: anything older is stale
        with self.client.get(f'/q/account_versioned?aid={aid}', headers=self.headers, name=READ_NAME,
                             catch_response=True) as response:
            check_version(response, aid, floor)


class ManagementChurn(FastHttpUser):
    fixed_count = 1
    wait_time = constant(env_float('LOADTEST_CHURN_WAIT_S', 0.5))

    def on_start(self):
        secret('churn')  # waits for setup
        self.admin = {'X-API-Key': STATE.admin_key or provision.admin_key_from_env(),
                      'Content-Type': 'application/json'}
        self.version = STATE.newest_version
        self.body = dict(provision.queries()['account_versioned'])

    @tag('churn')
    @task(2)
    def publish_next(self):
        wanted = self.version + 1
        body = {**self.body, 'sql': provision.versioned_sql(wanted), 'publish': True}
        with self.client.post('/api/v1/queries/account_versioned/versions', json=body, headers=self.admin,
                              name='/api/v1/queries/account_versioned/versions [publish]',
                              catch_response=True) as response:
            if response.status_code not in (200, 201):
                response.failure(f'{response.status_code} {error_code(response) or describe(response)}')
                return
            try:
                got = int(response.json().get('published_version'))
            except Exception:
                response.failure(f'no published_version in {describe(response)}')
                return
            if got != wanted:
                response.failure(f'the server numbered the new version {got}, expected {wanted} (another '
                                 'process publishing? versions are checked by the number their SQL answers)')
            else:
                response.success()
        # The publish call has returned: from now on nothing older than `wanted` may be served.
        self.version = max(wanted, got)
        STATE.saw_version(wanted)
        STATE.count('publishes')
        aid = random_aid()
        with self.client.get(f'/q/account_versioned?aid={aid}', headers={'X-API-Key': STATE.secrets['churn']},
                             name='/q/account_versioned [right after publish]', catch_response=True) as response:
            check_version(response, aid, wanted)

    @tag('churn')
    @task(1)
    def key_cycle(self):
        name = f'{provision.PREFIX}-victim-{os.getpid()}-{next(_victims)}'
        grants = {'name': name, 'queries': ['account_versioned'], 'connections': [provision.CONNECTION]}
        with self.client.post('/api/v1/api-keys', json=grants, headers=self.admin, name='/api/v1/api-keys [create]',
                              catch_response=True) as response:
            if response.status_code != 201:
                response.failure(f'{response.status_code} {error_code(response) or describe(response)}')
                return
            first = response.json()['secret']
        self._call(first, 200, '/q/account_versioned [key just created: 200]')
        # grace_minutes 0: the rotated-out secret stops at once (the default keeps it 60 minutes).
        with self.client.post(f'/api/v1/api-keys/{name}/rotate', json={'grace_minutes': 0}, headers=self.admin,
                              name='/api/v1/api-keys/[name]/rotate', catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f'{response.status_code} {error_code(response) or describe(response)}')
                return
            second = response.json()['secret']
        self._call(first, 401, '/q/account_versioned [rotated-out secret: 401]')
        self._call(second, 200, '/q/account_versioned [new secret: 200]')
        with self.client.delete(f'/api/v1/api-keys/{name}', headers=self.admin, name='/api/v1/api-keys/[name] [revoke]',
                                catch_response=True) as response:
            if response.status_code not in (200, 204):
                response.failure(f'{response.status_code} {error_code(response) or describe(response)}')
                return
        self._call(second, 401, '/q/account_versioned [revoked key: 401]')
        STATE.count('key_cycles')

    def _call(self, key: str, expected: int, name: str):
        aid = random_aid()
        with self.client.get(f'/q/account_versioned?aid={aid}', headers={'X-API-Key': key}, name=name,
                             catch_response=True) as response:
            if response.status_code != expected:
                if expected == 401:
                    STATE.count('stale_keys')
                    response.failure(f'STALE KEY: answered {response.status_code}, expected 401 once the '
                                     'management call had returned')
                else:
                    response.failure(f'{response.status_code} {error_code(response) or describe(response)}')
                return
            if expected == 200:
                check_version(response, aid, STATE.newest_version)
            else:
                response.success()


def summary() -> str | None:
    counts = STATE.counts
    if not counts.get('publishes') and not counts.get('key_cycles') and 'stale_answers' not in counts:
        return None
    return (f'management churn: {counts.get("publishes", 0)} publishes (newest version {STATE.newest_version}), '
            f'{counts.get("key_cycles", 0)} key create/rotate/revoke cycles; stale answers: '
            f'{counts.get("stale_answers", 0)}, stale keys: {counts.get("stale_keys", 0)}')
