"""Which calls this worker can answer from its memory alone, with no I/O: asked by the server
before it hands a request to a thread.

A worker's threads are there to wait on I/O (a database round trip, Redis). A call answered
from this worker's cache waits on nothing, and handing it to a thread and its answer back (a
queue, a wake-up, a callback, the socket unregistered and registered again) cost about 12 us
of a cache hit's ~96 us of CPU (one worker, 32 keep-alive connections). So the server's loop
answers such a call itself (fleet/worker.py), and asks ``FromMemory`` whether a request is one.

It is a guess about *where* a call runs, never about *what* it answers: the call then goes
through the whole pipeline like any other (identify, admit, plan, cache, record), on the
loop's thread. The guess is yes only when all of these hold, each a look at memory:

- this worker answered the same target (path and query string, as received) for the same
  key from its cache before (``learn``, called by the pipeline; the key's secret is kept only
  inside a hash, as Python's ``hash`` of the pair);
- the catalog is the snapshot it was answered with, and fresh (``CatalogHolder.fresh``): no
  change since, and no store read needed to serve it;
- the cache's bus keeps this worker fresh and the entry is held, not about to expire
  (``ResponseCache.ready``);
- admitting that key needs no shared state (``Admission.local``: no rate limit, quota or
  ``max_concurrent`` on the key, no per-client limit): nothing to ask Redis.

A wrong guess (a purge between the guess and the call) makes that one call's database round
trip on the loop. The learned targets are bounded (``MAX_LEARNED``: emptied when full).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..cache import ResponseCache
    from ..model.catalog import ApiKey, Catalog
    from ..model.state import CatalogHolder
    from ..ports import Admission

MAX_LEARNED = 10_000


class FromMemory:
    __slots__ = ("_learned", "_holder", "_cache", "_admission", "answered")

    def __init__(self, holder: CatalogHolder, cache: ResponseCache, admission: Admission) -> None:
        self._learned: dict[int, tuple[Catalog, str]] = {}
        self._holder = holder
        self._cache = cache
        self._admission = admission
        self.answered = 0   # the calls it said yes to: the loop answered them (/metrics)

    @staticmethod
    def target(raw_target: str, secret: str | None) -> int:
        """What a call is learned and recognised by: its target as received and its key."""
        return hash((raw_target, secret))

    def learn(self, target: int, catalog: Catalog, key: ApiKey, digest: str) -> None:
        """A call with this target was answered from the cache entry ``digest`` (a hit, or the
        miss that filled it) with this catalog snapshot."""
        if not self._admission.local(key):
            return
        learned = self._learned
        if len(learned) >= MAX_LEARNED and target not in learned:
            learned.clear()
        learned[target] = (catalog, digest)

    def __call__(self, raw_target: str, secret: str | None) -> bool:
        known = self._learned.get(hash((raw_target, secret)))
        if known is None:
            return False
        catalog, digest = known
        if self._holder.fresh() is catalog and self._cache.ready(digest):
            self.answered += 1
            return True
        return False
