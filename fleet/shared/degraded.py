"""What a worker says while it decides without Redis: one line when it starts (healthy ->
degraded), one when Redis answers again (degraded -> healthy), and a summary every
``GATEWAY_DEGRADED_LOG_S`` in between, never a line per failed call. (Before, each worker
logged every 250 ms retry: about 4 lines a second per worker for as long as Redis was away.)

Healthy again means no Redis error for ``RECOVER_S``: a cluster master failing over makes
some buckets fail while others answer, and one success between two failures must not log
a recovery and a new outage each time.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gateway.ports import Clock

RECOVER_S = 1.0


class DegradedLog:
    """The healthy/degraded state of one worker's admission, and its log lines. ``admitted``
    and ``refused`` count the calls decided locally (by the caller, in its fallback; without
    a lock, under each bucket's own: a close count, for a log line)."""

    __slots__ = ("_log", "_summary_s", "_clock", "_lock", "degraded", "since", "last_error", "_last_failure",
                 "_next_summary", "admitted", "refused", "_summary_admitted", "_summary_refused", "_what")

    def __init__(self, log: logging.Logger, what: str, summary_s: float, clock: Clock = time.monotonic) -> None:
        self._log = log
        self._what = what            # what the fallback does, for the log lines
        self._summary_s = summary_s
        self._clock = clock
        self._lock = threading.Lock()
        self.degraded = False
        self.since = 0.0
        self.last_error = ""
        self._last_failure = 0.0
        self._next_summary = 0.0
        self.admitted = self.refused = 0           # during this degraded spell
        self._summary_admitted = self._summary_refused = 0

    def failed(self, exc: BaseException) -> None:
        now = self._clock()
        with self._lock:
            self._last_failure = now
            self.last_error = str(exc) or type(exc).__name__
            if self.degraded:
                return
            self.degraded, self.since, self._next_summary = True, now, now + self._summary_s
            self.admitted = self.refused = self._summary_admitted = self._summary_refused = 0
        self._log.warning("admission: Redis unreachable (%s); %s until it answers (retried every 250 ms; "
                          "a summary every %.0fs)", self.last_error, self._what, self._summary_s)

    def succeeded(self) -> None:
        """A Redis call answered (cheap when healthy: the caller checks ``degraded`` first)."""
        if self.degraded and self._clock() - self._last_failure >= RECOVER_S:
            self._recover()

    def _recover(self) -> None:
        now = self._clock()
        with self._lock:
            if not self.degraded:
                return
            self.degraded = False
            admitted, refused, lasted = self.admitted, self.refused, self._last_failure - self.since
        self._log.warning("admission: Redis answers again (failing for %.1fs, none for the last %.0fs); %d calls "
                          "were admitted and %d refused locally meanwhile", lasted, now - self._last_failure,
                          admitted, refused)

    def tick(self, probe: Callable[[], object] | None) -> None:
        """From a background thread: the periodic summary, and a recovery found by
        ``probe()`` (a Redis call; raises ``redis.RedisError``) when no call tried Redis."""
        if not self.degraded:
            return
        now = self._clock()
        if probe is not None and now - self._last_failure >= RECOVER_S:
            try:
                probe()
            except Exception as exc:   # still down: counted as a failure, logged by the summary
                self.failed(exc)
            else:
                self._recover()
                return
        if now >= self._next_summary:
            with self._lock:
                self._next_summary = now + self._summary_s
                admitted, self._summary_admitted = self.admitted - self._summary_admitted, self.admitted
                refused, self._summary_refused = self.refused - self._summary_refused, self.refused
            self._log.warning("admission: Redis still unreachable after %.0fs (%s); in the last %.0fs %d calls "
                              "were admitted and %d refused locally", now - self.since, self.last_error,
                              self._summary_s, admitted, refused)
