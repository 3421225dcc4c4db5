"""The worker's in-memory cache: least recently used out first, bounded in bytes.

A hit is one lock held for a dict lookup and a move to the end: no I/O. Purges (applied by
the bus thread, or by the request that wrote) bump counters (everything, per query, per
database): a fill takes ``mark(query, db)`` before it reads, and ``put(entry, mark)`` stores it
only if no purge that could name it came in between, so an answer read before a write cannot
outlive the write's invalidation by being stored late (and a purge of another query does not
keep it out).
"""
from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable

from ..ports import Clock
from .entry import Entry

# A purge, as announced to the fleet: {"op": "all"} | {"op": "query", "name": n}
# | {"op": "tables", "db": d, "tables": [...]} | {"op": "db", "db": d} | {"op": "key", "key": digest}.
Purge = dict


def matches(purge: Purge) -> Callable[[Entry], bool]:
    op = purge.get("op")
    if op == "all":
        return lambda e: True
    if op == "query":
        name = purge.get("name")
        return lambda e: e.query == name
    if op == "key":
        key = purge.get("key")
        return lambda e: e.digest == key
    if op == "db":
        db = purge.get("db")
        return lambda e: e.db == db
    if op == "tables":
        db, tables = purge.get("db"), frozenset(purge.get("tables") or ())
        return lambda e: e.db == db and (e.wildcard or not e.tables.isdisjoint(tables))
    raise ValueError(f"unknown purge {purge!r}")


class MemoryCache:
    __slots__ = ("max_bytes", "max_entry", "bytes", "evictions", "stamp", "_all", "_by_query", "_by_db", "_entries",
                 "_lock", "_clock")

    def __init__(self, max_bytes: int, clock: Clock = time.monotonic) -> None:
        self.max_bytes = max_bytes
        self.max_entry = max_bytes // 16
        self.bytes = 0
        self._all = 0                          # purges of everything (and of one key)
        self._by_query: dict[str, int] = {}    # purges of one query
        self._by_db: dict[str, int] = {}       # purges by a write's tables, or of a whole database
        self.evictions = 0
        # The store's purge counter this memory is known to be consistent with (None: unknown),
        # for a worker that cannot hear the bus (see ``ResponseCache``).
        self.stamp: int | None = None
        self._entries: collections.OrderedDict[str, Entry] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._clock = clock

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, digest: str) -> Entry | None:
        now = self._clock()
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                return None
            if entry.expires_mono <= now:
                self._drop(digest)
                return None
            self._entries.move_to_end(digest)
            entry.hits += 1
        return entry

    def hit(self, entry: Entry, for_s: float) -> bool:
        """A hit on ``entry`` itself, as ``get`` counts one: only while it is the entry held for
        its digest (not dropped, nor replaced by a fill since) and stays fresh ``for_s`` longer."""
        now = self._clock()
        with self._lock:
            if self._entries.get(entry.digest) is not entry or entry.expires_mono <= now + for_s:
                return False
            self._entries.move_to_end(entry.digest)
            entry.hits += 1
        return True

    def mark(self, query: str, db: str) -> tuple[int, int, int]:
        """Taken before a fill reads anything: the purges so far that could name its entry."""
        return self._all, self._by_query.get(query, 0), self._by_db.get(db, 0)

    def put(self, entry: Entry, mark: tuple[int, int, int]) -> bool:
        """Store ``entry`` unless a purge that could name it was applied since ``mark``."""
        if entry.size > self.max_entry:
            return False
        with self._lock:
            if mark != self.mark(entry.query, entry.db):
                return False
            if entry.digest in self._entries:
                self._drop(entry.digest)
            self._entries[entry.digest] = entry
            entry.owner = self
            self.bytes += entry.size
            self._evict()
        return True

    def grow(self, entry: Entry, extra: int) -> None:
        """``entry`` keeps ``extra`` bytes more (an answer ready to send): counted while it is held."""
        with self._lock:
            entry.size += extra      # under the lock: ``_drop`` takes back what ``put`` and this added
            if self._entries.get(entry.digest) is entry:
                self.bytes += extra
                self._evict()

    def _evict(self) -> None:
        while self.bytes > self.max_bytes and self._entries:
            _, old = self._entries.popitem(last=False)
            self.bytes -= old.size
            self.evictions += 1

    def _drop(self, digest: str) -> None:
        entry = self._entries.pop(digest, None)
        if entry is not None:
            self.bytes -= entry.size

    def apply(self, purge: Purge) -> int:
        """Drop what ``purge`` names; the number of entries dropped."""
        match = matches(purge)
        op = purge.get("op")
        with self._lock:
            if op == "query":
                name = purge.get("name") or ""
                self._by_query[name] = self._by_query.get(name, 0) + 1
            elif op in ("tables", "db"):
                db = purge.get("db") or ""
                self._by_db[db] = self._by_db.get(db, 0) + 1
            else:
                self._all += 1
            gone = [d for d, e in self._entries.items() if match(e)]
            for digest in gone:
                self._drop(digest)
        return len(gone)

    def clear(self, stamp: int | None = None) -> int:
        """Empty; consistent with the store's purge counter ``stamp`` from now on (None: unknown)."""
        with self._lock:
            self.stamp = stamp
        return self.apply({"op": "all"})

    def entries(self) -> Iterable[Entry]:
        now = self._clock()
        with self._lock:
            return [e for e in self._entries.values() if e.expires_mono > now]
