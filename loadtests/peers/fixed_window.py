"""envoyproxy/ratelimit's algorithm as the gateway's ``Admission`` port (gateway/ports.py), for the limits block's
side-by-side: a faithful reimplementation of its Redis fixed-window cache, run inside the gateway's worker. It is
not envoy itself: no Envoy proxy, no gRPC call to a ratelimit service per request (which envoy adds on top of the
Redis round trip counted here), no YAML configuration, no statistics.

What it does, as read from envoyproxy/ratelimit at f2fb157 (2026-07-05):

- ``src/limiter/cache_key.go`` (GenerateCacheKey): one Redis counter per descriptor and fixed window, named
  prefix + domain + ``_`` + (entry key ``_`` entry value ``_``)... + the window's start, ``(now / unit) * unit``
  in unix seconds (``now`` read once per request, ``base_limiter.go`` GenerateCacheKeys);
- ``src/redis/fixed_cache_impl.go`` (DoLimit, pipelineAppend): per request ONE pipeline (plain pipelining, no
  MULTI) holding ``INCRBY key hits`` and ``EXPIRE key unit_seconds`` for every descriptor (``utils.UnitToDivider``:
  second 1, minute 60, hour 3,600, day 86,400, month 30 days; no expiration jitter, its default) - except those
  the near-cache holds;
- ``src/limiter/base_limiter.go`` (GetResponseDescriptorStatus, IsOverLimitWithLocalCache): a descriptor is over
  its limit when its count after the increment exceeds ``requests_per_unit``; a key found over is put in the
  near-cache (freecache, on when ``LOCAL_CACHE_SIZE_IN_BYTES`` > 0) for one unit's length, and while it is there
  the descriptor is answered OVER_LIMIT without Redis and left out of the pipeline; the other descriptors of the
  request are still incremented (``stopCacheKeyIncrementWhenOverlimit`` false, the default). A request with every
  descriptor in the near-cache costs no round trip;
- ``src/service/ratelimit.go``: the request is OVER_LIMIT when any descriptor is; a Redis error fails open (the
  HTTP filter's ``failure_mode_deny`` defaults to false).

The gateway's limits as envoy descriptors, one request per call: ``remote_address`` (GATEWAY_RATE_LIMIT), the key's
``rate_limit`` and its calls quota as a limit with unit day (a calendar UTC day, as the gateway's) or month (envoy's
30 days). Envoy has no burst: ``rate_limit_burst`` is not used, a key gets ``N`` per fixed window. Every call is
counted against every descriptor, refused or not (envoy's rule), so a refused call spends quota.

The port asks for the client first (``admit_ip``, before the key is known) and the key after the plan
(``admit_key``). Envoy sends all of a route's descriptors in one request, so ``admit_ip`` only notes the address
and ``admit_key`` decides for all of them at once (an address over its limit is refused there, after the key's
descriptors were counted, as envoy counts them). A call that never reaches ``admit_key`` (no key, a wrong one) has its address counted alone by the next
``admit_ip`` of the same thread. Not supported (not envoy's, not in the benchmark's mixes): ``max_concurrent``
(``enter`` refuses with 501) and rows quotas (not counted).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis

from gateway.errors import GatewayError
from gateway.model.limits import PERIODS, Rate
from gateway.ports import NO_HEADERS, Headers, quota_exceeded, rate_limited

if TYPE_CHECKING:
    from gateway.model.catalog import ApiKey
    from gateway.settings import Settings

DOMAIN = 'gateway'
PREFIX = ''                     # envoy's CACHE_KEY_PREFIX, empty by default
MONTH_S = 30 * 86400            # utils.UnitToDivider: MONTH
QUOTA_UNITS = {'day': PERIODS['day'], 'month': MONTH_S}
NEAR_CACHE_MAX = 100_000        # entries before expired ones are swept (freecache is bounded by bytes)


@dataclass(frozen=True, slots=True)
class Descriptor:
    """One descriptor of a request with its limit: (entry key, entry value), requests per unit, unit seconds."""
    entry: str
    value: str
    limit: int
    unit_s: int
    what: str       # 'client', 'key' or 'quota': which refusal the gateway answers


def cache_key(descriptor: Descriptor, now: int) -> str:
    """GenerateCacheKey: prefix + domain + '_' + key '_' value '_' + the window's start."""
    return (f'{PREFIX}{DOMAIN}_{descriptor.entry}_{descriptor.value}_'
            f'{(now // descriptor.unit_s) * descriptor.unit_s}')


class NearCache:
    """Keys found over their limit, each until its unit has passed (base_limiter.go: localCache.Set with the
    unit's seconds as TTL). A key names its window, so an entry stops mattering when the window ends."""

    def __init__(self, clock=time.monotonic):
        self._until: dict[str, float] = {}
        self._clock = clock

    def over(self, key: str) -> bool:
        until = self._until.get(key)
        if until is None:
            return False
        if self._clock() >= until:
            self._until.pop(key, None)
            return False
        return True

    def add(self, key: str, ttl_s: int) -> None:
        if len(self._until) >= NEAR_CACHE_MAX:
            now = self._clock()
            for stale in [k for k, until in self._until.items() if until <= now]:
                self._until.pop(stale, None)
        self._until[key] = self._clock() + ttl_s

    def __len__(self) -> int:
        return len(self._until)


@dataclass(slots=True)
class Status:
    """A descriptor's answer: over its limit or not, and what is left in its window."""
    descriptor: Descriptor
    over: bool
    remaining: int
    reset_s: int


