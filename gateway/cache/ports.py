"""The cache's ports: what the fleet supplies (``fleet.shared.cache``) and the in-process versions.

* ``SharedTier``: answers shared by every worker (Redis). ``get`` returns the entry and a
  token for a conditional ``put`` (a fill that began before a purge is not stored after
  it); a tier that cannot be reached is a miss (token None: nothing is stored).
* ``CacheSync``: how a purge reaches every worker's memory. ``announce`` returns once every
  live worker applied it (or its freshness lease ran out, or ``timeout_s`` passed);
  ``fresh()`` says whether this worker may serve from memory: not when it may have missed a
  purge (the bus is away past its lease; the same rule as the catalog). ``away_s``: how long
  after a purge that could not be published a worker may still be fresh (lease and ping).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .entry import Entry
    from .memory import MemoryCache, Purge


class SharedTier(Protocol):
    fills: int      # entries found here by a worker that missed in memory

    def get(self, digest: str) -> tuple[Entry | None, object | None]: ...

    def put(self, entry: Entry, token: object) -> None: ...

    def purge(self, purge: Purge) -> None:
        """Drop what ``purge`` names, and refuse the puts of fills that began before."""

    def entries(self, limit: int) -> list[dict]: ...


class NoSharedTier:
    __slots__ = ()
    fills = 0

    def get(self, digest: str) -> tuple[Entry | None, object | None]:
        return None, None

    def put(self, entry: Entry, token: object) -> None:
        pass

    def purge(self, purge: Purge) -> None:
        pass

    def entries(self, limit: int) -> list[dict]:
        return []


class CacheSync(Protocol):
    away_s: float

    def start(self, memory: MemoryCache) -> None: ...

    def announce(self, purge: Purge, timeout_s: float | None = None) -> dict: ...

    def fresh(self) -> bool: ...

    def close(self) -> None: ...


class LocalCacheSync:
    """One process: a purge is applied in place."""

    __slots__ = ("_memory",)
    away_s = 0.0

    def __init__(self) -> None:
        self._memory: MemoryCache | None = None

    def start(self, memory: MemoryCache) -> None:
        self._memory = memory

    def announce(self, purge: Purge, timeout_s: float | None = None) -> dict:
        dropped = self._memory.apply(purge) if self._memory is not None else 0
        return {"workers": 1, "dropped": dropped, "waited_ms": 0.0}

    def fresh(self) -> bool:
        return True

    def close(self) -> None:
        pass
