"""The balanced worker's heartbeat to its master (``fleet/server/worker.py``): gthread called it on every
turn of its loop, a utime(2) each; it now runs at most once a second, or a quarter of the
worker's timeout when that is shorter, and at once on the first turn."""
from __future__ import annotations

import math
import time

from fleet.server.worker import NOTIFY_EVERY_S, BalancedThreadWorker


class CountingTmp:
    """What gunicorn's ``Worker.notify`` touches: ``tmp.notify()`` (the utime of its file)."""

    def __init__(self) -> None:
        self.beats = 0

    def notify(self) -> None:
        self.beats += 1


def worker(timeout: float) -> tuple[BalancedThreadWorker, CountingTmp]:
    made = BalancedThreadWorker.__new__(BalancedThreadWorker)   # no master, no sockets: only the heartbeat
    made.timeout = timeout
    made._notified_at = -math.inf
    made.tmp = CountingTmp()
    return made, made.tmp


def test_a_busy_loop_beats_once_a_second():
    w, tmp = worker(timeout=30)
    for _ in range(10_000):
        w.notify()
    assert tmp.beats == 1
    time.sleep(NOTIFY_EVERY_S + 0.05)     # a sleep that is the test: a beat's interval passes
    w.notify()
    w.notify()
    assert tmp.beats == 2


def test_a_short_timeout_beats_within_a_quarter_of_it():
    w, tmp = worker(timeout=0.4)   # every 0.1 s at most: 5 beats in 0.45 s, fewer if this machine stalls
    started = time.monotonic()
    while time.monotonic() - started < 0.45:
        w.notify()
        time.sleep(0.001)      # a busy loop's pace
    assert 2 <= tmp.beats <= 5, tmp.beats
