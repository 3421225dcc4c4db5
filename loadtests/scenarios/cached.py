"""Cached reads, checked against the database after every write (tag ``cached``).

Each user owns one account drawn at random (1M accounts: two users rarely share one) and the
cached lookup ``account_cached`` (``cache_ttl`` 60). It reads its account through the cache
(hits and misses counted from ``X-Cache``) and, one call in six, deposits into it through the
gateway: right after the deposit's answer the cached read must show the balance the database
holds (read with ``cache=false``), or the call fails as "STALE CACHED ANSWER". A write through
the gateway invalidates the cached answers of what it touched before it is answered
(docs/cache.md), so this never fails on a correct fleet. Needs writes
(GATEWAY_ALLOW_WRITES=1), like Deposit.
"""
from __future__ import annotations

import random

from locust import FastHttpUser, tag, task

from .common import STATE, default_wait, describe, error_code, header, random_aid, rows_of, secret

STALE = '/q/account_cached: STALE CACHED ANSWER'


class CachedReadWrite(FastHttpUser):
    weight = 1
    wait_time = default_wait()

    def on_start(self):
        self.headers = {'X-API-Key': secret('writer')}
        self.aid = random_aid()
        self.balance = self._balance('/q/account?aid={aid}', '/q/account [cached: truth]')

    def _balance(self, path: str, name: str):
        with self.client.get(path.format(aid=self.aid), headers=self.headers, name=name,
                             catch_response=True) as response:
            rows = rows_of(response) if response.status_code == 200 else None
            if not rows or rows[0].get('aid') != self.aid:
                response.failure(f'{response.status_code} {error_code(response) or describe(response)}')
                return None
            state = header(response, 'X-Cache')
            if state:
                STATE.count(f'cache_{state}')
            response.success()
            return rows[0].get('abalance')

    @tag('cached')
    @task(5)
    def read(self):
        seen = self._balance('/q/account_cached?aid={aid}', '/q/account_cached [cached]')
        if self.balance is not None and seen is not None and seen != self.balance:
            # Only this user writes this account: a cached read older than its last write is stale.
            STATE.count('stale_cached')
            self.environment.events.request.fire(request_type='GET', name=STALE, response_time=0, response_length=0,
                                                 exception=AssertionError(f'aid={self.aid}: {seen} != {self.balance}'))

    @tag('cached')
    @task(1)
    def write_then_read(self):
        delta = random.randint(1, 9)
        with self.client.get(f'/q/deposit?aid={self.aid}&delta={delta}', headers=self.headers,
                             name='/q/deposit [cached]', catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f'{response.status_code} {error_code(response) or describe(response)}')
                return
            response.success()
        truth = self._balance('/q/account?aid={aid}&cache=false', '/q/account [cached: truth]')
        self.balance = truth
        self.read()
