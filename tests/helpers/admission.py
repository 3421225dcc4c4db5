"""Driving admissions directly (tests/fleet/test_leases.py, test_rates.py, test_quota_exact.py): a
clock, keys as the admission reads them, and a hammer of threads per simulated worker."""
from __future__ import annotations

import random
import threading
import time
from types import SimpleNamespace

from gateway.errors import GatewayError
from gateway.model.limits import Quota, Rate, quota_window
from gateway.settings import Settings


class FakeClock:
    def __init__(self, start: float = 1000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now


def a_key(rate: str | None = None, burst: int | None = None, quota: dict | None = None):
    """What the admission reads of a catalog key; a fresh id, so a fresh bucket in Redis."""
    return SimpleNamespace(id=random.randrange(10**9, 10**12),
                           rate=Rate.parse(rate, burst) if rate else None,
                           quota=Quota.parse(quota) if quota else None)


def quota_bucket(key, per: str = "day") -> str:
    return f"gw:{{q:{key.id}}}:{quota_window(per)[0]}"


def settings(redis_url: str, **knobs) -> Settings:
    return Settings(redis_url=redis_url, **knobs)


def hammer(admissions, key, threads_each: int, seconds: float, stop_when=None):
    """Call admit_key from ``threads_each`` threads per admission; returns the admitted calls as
    (before, after) monotonic times and the refusals by code."""
    admitted, refused = [], {}
    lock = threading.Lock()
    stop = threading.Event()

    def run(admission):
        mine, codes = [], {}
        refused_since = None
        while not stop.is_set():
            before = time.monotonic()
            try:
                admission.admit_key(key)
            except GatewayError as err:
                codes[err.code] = codes.get(err.code, 0) + 1
                refused_since = refused_since or before
                if stop_when is not None and before - refused_since > stop_when:
                    break
            else:
                mine.append((before, time.monotonic()))
                refused_since = None
            time.sleep(0.0002)      # the callers' pace
        with lock:
            admitted.extend(mine)
            for code, n in codes.items():
                refused[code] = refused.get(code, 0) + n

    threads = [threading.Thread(target=run, args=(a,)) for a in admissions for _ in range(threads_each)]
    for t in threads:
        t.start()
    if stop_when is None:
        time.sleep(seconds)      # the callers call for ``seconds``: the window measured
        stop.set()
    for t in threads:
        t.join(seconds + 30)
    stop.set()
    return sorted(admitted), refused


def most_inside(admitted, window_s: float) -> int:
    """The most calls certainly admitted inside one window (their whole [before, after] in it)."""
    best = 0
    for i, (start, _) in enumerate(admitted):
        limit = start + window_s
        best = max(best, sum(1 for _, after in admitted[i:] if after <= limit))
    return best
