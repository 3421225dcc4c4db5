"""Whether the admission's Redis answers, per server: the 250 ms windows in which a worker
decides without it (``GATEWAY_REDIS_FAILURE``), and the log that says so (``fleet.shared.degraded``).

In a cluster the windows are kept per master of a bucket's slot (as the client's slot map says:
after a failover, the promoted one), so the buckets on the other masters stay shared, and a
partition costs one timeout per server and window, not one per key.
"""
from __future__ import annotations

import logging
from typing import Any

from redis.cluster import RedisCluster

from gateway.ports import Clock

from .degraded import DegradedLog
from .redis_client import drop_idle

RETRY_S = 0.25


class Reach:
    def __init__(self, client: Any, closed_on_failure: bool, summary_s: float, log: logging.Logger,
                 clock: Clock) -> None:
        self._redis = client
        self.cluster = client if isinstance(client, RedisCluster) else None
        self._clock = clock
        self._down: dict[str, float] = {}      # server -> unreachable until (monotonic); "" unless a cluster
        self._failed_bucket = ""               # probed to find Redis back when no call tries it
        self.degraded = DegradedLog(log, "refusing with 503" if closed_on_failure else
                                    "admitting through this worker's local share of each rate limit",
                                    summary_s, clock)

    def failed(self, exc: Exception, bucket: str = "") -> None:
        # Drop the idle pooled connections: after a restart each stale socket would otherwise
        # fail once more and push the return to shared state back by another 250 ms. (Not the
        # ones in use: that would fail other threads' calls and feed the outage itself.)
        drop_idle(self._redis)
        if bucket:
            self._failed_bucket = bucket
        self.degraded.failed(exc)
        self._down[self._server(bucket)] = self._clock() + RETRY_S

    def succeeded(self) -> None:
        if self.degraded.degraded:
            self.degraded.succeeded()

    def is_down(self, bucket: str, now: float) -> bool:
        down = self._down
        if not down:
            return False
        return now < max(down.get(self._server(bucket), 0.0), down.get("", 0.0))

    def any_down(self, now: float) -> bool:
        return any(now < until for until in list(self._down.values()))

    def probe(self) -> None:
        """One keyed read on the bucket that failed last (in a cluster: its slot's master)."""
        self._redis.exists(self._failed_bucket or "gw:{probe}")

    def tick(self) -> None:
        """The flusher's: the degraded summary, and Redis found back when no call tried it."""
        if self.degraded.degraded:
            self.degraded.tick(None if self.any_down(self._clock()) else self.probe)

    def _server(self, bucket: str) -> str:
        cluster = self.cluster
        if cluster is None or not bucket:
            return ""
        try:
            return cluster.nodes_manager.get_node_from_slot(cluster.keyslot(bucket)).name
        except Exception:   # the slot map does not cover it (yet): one window for those
            return "?"
