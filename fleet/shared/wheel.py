"""Things due at a time, for the admission's flusher: a timing wheel of slots of one tick.

Why not a heap of (time, item) tuples: a tuple is an object the cyclic garbage collector tracks,
and the rate buckets pushed one per call of a cold bucket, each alive for up to the bucket's
refill time (60 s for a per-minute limit). That churn of long-lived objects triggered full
collections of the worker's heap: stalls of 200-270 ms every few seconds under the limits
block's skewed mix (10,000 keys, 10,000 client addresses), a single caller's p99 at 137 ms.
Appending a reference to a slot's list allocates nothing the collector tracks.
"""
from __future__ import annotations

import threading
from typing import Generic, TypeVar

T = TypeVar("T")


class Wheel(Generic[T]):
    def __init__(self, tick_s: float) -> None:
        self._tick_s = tick_s
        self._slots: dict[int, list[T]] = {}
        self._lock = threading.Lock()

    def schedule(self, item: T, when: float) -> None:
        """``item`` is handed out by the first ``due(now)`` with now >= when (never before,
        up to one tick after)."""
        slot = int(when / self._tick_s) + 1
        with self._lock:
            items = self._slots.get(slot)
            if items is None:
                self._slots[slot] = [item]
            else:
                items.append(item)

    def due(self, now: float) -> list[T]:
        current = int(now / self._tick_s)
        found: list[T] = []
        with self._lock:
            for slot in [slot for slot in self._slots if slot <= current]:
                found += self._slots.pop(slot)
        return found
