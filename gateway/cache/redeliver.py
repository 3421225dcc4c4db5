"""Purges that Redis did not take when a write was answered, delivered again behind it.

A purge that cannot be published (Redis stalled, failing over, full) reaches no worker, and a
worker whose freshness lease does not run out meanwhile (Redis answered its heartbeats before
and after) keeps serving from memory what the purge would have dropped, until the TTL. A
management purge tries again itself until it is delivered or the lease has run out everywhere
(``ResponseCache.purge``); a write is answered at once, so its purge is handed here: one thread
tries the pending purges again until they are delivered or past their deadline (by then every
worker that could not hear them has stopped trusting its memory).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .memory import Purge

log = logging.getLogger("gateway.cache")

# Between two tries while Redis does not answer, doubling up to RETRY_MAX_S: each failed try
# logs a warning, and a Redis that is down answers at once.
RETRY_S = 0.05
RETRY_MAX_S = 0.4


class Redelivery:
    __slots__ = ("_deliver", "_pending", "_lock", "_thread", "dropped")

    def __init__(self, deliver: Callable[[Purge], bool]) -> None:
        """``deliver(purge)``: one try; whether the shared tier and the bus both took it."""
        self._deliver = deliver
        self._pending: list[tuple[Purge, float]] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.dropped = 0    # purges still undelivered at their deadline

    def add(self, purge: Purge, deadline: float) -> None:
        """Deliver ``purge`` until it is, or until ``deadline`` (``time.monotonic()``)."""
        with self._lock:
            self._pending.append((purge, deadline))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="gateway-cache-redeliver", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        delay = RETRY_S
        while True:
            with self._lock:
                now = time.monotonic()
                # Past its deadline, a purge has nobody left to reach: a worker that missed it has
                # stopped serving from memory (its lease ran out), or heard a later one.
                live = [(p, d) for p, d in self._pending if d > now]
                self.dropped += len(self._pending) - len(live)
                self._pending = live
                if not live:
                    self._thread = None
                    return
                batch = len(live)
            # Several waiting (writes while Redis was away): one purge of everything covers them
            # all at once, rather than one round of acknowledgements each past their deadlines.
            purge: Purge = live[0][0] if batch == 1 else {"op": "all"}
            try:
                delivered = self._deliver(purge)
            except Exception:   # never lose the thread: tried again, or given up at the deadlines
                log.exception("cache: a purge could not be delivered again")
                delivered = False
            if delivered:
                with self._lock:
                    del self._pending[:batch]
                delay = RETRY_S
                continue
            time.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)
