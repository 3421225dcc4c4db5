"""Shared rate limits and quotas, nearly free per call. (A key's ``max_concurrent`` is counted
by ``fleet.shared.concurrency``, which this admission holds: a place cannot be leased in advance.)

Rate limits: ``fleet.shared.rates`` (local headroom reported in batches; leases once a bucket runs low),
with its bounds. Quotas: ``fleet.shared.quotas`` (leases of K calls, never exceeded), with theirs. This
module is the facade the gateway's port (``gateway.ports.Admission``) sees, and the local
fallback of rate limits while Redis is away.

Redis unreachable (``GATEWAY_REDIS_FAILURE``): rate limits: ``open`` admits through a local
token bucket per worker holding its share (1/W) of each limit, once the bucket's headroom is
spent; ``closed`` answers 503. Quotas: what the leases hold, then 503 (``fleet.shared.quotas``). The worker
retries Redis every 250 ms and returns to the shared buckets by itself; it logs once when it
starts deciding locally, once when Redis answers again, and a summary every
``GATEWAY_DEGRADED_LOG_S`` between (``fleet.shared.degraded``), never a line per call.

Every Redis key carries a hash tag (``gw:{q:7}:2026-12-02``, ``fleet.shared.rates``' shards), so each
script touches one slot and runs on Redis Cluster; scripts are sent with EVALSHA and re-sent on
NOSCRIPT (redis-py's ``Script`` does this; a promoted replica has no scripts cached).
Failover (Redis Cluster or Sentinel, ``fleet.shared.redis_client``; the windows per server in
``fleet.shared.reach``): the promoted replica serves the buckets it had received. Writes it had not
(asynchronous replication) are lost: a quota bucket it never received is rebuilt from the run
history (``fleet.shared.quotas``); one it received but behind the master lacks the calls leased in the last
replication lag (typically under a millisecond of leases; ``WAIT`` is not used), so the quota
may admit up to those calls more. Rate buckets restart from what the replica held: at most one
burst more.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import redis

from gateway.errors import GatewayError
from gateway.model.limits import Rate
from gateway.ports import Clock, Headers, rate_limited

from .concurrency import Place, RunningCalls
from .quotas import QuotaLeases, UsageReader
from .rates import RateBucket, RateLimits
from .reach import Reach
from .redis_client import RedisLink

if TYPE_CHECKING:
    from gateway.model.catalog import ApiKey
    from gateway.settings import Settings

log = logging.getLogger("fleet.shared.leases")

SWEEP_S = 10.0         # how often idle buckets are looked for (and forgotten after IDLE_S)
IDLE_S = 60.0


class LeasedAdmission:
    def __init__(self, redis_url: str, settings: Settings, workers_hint: Callable[[], int] = lambda: 1,
                 clock: Clock = time.monotonic, wall: Clock = time.time, history: UsageReader | None = None) -> None:
        """``workers_hint``: the fleet's live workers (0 until known: no headroom is taken).
        ``history``: what a key was admitted since its period began, read from the store when
        a quota bucket is created (without it, a bucket starts at 0)."""
        self._redis = RedisLink(redis_url).client(settings.redis_timeout_ms / 1000)
        self._lease_s = settings.lease_ms / 1000
        self._closed_on_failure = settings.redis_failure == "closed"
        self._ip_rate = Rate.parse(settings.rate_limit, settings.rate_limit_burst or None, "GATEWAY_RATE_LIMIT") \
            if settings.rate_limit else None
        self._workers_hint = workers_hint
        self._clock = clock
        self._history = history
        self.reach = Reach(self._redis, self._closed_on_failure, settings.degraded_log_s, log, clock)
        self.degraded = self.reach.degraded
        self.rates = RateLimits(self._redis, workers_hint, self.reach, self._lease_s, settings.lease_max, clock)
        self.quotas = QuotaLeases(self._redis, settings, self.reach, workers_hint, self._unleased, clock, wall, history)
        self.fallbacks = 0          # calls admitted or refused by the local fallback
        # max_concurrent: places held while calls run (fleet.shared.concurrency), on the same client and log.
        self.running = RunningCalls(self._redis, settings.concurrency_lease_ms, self._closed_on_failure,
                                    workers_hint, self.degraded, clock)
        self._stop = threading.Event()
        self._flusher = threading.Thread(target=self._flush_loop, name="gateway-leases", daemon=True)
        self._flusher.start()

    @property
    def redis_calls(self) -> int:
        """Scripts sent for rates and quotas: the round trips admission cost."""
        return self.rates.redis_calls + self.quotas.redis_calls

    @property
    def lost(self) -> int:
        """Quota buckets this worker had leased from that Redis lost (rebuilt from the history)."""
        return self.quotas.lost

    # --- the data plane's interface ---------------------------------------------------
    def admit_ip(self, ip: str) -> Headers:
        rate = self._ip_rate
        if rate is None:
            return ()
        return self.rates.spend(ip, rate, "this client", self._local_rate)

    def admit_key(self, key: ApiKey) -> Headers:
        rate, quota = key.rate, key.quota
        if rate is None and quota is None:
            return ()
        headers: Headers = ()
        if rate is not None:
            headers = self.rates.spend(key.id, rate, "this key", self._local_rate)
        if quota is not None:
            headers += self.quotas.spend(key, quota, headers)
        return headers

    def settle(self, key: ApiKey, rows: int) -> None:
        self.quotas.settle(key, rows)

    def rows_left(self, key: ApiKey) -> int | None:
        return self.quotas.rows_left(key)

    def take_rows(self, key: ApiKey, wanted: int) -> int:
        return self.quotas.take_rows(key, wanted)

    def enter(self, key: ApiKey) -> Place:
        return self.running.enter(key)

    def leave(self, key: ApiKey, place: object) -> None:
        self.running.leave(place)  # type: ignore[arg-type]  # what enter() returned

    def local(self, key: ApiKey) -> bool:
        return self._ip_rate is None and key.rate is None and key.quota is None and key.max_concurrent is None

    # --- Redis unreachable ----------------------------------------------------------------
    def _unleased(self) -> GatewayError:
        """A quota call this worker holds no leased call for, and cannot ask Redis for one."""
        self.fallbacks += 1
        self.degraded.refused += 1
        return self._unavailable()

    def _unavailable(self) -> GatewayError:
        return GatewayError(503, "admission_unavailable", "shared limits are unreachable; retry shortly",
                            headers={"Retry-After": "1"})

    def _local_take(self, bucket: RateBucket, per_s: float, cap: float, now: float) -> float:
        """A local token bucket at 1/W of the shared one; returns seconds until a token
        (0 when one was taken)."""
        workers = max(1, self._workers_hint())
        per_s, cap = per_s / workers, max(1.0, cap / workers)
        if bucket.local_tokens is None:
            bucket.local_tokens, bucket.local_ts = cap, now
        bucket.local_tokens = min(cap, bucket.local_tokens + (now - bucket.local_ts) * per_s)
        bucket.local_ts = now
        if bucket.local_tokens >= 1:
            bucket.local_tokens -= 1
            return 0.0
        return (1 - bucket.local_tokens) / per_s if per_s > 0 else 3600.0

    def _local_rate(self, bucket: RateBucket, rate: Rate, now: float, who: str) -> Headers:
        self.fallbacks += 1
        if self._closed_on_failure:
            self.degraded.refused += 1
            raise self._unavailable()
        wait = self._local_take(bucket, rate.per_s, rate.burst, now)
        left = bucket.local_tokens or 0.0   # set by _local_take just above
        share = max(1, self._workers_hint())
        headers = (("X-RateLimit-Limit", str(rate.limit)),
                   ("X-RateLimit-Remaining", str(int(left))),
                   ("X-RateLimit-Reset", str(math.ceil((max(1.0, rate.burst / share) - left)
                                                       / (rate.per_s / share)))))
        if wait:
            self.degraded.refused += 1
            raise rate_limited(wait, headers, who)
        self.degraded.admitted += 1
        return headers

    # --- background: report rates, hand back expired leftovers, settle rows -------------
    def _flush_loop(self) -> None:
        next_sweep = self._clock() + SWEEP_S
        while not self._stop.wait(self._lease_s):
            try:
                self.flush()
                if self._clock() >= next_sweep:
                    next_sweep = self._clock() + SWEEP_S
                    self._sweep()
            except redis.RedisError as exc:
                self.reach.failed(exc)
            except Exception:
                log.exception("admission: flush failed")
            self.reach.tick()

    def flush(self) -> None:
        self.rates.report()
        self.quotas.flush(self._clock())

    def _sweep(self) -> None:
        """Forget what is idle: rate buckets (``fleet.shared.rates``) and leases of ended periods."""
        self.rates.forget_idle(IDLE_S)
        self.quotas.sweep()

    def redis_lost_data(self) -> None:
        """Redis lost its data (``fleet.shared.bus`` found this worker's heartbeat gone): the calls
        left in this worker's quota leases came from buckets that may be gone, and the run
        history that rebuilds them does not count calls not yet made. They are dropped (not
        handed back: the bucket may be a new one), so a loss while a key is idle stays exact."""
        self.quotas.drop_leftovers()

    # --- management: GET /api/v1/usage/quotas ---------------------------------------------
    def usage(self, keys: Iterable[ApiKey]) -> list[dict]:
        return self.quotas.usage(keys)

    def close(self) -> None:
        self.running.close()
        self._stop.set()
        self._flusher.join(1)
        try:
            self.rates.flush_all()
            self.quotas.hand_back_all()
        except redis.RedisError:
            pass
        close = getattr(self._history, "close", None)
        if close is not None:
            close()
