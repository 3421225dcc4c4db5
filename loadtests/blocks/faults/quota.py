"""The quota'd key of the Redis fault: one client calling with a `300 calls/day` key, paced, through the Redis loss,
until it has been refused (429 quota_exceeded) for a whole second. How many calls the key was admitted in all is
the finding: at most the quota plus the calls in flight at the loss, if the counter is rebuilt from the run history;
about 200 + 300 if it restarts at 0.
"""
from __future__ import annotations

import http.client
import json
import threading
import time

CALLS, SPENT = 300, 200
PAUSE_S = 0.005
REFUSED_FOR_S = 1.0
# The in-flight bound of tests/fleet/test_quota_recovery.py: runs not yet written to the store when the counter is
# rebuilt (a history flush), those a worker's local fallback admits while Redis is away (fleet.shared.leases), a margin.
FLUSH_S, FALLBACK_S, MARGIN_S = 0.2, 0.25, 0.1


class QuotaCaller:
    def __init__(self, url: str, secret: str, path: str = '/q/account?aid=1'):
        host, port = url.split('//', 1)[1].rsplit(':', 1)
        self.host, self.port, self.path = host, int(port), path
        self.headers = {'X-API-Key': secret}
        self.calls: list[tuple[float, float, int, str]] = []   # (sent, ended, status, code)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> QuotaCaller:
        self._thread.start()
        return self

    def admitted(self) -> int:
        return sum(1 for c in list(self.calls) if c[2] == 200)

    def wait_admitted(self, n: int, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while self.admitted() < n:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f'the quota key got {self.admitted()} of {n} calls admitted')
            time.sleep(0.005)

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
        self._stop.set()
        self._thread.join(15)

    def _run(self) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        refused_since = None
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                conn.request('GET', self.path, headers=self.headers)
                reply = conn.getresponse()
                body = reply.read()
                status = reply.status
            except (OSError, http.client.HTTPException) as error:
                self.calls.append((sent, time.monotonic(), 0, type(error).__name__))
                conn.close()
                conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
                time.sleep(0.01)
                continue
            ended = time.monotonic()
            code = '-'
            if status != 200:
                try:
                    code = json.loads(body).get('code') or '-'
                except (ValueError, AttributeError):
                    pass
            self.calls.append((sent, ended, status, code))
            if code == 'quota_exceeded':
                refused_since = refused_since or sent
                if ended - refused_since >= REFUSED_FOR_S:
                    break
            else:
                refused_since = None
            time.sleep(PAUSE_S)
        conn.close()

    def summary(self, killed: float, up: float) -> dict:
        outcomes: dict[str, int] = {}
        for _, _, status, code in self.calls:
            key = (f'{status} {code}' if code != '-' else str(status)) if status else f'conn {code}'
            outcomes[key] = outcomes.get(key, 0) + 1
        ok = [c for c in self.calls if c[2] == 200]
        start, end = min(killed, up - FLUSH_S) - MARGIN_S, up + FALLBACK_S + MARGIN_S
        admitted = len(ok)
        in_flight = sum(1 for c in ok if start < c[1] <= end)
        return {'quota_calls': CALLS, 'spent_before': sum(1 for c in ok if c[1] < killed), 'admitted': admitted,
                'over_admitted': max(0, admitted - CALLS), 'in_flight_bound': in_flight,
                'within_bound': admitted <= CALLS + in_flight, 'outcomes': outcomes,
                'stopped_refused': bool(self.calls) and self.calls[-1][3] == 'quota_exceeded'}
