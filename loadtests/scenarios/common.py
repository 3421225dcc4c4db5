"""What the user classes of one locust process share: the secrets from provisioning, the newest version of the
versioned query whose publish has returned, and the checks every scenario makes on an answer.

Settings (environment variables, all optional):

- ``LOADTEST_MAX_ID``: keys are drawn from 1..MAX_ID (default: what provisioning found, 1,000,000 for the demo).
- ``LOADTEST_WAIT_S``: seconds each simulated user waits between calls (default 0: as fast as answers come).
- ``LOADTEST_CHURN_WAIT_S``: seconds the management-churn user waits between changes (default 0.5).
"""
from __future__ import annotations

import logging
import os
import random
import threading
from dataclasses import dataclass, field

from locust import constant
from locust.exception import StopUser

log = logging.getLogger('loadtests')


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, '')
    try:
        return float(raw) if raw.strip() else default
    except ValueError:
        raise SystemExit(f'{name} must be a number, not {raw!r}') from None


@dataclass
class State:
    """One process's view of the test. Filled by provisioning (locust master / local runner) or by the master's
    ``loadtests:setup`` message (distributed workers)."""
    secrets: dict = field(default_factory=dict)     # scenario -> API key secret
    admin_key: str = ''         # for the management-churn user
    max_id: int = 1_000_000
    newest_version: int = 0     # the newest version of the versioned query whose publish call has returned
    writes: str = 'unknown'     # 'allowed', or why the server refused a write at setup
    notes: list = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)
    counts: dict = field(default_factory=dict)   # scenario-specific tallies printed at test_stop
    lock: threading.Lock = field(default_factory=threading.Lock)

    def to_message(self) -> dict:
        return {'secrets': self.secrets, 'admin_key': self.admin_key, 'max_id': self.max_id,
                'newest_version': self.newest_version, 'writes': self.writes, 'notes': self.notes}

    def load_message(self, data: dict):
        self.secrets = dict(data['secrets'])
        self.admin_key = data.get('admin_key', '')
        self.max_id = int(data['max_id'])
        self.newest_version = max(self.newest_version, int(data['newest_version']))
        self.writes = data['writes']
        self.notes = list(data.get('notes', []))
        self.ready.set()

    def count(self, name: str, n: int = 1):
        with self.lock:
            self.counts[name] = self.counts.get(name, 0) + n

    def saw_version(self, version: int):
        """A publish of `version` has returned: from now on no answer may show an older one."""
        with self.lock:
            if version > self.newest_version:
                self.newest_version = version


STATE = State()


def secret(scenario: str) -> str:
    """The API key of a scenario; stops the user (with the reason in the log) if setup did not make one."""
    if not STATE.ready.wait(timeout=60):
        raise StopUser()
    value = STATE.secrets.get(scenario)
    if not value:
        log.error('no API key for scenario %r: provisioning did not create it (see the setup lines above)',
                  scenario)
        raise StopUser()
    return value


def random_aid(span: int = 0) -> int:
    return random.randint(1, max(1, STATE.max_id - span))


def default_wait():
    return constant(env_float('LOADTEST_WAIT_S', 0.0))


def error_code(response) -> str:
    """The stable `code` of an error answer ('' when there is none)."""
    try:
        body = response.json()
    except Exception:
        return ''
    return body.get('code', '') if isinstance(body, dict) else ''


def describe(response) -> str:
    text = (response.text or '')[:200] if hasattr(response, 'text') else ''
    return f'{response.status_code} {text}'.strip()


def rows_of(response):
    """The JSON list of rows of a 200 answer, or None."""
    try:
        body = response.json()
    except Exception:
        return None
    return body if isinstance(body, list) else None


def check_lookup(response, aid: int, column: str = 'aid') -> bool:
    """200 with exactly the row for `aid`; marks the response and returns whether it passed."""
    if response.status_code != 200:
        response.failure(f'{response.status_code} {error_code(response) or describe(response)}')
        return False
    rows = rows_of(response)
    if not rows or len(rows) != 1 or rows[0].get(column) != aid:
        response.failure(f'wrong answer for aid={aid}: {describe(response)}')
        return False
    response.success()
    return True


def header(response, name: str):
    """A response header, whatever the client's header object (case-insensitive)."""
    headers = response.headers
    value = headers.get(name) if headers is not None else None
    if value is None and headers is not None:
        lowered = name.lower()
        for key in headers.keys():
            if key.lower() == lowered:
                return headers[key]
    return value
