"""A bulkhead per data connection: the calls of one worker to one connection hold at most
``Settings.connection_places()`` of its request threads at once.

A request thread blocked on a database that stopped answering (a table locked ``ACCESS
EXCLUSIVE``, a stalled server) is a thread no other call can have. Without a bound, one such
connection took every thread of every worker within milliseconds, and calls to every other
connection (and ``/health``) queued behind it. With it, that connection holds its share and
the rest of the threads keep serving the others.

A call that finds the share full waits for a place while the connection is answering (some
call to it started or finished within ``GATEWAY_CONNECTION_STALL_MS``): a busy connection
that answers still gets every thread, its calls past the share queued for a few
milliseconds. Once its calls have stopped moving for that long, a call is refused at once
(503 ``connection_busy``, ``Retry-After``), costing its thread microseconds; and never does a
call wait past its deadline (504 ``deadline_exceeded``).

What is bounded is a connection, not a table: a lock on one table holds, as its calls pile
up, that connection's share, and calls to its other tables wait or are refused with them.
"""
from __future__ import annotations

import queue
import time
from typing import TYPE_CHECKING

from ..errors import unavailable
from .deadline import Deadline, expired

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ..model.catalog import Connection
    from ..settings import Settings


def busy(places: int) -> Exception:
    return unavailable("connection_busy", f"this worker's {places} calls to the connection are all waiting on "
                       "its database, which has not answered any of them lately; nothing was run")


class Bulkhead:
    """The places of one connection in one worker: a queue of free places (C code, no Python
    lock on the way of a call: taking and giving back one costs well under a microsecond)."""

    __slots__ = ("places", "_stall_s", "_free", "_moved", "refused")

    def __init__(self, places: int, stall_ms: int) -> None:
        self.places = places
        self._stall_s = stall_ms / 1000
        self._free: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(places):
            self._free.put(None)
        self._moved = 0.0          # when a call last took or gave back a place
        self.refused = 0           # calls answered connection_busy (a statistic: not counted under a lock)

    @property
    def held(self) -> int:
        return self.places - self._free.qsize()

    def enter(self, deadline: Deadline) -> None:
        """Take a place: at once while there is one; else wait while the connection moves, up
        to the deadline (then 504), and 503 ``connection_busy`` once it has stopped moving."""
        now = time.monotonic()
        if now >= deadline.start_by:
            raise expired()
        try:
            self._free.get_nowait()
        except queue.Empty:
            self._wait(deadline, now)
            now = time.monotonic()
        self._moved = now

    def _wait(self, deadline: Deadline, now: float) -> None:
        while True:
            until = min(deadline.start_by, self._moved + self._stall_s)
            if now >= until:
                if now >= deadline.start_by:
                    raise expired()
                self.refused += 1
                raise busy(self.places)
            try:
                self._free.get(timeout=until - now)
                return
            except queue.Empty:
                now = time.monotonic()

    def leave(self) -> None:
        self._moved = time.monotonic()
        self._free.put(None)


class Claim:
    """A call's claim on its connection's bulkhead, under its deadline: ``with claim:`` holds a
    place for what is inside (the call's statement, or its wait for another call's); or
    ``enter()`` and ``leave()`` for a place held past a block (a stream's, until its body is
    closed)."""

    __slots__ = ("_bulkhead", "deadline")

    def __init__(self, bulkhead: Bulkhead, deadline: Deadline) -> None:
        self._bulkhead = bulkhead
        self.deadline = deadline

    def enter(self) -> None:
        self._bulkhead.enter(self.deadline)

    def leave(self) -> None:
        self._bulkhead.leave()

    def __enter__(self) -> Claim:
        self._bulkhead.enter(self.deadline)
        return self

    def __exit__(self, *exc: object) -> None:
        self._bulkhead.leave()


class Bulkheads:
    """This worker's bulkheads, one per connection record (by id: one that changes host or
    password keeps its calls' count)."""

    __slots__ = ("_places", "_stall_ms", "_by_id")

    def __init__(self, settings: Settings) -> None:
        self._places = settings.connection_places()
        self._stall_ms = settings.connection_stall_ms
        self._by_id: dict[object, Bulkhead] = {}

    def get(self, connection: Connection) -> Bulkhead:
        bulkhead = self._by_id.get(connection.id)
        if bulkhead is None:
            bulkhead = self._by_id.setdefault(connection.id, Bulkhead(self._places, self._stall_ms))
        return bulkhead

    def retire_unused(self, connections: Iterable[Connection]) -> None:
        """After a reload: forget the bulkheads of deleted connections (a call still holding a
        place gives it back to the object it holds)."""
        live = {c.id for c in connections}
        for key in list(self._by_id):
            if key not in live:
                self._by_id.pop(key, None)

    def refused(self) -> int:
        return sum(b.refused for b in list(self._by_id.values()))