class FixedWindowAdmission:
    """The Admission port over envoy's fixed windows (see the module's text)."""

    fallbacks = 0   # calls admitted because Redis failed (envoy fails open)

    def __init__(self, redis_url: str, settings: Settings, near_cache: bool = True,
                 wall=time.time, clock=time.monotonic) -> None:
        self._redis = redis.Redis.from_url(redis_url, socket_timeout=max(settings.redis_timeout_ms, 1) / 1000)
        self._ip_limit = self._ip_descriptor_limit(settings)
        self._near = NearCache(clock) if near_cache else None
        self._wall = wall
        self._pending = threading.local()    # the client address admit_ip noted for this thread's call
        self.round_trips = 0                 # pipelines sent

    @staticmethod
    def _ip_descriptor_limit(settings: Settings) -> tuple[int, int] | None:
        if not settings.rate_limit:
            return None
        rate = Rate.parse(settings.rate_limit, None, 'GATEWAY_RATE_LIMIT')
        return rate.limit, rate.period_s

    # --- the port -----------------------------------------------------------------------
    def admit_ip(self, ip: str) -> Headers:
        stale = getattr(self._pending, 'ip', None)
        self._pending.ip = None
        if stale is not None:        # the last call of this thread never reached admit_key: count it alone
            self.do_limit([stale])
        if self._ip_limit is not None:
            limit, unit_s = self._ip_limit
            self._pending.ip = Descriptor('remote_address', ip, limit, unit_s, 'client')
        return NO_HEADERS

    def admit_key(self, key: ApiKey) -> Headers:
        descriptors = self.descriptors(key)
        if not descriptors:
            return NO_HEADERS
        statuses = self.do_limit(descriptors)
        return self.answer(statuses)

    def descriptors(self, key: ApiKey) -> list[Descriptor]:
        """The call's descriptors: the address admit_ip noted, the key's rate limit, its calls quota."""
        found = []
        ip = getattr(self._pending, 'ip', None)
        if ip is not None:
            self._pending.ip = None
            found.append(ip)
        if key.rate is not None:
            found.append(Descriptor('api_key', str(key.id), key.rate.limit, key.rate.period_s, 'key'))
        quota = key.quota
        if quota is not None and quota.calls is not None:
            found.append(Descriptor('quota', str(key.id), quota.calls, QUOTA_UNITS[quota.per], 'quota'))
        return found

    def do_limit(self, descriptors: list[Descriptor]) -> list[Status]:
        """fixed_cache_impl.go DoLimit: the near-cache first, then one pipeline for the rest."""
        now = int(self._wall())
        keys = [cache_key(d, now) for d in descriptors]
        near = self._near
        cached = [near is not None and near.over(k) for k in keys]
        counts: dict[int, int] = {}
        sent = [i for i, hit in enumerate(cached) if not hit]
        if sent:
            pipe = self._redis.pipeline(transaction=False)
            for i in sent:
                pipe.incrby(keys[i], 1)
                pipe.expire(keys[i], descriptors[i].unit_s)
            try:
                replies = pipe.execute()
            except redis.RedisError:
                self.fallbacks += 1
                return []             # fail open: every descriptor OK
            self.round_trips += 1
            counts = {i: int(replies[2 * n]) for n, i in enumerate(sent)}
        return [self._status(d, k, cached[i], counts.get(i, 0), now) for i, (d, k) in
                enumerate(zip(descriptors, keys, strict=True))]

    def _status(self, descriptor: Descriptor, key: str, cached: bool, count: int, now: int) -> Status:
        reset_s = descriptor.unit_s - now % descriptor.unit_s
        if cached:
            return Status(descriptor, True, 0, reset_s)
        over = count > descriptor.limit
        if over and self._near is not None:
            self._near.add(key, descriptor.unit_s)
        return Status(descriptor, over, max(descriptor.limit - count, 0), reset_s)

    @staticmethod
    def answer(statuses: list[Status]) -> Headers:
        """Headers of the descriptor closest to its limit (envoy's x-ratelimit-* headers), or the refusal."""
        if not statuses:
            return NO_HEADERS
        tightest = min(statuses, key=lambda s: s.remaining)
        headers: Headers = (('X-RateLimit-Limit', str(tightest.descriptor.limit)),
                            ('X-RateLimit-Remaining', str(tightest.remaining)),
                            ('X-RateLimit-Reset', str(tightest.reset_s)))
        for status in statuses:
            if status.over:
                what = status.descriptor.what
                if what == 'quota':
                    raise quota_exceeded('calls', status.reset_s, headers)
                raise rate_limited(status.reset_s, headers, 'this client' if what == 'client' else 'this key')
        return headers

    def settle(self, key: ApiKey, rows: int) -> None:
        pass                          # envoy counts requests only

    def rows_left(self, key: ApiKey) -> int | None:
        return None

    def take_rows(self, key: ApiKey, wanted: int) -> int:
        return wanted

    def usage(self, keys: Iterable[ApiKey]) -> list[dict]:
        now = int(self._wall())
        items = []
        for key in keys:
            quota = key.quota
            if quota is None or quota.calls is None:
                continue
            descriptor = Descriptor('quota', str(key.id), quota.calls, QUOTA_UNITS[quota.per], 'quota')
            used = self._redis.get(cache_key(descriptor, now))
            items.append({'key': key.name, 'quota': quota.to_doc(), 'calls_used': int(used or 0)})
        return items

    def enter(self, key: ApiKey) -> object:
        raise GatewayError(501, 'not_supported', 'max_concurrent is not supported by the fixed-window reference')

    def leave(self, key: ApiKey, place: object) -> None:
        pass

    def local(self, key: ApiKey) -> bool:
        return (self._ip_limit is None and key.rate is None and key.quota is None
                and key.max_concurrent is None)

    def close(self) -> None:
        self._redis.close()
