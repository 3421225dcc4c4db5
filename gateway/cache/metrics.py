"""The cache's Prometheus metrics: a history observer (like ``gateway.observe.Metrics``), so
a request never touches a metric; counters lag the calls by one history flush at most.
Registered in the worker's registry, so multiprocess mode sums every worker's."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .service import ResponseCache

_COUNTERS = (("hits", "gateway_cache_hits", "Cached answers served (from this worker's memory or the shared tier)"),
             ("misses", "gateway_cache_misses", "Cacheable calls answered from the database"),
             ("bypasses", "gateway_cache_bypasses", "Cacheable calls that asked cache=false or no-cache"),
             ("shared_fills", "gateway_cache_shared_fills", "Misses in memory filled from the shared tier (Redis)"),
             ("evictions", "gateway_cache_evictions", "Entries evicted to stay under GATEWAY_CACHE_MAX_BYTES"),
             ("write_purges", "gateway_cache_write_purges", "Writes that invalidated cached answers"))


class CacheMetrics:
    def __init__(self, cache: ResponseCache, registry: Any) -> None:
        from prometheus_client import Counter, Gauge
        self._cache = cache
        self._counters = [(attr, Counter(name, text, registry=registry)) for attr, name, text in _COUNTERS]
        self._last = dict.fromkeys((attr for attr, _, _ in _COUNTERS), 0)
        self._bytes = Gauge("gateway_cache_bytes", "Bytes of cached answers held in memory",
                            multiprocess_mode="livesum", registry=registry)
        self._entries = Gauge("gateway_cache_entries", "Cached answers held in memory",
                              multiprocess_mode="livesum", registry=registry)

    def __call__(self, batch: Sequence) -> None:
        self.tick()

    def tick(self) -> None:
        cache = self._cache
        values = {"hits": cache.hits, "misses": cache.misses, "bypasses": cache.bypasses,
                  "shared_fills": cache.shared_fills, "evictions": cache.memory.evictions,
                  "write_purges": cache.write_purges}
        for attr, counter in self._counters:
            delta = values[attr] - self._last[attr]
            if delta > 0:
                counter.inc(delta)
                self._last[attr] = values[attr]
        self._bytes.set(cache.memory.bytes)
        self._entries.set(len(cache.memory))
