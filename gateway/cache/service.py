"""``ResponseCache``: the cache as the pipeline and the Management API use it.

A call (``answer``): this worker's memory (a hit: no I/O), else one fill per entry at a time
in this worker (single flight: concurrent misses wait for the first), which asks the shared
tier (another worker's answer) and then the database. Memory is served only while the
cache's bus keeps this worker fresh (``CacheSync.fresh``): a worker that may have missed a
purge asks the database instead.

Invalidation (``purge``): the shared tier first (one atomic step in Redis), then every
worker's memory through the acknowledged bus; it returns when every live worker has
dropped the entries. Management changes of a query purge that query, of a connection
everything (``on_change``); a write through the gateway purges the entries of the queries
that read a table it touched (``written``), before the write is answered.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from ..errors import unavailable
from ..ports import Clock
from .entry import Entry, encode_rows
from .keys import database, reads, views_now
from .keys import digest as entry_digest
from .keys import written as written_tables
from .memory import MemoryCache, Purge
from .ports import CacheSync, LocalCacheSync, NoSharedTier, SharedTier
from .redeliver import RETRY_MAX_S, RETRY_S, Redelivery

if TYPE_CHECKING:
    from ..execution.bulkhead import Claim
    from ..execution.runner import Result
    from ..governance import Analysis
    from ..governance.schema import Kin
    from ..model.catalog import Catalog, Connection, QueryVersion
    from ..settings import Settings

log = logging.getLogger("gateway.cache")


# ``replayed`` says no for an entry this close to its expiry: the call would likely find it gone.
READY_FOR_S = 0.5
# The largest entry the shared tier takes when this worker keeps no memory (GATEWAY_CACHE_MAX_BYTES=0).
_SHARED_MAX = 1 << 20
_UNCLAIMED = contextlib.nullcontext()   # a call without a bulkhead (none but tests call so)


class Purges(Protocol):
    """The store's purge counter (``gateway.store.purges.PurgeCounter``)."""

    def bump(self) -> int: ...

    def read(self) -> int: ...

    def close(self) -> None: ...


def _delivered(reply: dict) -> bool:
    """Whether a purge reached the shared tier and was published on the bus."""
    return not reply.get("degraded") and reply.get("shared") != "unreachable"


class _Flight:
    """One fill in progress. ``mark``: the purges that could name its entry, taken before it
    read anything (``MemoryCache.mark``); a call that has seen a later one must not take its answer."""

    __slots__ = ("done", "entry", "mark")

    def __init__(self, mark: tuple[int, int, int]) -> None:
        self.done = threading.Event()
        self.entry: Entry | None = None
        self.mark = mark


