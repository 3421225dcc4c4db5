"""The response cache of saved reads (``cache_ttl``): each worker's in-memory LRU, an
optional shared tier, and invalidation that every worker acknowledges.

* ``entry``: one cached answer (the unmasked rows of one page) and its Redis encoding.
* ``keys``: what makes an answer unique (the digest) and which tables it read.
* ``memory``: the worker's LRU, bounded in bytes; purges applied to it.
* ``ports``: ``SharedTier`` and ``CacheSync`` (what the fleet implements in ``fleet.shared.cache``)
  and their in-process versions.
* ``service``: ``ResponseCache``, what the pipeline and the Management API use (single
  flight, the freshness lease, purges and writes announced to the fleet).

Entries hold rows before any key's plan: every call applies its own key's masks and
``max_rows`` on the way out (``gateway.pipeline.cached``), so keys never share a body.
"""
from .entry import Entry
from .memory import MemoryCache
from .ports import CacheSync, LocalCacheSync, NoSharedTier, SharedTier
from .service import ResponseCache

__all__ = ["Entry", "MemoryCache", "ResponseCache", "CacheSync", "LocalCacheSync", "SharedTier", "NoSharedTier"]
