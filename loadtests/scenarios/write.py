"""Writes: deposit (UPDATE one account), alone and in a 3:1 read/write mix.

A write runs only when the server allows writes (GATEWAY_ALLOW_WRITES=1) and the key has "allow_writes": true.
When the server refuses (403 write_not_allowed) every refused call is a failure named
"/q/deposit: WRITES REFUSED (403 write_not_allowed)", the reason is logged once, and the user slows to one try a
second - the run goes on and the summary says why.
"""
from __future__ import annotations

import random
import time

from locust import FastHttpUser, tag, task

from .common import STATE, check_lookup, default_wait, describe, error_code, header, log, random_aid, secret

REFUSED_NAME = '/q/deposit: WRITES REFUSED (403 write_not_allowed)'
_warned = False


def deposit(user, name: str):
    global _warned
    aid, delta = random_aid(), random.randint(1, 9)
    with user.client.get(f'/q/deposit?aid={aid}&delta={delta}', headers=user.writer_headers, name=name,
                         catch_response=True) as response:
        if response.status_code == 200:
            affected = header(response, 'X-Rows-Affected')
            if affected is not None and affected != '1':
                response.failure(f'deposit on aid={aid} touched {affected} rows, not 1')
            else:
                response.success()
            return
        code = error_code(response)
        if response.status_code == 403 and code == 'write_not_allowed':
            response.request_meta['name'] = REFUSED_NAME
            response.failure('the server or the key refuses writes: start the gateway with GATEWAY_ALLOW_WRITES=1 '
                             '(the lt-writer key has allow_writes)')
            STATE.count('writes_refused')
            if not _warned:
                _warned = True
                log.error('deposit: 403 write_not_allowed - the server refuses writes. Start it with '
                          'GATEWAY_ALLOW_WRITES=1; every deposit of this run is reported as "%s"', REFUSED_NAME)
            refused = True
        else:
            response.failure(f'{response.status_code} {code or describe(response)}')
            refused = False
    if refused:
        time.sleep(1.0)


class Deposit(FastHttpUser):
    """GET /q/deposit?aid=<random>&delta=<1..9> with the writer key: 200, one row affected."""
    weight = 1
    wait_time = default_wait()

    def on_start(self):
        self.writer_headers = {'X-API-Key': secret('writer')}

    @tag('write')
    @task
    def deposit(self):
        deposit(self, '/q/deposit [write]')


class ReadWriteMix(FastHttpUser):
    """Three lookups to one deposit, with the same (writer) key."""
    weight = 2
    wait_time = default_wait()

    def on_start(self):
        self.writer_headers = {'X-API-Key': secret('writer')}

    @tag('mix')
    @task(3)
    def read(self):
        aid = random_aid()
        with self.client.get(f'/q/account?aid={aid}', headers=self.writer_headers, name='/q/account [mix 3:1]',
                             catch_response=True) as response:
            check_lookup(response, aid)

    @tag('mix')
    @task(1)
    def write(self):
        deposit(self, '/q/deposit [mix 3:1]')