class ResponseCache:
    __slots__ = ("memory", "hits", "misses", "bypasses", "shared_fills", "write_purges", "failed_purges",
                 "_sync", "_shared", "_purges", "_worker", "_clock", "_wall", "_flights", "_lock", "_follow_s",
                 "_write_wait_s", "_readers", "_behind")

    def __init__(self, settings: Settings, sync: CacheSync | None = None, shared: SharedTier | None = None,
                 worker: str = "", clock: Clock = time.monotonic, wall: Clock = time.time,
                 purges: Purges | None = None) -> None:
        self.memory = MemoryCache(settings.cache_max_bytes, clock)
        self.hits = self.misses = self.bypasses = self.shared_fills = 0
        self.write_purges = self.failed_purges = 0
        self._sync = sync or LocalCacheSync()
        self._shared = shared or NoSharedTier()
        self._purges = purges
        self._worker = worker
        self._clock = clock
        self._wall = wall
        self._flights: dict[str, _Flight] = {}
        self._lock = threading.Lock()
        # A follower waits for the leader's database call at most as long as a statement may run.
        self._follow_s = settings.statement_timeout_ms / 1000 + 1
        self._write_wait_s = settings.cache_write_wait_ms / 1000
        self._readers: tuple[Catalog | None, dict[str, tuple[frozenset[str], bool]]] = (None, {})
        self._behind = Redelivery(lambda purge: _delivered(self._deliver(purge, self._write_wait_s)))

    def start(self) -> None:
        self._sync.start(self.memory)

    def close(self) -> None:
        self._sync.close()
        if self._purges is not None:
            self._purges.close()

    # --- the data plane ----------------------------------------------------------------------
    def answer(self, qv: QueryVersion, bound: Sequence, page: int, size: int, compute: Callable[[], Result],
               bypass: bool, store: bool = True, reading: str | None = None,
               max_age: int | None = None, claim: Claim | None = None) -> tuple[Entry, str]:
        """The entry for this call and how it was found: ``hit``, ``miss`` or ``bypass``.
        ``store`` False (``Cache-Control: no-store``, always a bypass): the answer is not kept.
        ``reading``: what the version's columns are under the schema of this call's plan (see ``keys``).
        ``max_age`` (``Cache-Control: max-age``): an entry older than that (its ``Age``) is not
        taken: the call is a bypass, which refreshes it. ``claim``: the call's place on its
        connection's bulkhead, held by whatever does not answer from memory: its own fill, or
        its wait for another call's (a follower holds a thread on that connection as much as
        its leader), which never outlasts the call's deadline."""
        digest = entry_digest(qv, bound, page, size, reading)
        fresh = self._sync.fresh() or self._confirmed()
        if not bypass and fresh:
            entry = self.memory.get(digest)
            if entry is not None:
                if max_age is None or int(self._wall() - entry.created) <= max_age:
                    self.hits += 1
                    return entry, "hit"
                bypass = True
        with claim if claim is not None else _UNCLAIMED:
            if claim is not None and not bypass and fresh:
                # It waited for its place, maybe while the fill it would have followed ended.
                entry = self.memory.get(digest)
                if entry is not None and (max_age is None or int(self._wall() - entry.created) <= max_age):
                    self.misses += 1   # answered by another call's database call, as a follower is
                    return entry, "miss"
            if bypass:
                self.bypasses += 1
                # A bypass fills memory only (the shared tier is neither asked nor filled); a
                # no-store one keeps nothing, as a worker whose memory is not fresh would.
                return self._fill(digest, qv, compute, fresh and store, shared=False, page=page,
                                  size=size)[0], "bypass"
            follow_s = self._follow_s if claim is None else min(self._follow_s, max(0.0, claim.deadline.left_s()))
            return self._missed(digest, qv, compute, fresh, max_age, page, size, follow_s)

    def _missed(self, digest: str, qv: QueryVersion, compute: Callable[[], Result], fresh: bool,
                max_age: int | None, page: int, size: int, follow_s: float) -> tuple[Entry, str]:
        """Not in memory: the first call of this worker for the entry fills it (the leader),
        the others wait for it (followers) at most ``follow_s``."""
        # Another worker's answer in Redis may be older than ``max_age`` allows: not asked then.
        shared = max_age is None
        mark = self.memory.mark(qv.name, database(qv.connection))
        with self._lock:
            held = self._flights.get(digest)
            # A fill that began before a purge this call has seen (a write or a purge answered
            # before this call came) may have read the older rows: this call leads a new one.
            leader = held is None or held.mark != mark
            flight = held if held is not None and not leader else _Flight(mark)
            self._flights[digest] = flight
        if not leader:
            # Another request of this worker is filling this entry: wait for its answer.
            if flight.done.wait(follow_s) and flight.entry is not None:
                self.misses += 1
                return flight.entry, "miss"
            return self._fill(digest, qv, compute, fresh, shared=shared, page=page, size=size)   # its fill failed
        try:
            entry, state = self._fill(digest, qv, compute, fresh, shared=shared, page=page, size=size, mark=mark)
            flight.entry = entry
            return entry, state
        finally:
            with self._lock:
                if self._flights.get(digest) is flight:   # not a newer flight that replaced it
                    del self._flights[digest]
            flight.done.set()

    def replayed(self, entry: Entry) -> bool:
        """A hit on ``entry``, for a call answered without ``answer`` (``gateway.pipeline.from_memory``):
        only while the bus keeps this worker fresh (as ``answer`` serves memory) and ``entry`` is
        still the one held for its digest, not about to expire (``READY_FOR_S``). Counted as a hit."""
        if self._sync.fresh() and self.memory.hit(entry, READY_FOR_S):
            self.hits += 1
            return True
        return False

    def _confirmed(self) -> bool:
        """Away from the bus: memory may serve only while the store's purge counter has not
        moved since it was emptied (a purge this worker did not hear bumped it). One small
        read per cacheable call, while the bus is away."""
        if self._purges is None:
            return False
        try:
            counter = self._purges.read()
        except Exception:   # the store is away too: the database answers (or refuses) the call
            return False
        memory = self.memory
        if memory.stamp != counter:
            memory.clear(counter)
        return True

    def _fill(self, digest: str, qv: QueryVersion, compute: Callable[[], Result], fresh: bool,
              shared: bool, page: int = 1, size: int = 0,
              mark: tuple[int, int, int] | None = None) -> tuple[Entry, str]:
        """``shared``: ask the shared tier first (not for a bypass, which is also not a miss).
        ``mark``: the flight's, taken before anything was read (else taken here)."""
        memory = self.memory
        db = database(qv.connection)
        if mark is None:
            mark = memory.mark(qv.name, db)    # before anything is read: a purge from now on wins over this fill
        token = None
        # Only while the bus keeps this worker fresh: a purge that could not reach Redis (away,
        # full) left the shared tier holding what it should have dropped, until a worker's
        # reconnect empties it; a worker that has not heard the bus since cannot tell.
        if shared and self._sync.fresh():
            found, token = self._shared.get(digest)
            if found is not None:
                if fresh:
                    memory.put(found, mark)
                self.shared_fills += 1
                self.hits += 1
                return found, "hit"
        result = compute()
        now, mono, ttl = self._wall(), self._clock(), qv.cache_ttl
        tables, wildcard = reads(qv)
        entry = Entry(digest, qv.name, qv.version, db, tables, wildcard, result.columns,
                      result.rows, result.rowcount, now, now + ttl, mono + ttl,
                      encode_rows(result.columns, result.rows, result.rowcount),
                      {"connection": qv.connection.name, "page": page, "page_size": size})
        if fresh:
            memory.put(entry, mark)
        if token is not None and entry.payload is not None and entry.size <= (memory.max_entry or _SHARED_MAX):
            self._shared.put(entry, token)
        if shared:
            self.misses += 1
        return entry, "miss"

    def written(self, catalog: Catalog, connection: Connection, analysis: Analysis | None,
                kin: Kin | None = None) -> dict | None:
        """A write through the gateway committed: drop, on every worker and in the shared tier,
        the entries of every query that read a table it touched (or a parent or a partition of
        one: ``kin``, the connection's trees), before it is answered. Nothing is announced when
        no cached query reads its database."""
        db = database(connection)
        reading = self._reading(catalog).get(db)
        if reading is None:
            return None
        tables, any_wildcard = reading
        touched = None if analysis is None else written_tables(analysis, kin)
        # ``touched`` is None whenever ``kin`` is: the test of ``kin`` never decides, it tells the type checker.
        if analysis is None or touched is None or kin is None or analysis.views or analysis.user_functions \
                or views_now(tables | touched, kin):
            purge: Purge = {"op": "db", "db": db}   # through a view or a function, or the schema unknown: any table
        elif any_wildcard or not tables.isdisjoint(touched):
            purge = {"op": "tables", "db": db, "tables": sorted(touched)}
        else:
            return None
        self.write_purges += 1
        try:
            return self.purge(purge, self._write_wait_s, strict=False)
        except Exception:   # the write committed: it is answered; the lease bounds what a worker serves
            self.failed_purges += 1
            log.exception("cache: the invalidation of a write failed")
            return None

    def _reading(self, catalog: Catalog) -> dict[str, tuple[frozenset[str], bool]]:
        """Per data database, the tables its cached versions read (and whether one of them reads
        through a view or a function), memoised per catalog snapshot."""
        held, reading = self._readers
        if held is catalog:
            return reading
        found: dict[str, tuple[set[str], list[bool]]] = {}
        for query in catalog.queries.values():
            for qv in query.versions.values():
                if qv.cache_ttl:
                    tables, wildcard = reads(qv)
                    into = found.setdefault(database(qv.connection), (set(), [False]))
                    into[0].update(tables)
                    into[1][0] = into[1][0] or wildcard
        reading = {db: (frozenset(t), w[0]) for db, (t, w) in found.items()}
        self._readers = (catalog, reading)
        return reading

    # --- the control plane -------------------------------------------------------------------
    def purge(self, purge: Purge, timeout_s: float | None = None, strict: bool = True) -> dict:
        """Bump the store's purge counter (for workers away from the bus), drop what ``purge``
        names in the shared tier, then on every worker; returns once every live worker has (see
        ``CacheSync.announce``), or, when Redis did not take it, once it has been tried again
        for ``CacheSync.away_s`` (``timeout_s``, a write's: at once, tried again behind it,
        ``gateway.cache.redeliver``). ``strict``: a counter that cannot be bumped fails the
        purge (503); a write's purge goes on without it."""
        started = time.monotonic()
        if self._purges is not None:
            try:
                self._purges.bump()
            except Exception:
                if strict:
                    raise unavailable("store_unavailable", "the gateway's store cannot be reached") from None
                self.failed_purges += 1
        self.memory.apply(purge)     # this worker at once, whatever the bus's timing
        reply = self._deliver(purge, timeout_s)
        if not _delivered(reply):
            # Redis did not take it: a worker whose lease has not run out (Redis answered its
            # heartbeats around a stall) still serves what it would drop. Tried again until it is
            # delivered or no worker that missed it can still trust its memory (``away_s``).
            deadline = started + self._sync.away_s
            if timeout_s is None:     # a management call answers once it is, or then
                delay = RETRY_S
                while not _delivered(reply) and time.monotonic() < deadline:
                    time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
                    delay = min(delay * 2, RETRY_MAX_S)
                    reply = self._deliver(purge, timeout_s)
            else:                     # a write is answered now (degraded): delivered behind it
                self._behind.add(purge, deadline)
        reply["waited_ms"] = round((time.monotonic() - started) * 1000, 3)
        return reply

    def _deliver(self, purge: Purge, timeout_s: float | None) -> dict:
        """One try: the shared tier first (a worker that drops the entry must not fill it again
        from there), then every worker through the bus."""
        shared_ok = True
        try:
            self._shared.purge(purge)
        except Exception:   # Redis away: tried again (see purge); every worker's reconnect empties it too
            shared_ok = False
        reply = dict(self._sync.announce(purge, timeout_s))
        if not shared_ok:
            reply["shared"] = "unreachable"
        return reply

    def on_change(self, doc: dict, catalog: Catalog | None = None) -> None:
        """A management change committed (and every worker has the new catalog): a query's
        entries go with any change of it; a connection's change drops everything (its queries
        may read through it under any name). A key's change needs nothing: each call applies
        its own key's plan to what the cache holds.

        ``catalog`` (the new one): a change of a query none of whose versions has a TTL, or of a
        connection when no version anywhere has one, has nothing to purge (a version's TTL changes
        only by ``set_cache_ttl``, which always purges), so management calls of a fleet that
        caches nothing cost no second round of acknowledgements."""
        kind = doc.get("kind")
        if kind == "query":
            query = catalog.queries.get(doc.get("name") or "") if catalog is not None else None
            if query is not None and doc.get("action") != "set_cache_ttl" and \
                    not any(v.cache_ttl for v in query.versions.values()):
                return
            self.purge({"op": "query", "name": doc.get("name")})
        elif kind == "connection":
            if catalog is not None and not any(v.cache_ttl for q in catalog.queries.values()
                                               for v in q.versions.values()):
                return
            self.purge({"op": "all"})

    def entries(self, query: str | None = None, limit: int = 1000) -> list[dict]:
        """This worker's entries and the shared tier's, soonest to expire first (QueryAPIGate's order)."""
        now = self._wall()
        items = [e.doc(now, self._worker) for e in self.memory.entries() if query is None or e.query == query]
        items += [d for d in self._shared.entries(limit) if query is None or d.get("query") == query]
        items.sort(key=lambda d: d["ttl_remaining_s"])
        return items[:limit]

    def entry(self, key: str) -> Entry | None:
        """One entry by its key (this worker's memory, else the shared tier), for the admin."""
        found = self.memory.get(key)
        if found is None:
            found, _ = self._shared.get(key)
        return found

    def gauges(self) -> dict[str, Callable[[], int]]:
        return {"cache_hits": lambda: self.hits, "cache_misses": lambda: self.misses,
                "cache_bypasses": lambda: self.bypasses, "cache_shared_fills": lambda: self.shared_fills,
                "cache_evictions": lambda: self.memory.evictions, "cache_bytes": lambda: self.memory.bytes,
                "cache_entries": lambda: len(self.memory)}
