"""Shared rate limits at almost no Redis cost per call: local headroom, reported in batches.

A rate limit (a key's, or a client address's) is one token bucket in Redis: refill r, burst b,
on Redis server time. A worker does not ask Redis per call. While the bucket holds at least
half its burst, each of the fleet's W live workers may admit up to **h = floor(b / 2W)**
calls on it without asking (the bucket is *local* to it) and reports them afterwards, every
bucket that is due in one script per sync interval S (``GATEWAY_LEASE_MS``). A report that
finds the bucket under half its burst makes the bucket *shared* for that worker: it takes
leases of pre-debited tokens per script, as ``fleet.shared.leases`` always did, leaving (W-1)*h
tokens for the other workers' headroom; a later answer showing half the burst again makes it
local again.

Why no window admits more than an exact limiter would. Let q_j be what worker j may still
admit without Redis knowing: h while the bucket is local to it (its unreported calls never
exceed h), its unreported calls while shared. Invariant: **level in Redis >= sum of q_j**.
A worker becomes or stays local only at an answer showing level >= W*h (the others hold at
most (W-1)*h, it takes h); a shared worker is granted tokens only above (W-1)*h; refill only
raises the level. So every call admitted locally is covered by a token in the bucket at the
time it is admitted; reporting it late only loses refill to the cap, never adds a token.
Leases are spent within L (``GATEWAY_LEASE_MS``) of being taken, as before. With W the
live workers (``fleet.shared.bus``), in any window T:

* **admitted(T) <= b + r * (T + L)**; a window with no shared spell: b + r * T.
* A worker killed loses its unreported calls: at most h more per bucket (admitted, never
  debited).
* The fleet growing from W to W' workers: until every worker has seen the new count (one
  bus heartbeat), the old ones hold h = b/2W and the new ones b/2W': at most b/2 more.
  A worker that has not yet seen a heartbeat takes no headroom.
* What an exact limiter admits and this one refuses: the (W-1)*h tokens kept for the others
  when a bucket is shared, so a caller whose calls all reach one worker gets a full bucket
  of b/2 + h at once instead of b (with W = 1: all of it), then r per second, as exact; and
  leftovers of expired leases (dropped, see ``fleet.shared.leases``).

Cost: a bucket is reported once its unreported calls reach half its headroom, or when the
oldest of them is as old as the time the bucket takes to refill (b/r, at least S): a bucket
used less than h/2 times per refill time by a worker costs one entry of one batched script
per refill time, whatever its traffic, and a worker sends at most one report per S.
A shared bucket costs a script per lease; at its limit a lease is one token or a few, so about
r scripts per second fleet-wide (at most W*r: a worker refused answers from memory until a token
is due), however many calls are offered. Headroom needs b >= 2W: a bucket with a smaller burst
is shared on every worker.

Every bucket name carries one of ``SHARDS`` hash tags (``gw:{rl:17}:key:7``): a report is
one script per shard on Redis Cluster (every key of a script in one slot), and the shards
spread over the masters; on one server, one script for all.
"""
from __future__ import annotations

import math
import threading
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis

from gateway.ports import Clock, Headers, rate_limited

from .wheel import Wheel

if TYPE_CHECKING:
    from gateway.model.limits import Rate

    from .reach import Reach

SHARDS = 64
BATCH_MAX = 500            # buckets per report script: bounds the time one script holds Redis


def rate_bucket(kind: str, ident: int | str) -> str:
    """The Redis key of a rate bucket: ``kind`` "key" (a key's id) or "ip" (an address)."""
    shard = ident % SHARDS if isinstance(ident, int) else zlib.crc32(ident.encode()) % SHARDS
    return f"gw:{{rl:{shard}}}:{kind}:{ident}"


def parse_bucket(value: bytes | str) -> tuple[float, float]:
    """A bucket's value as Redis holds it: (tokens, Redis time in ms of the last write)."""
    tokens, ts = (value.decode() if isinstance(value, bytes) else value).split(" ")
    return float(tokens), float(ts)


# A bucket is one string "tokens ts" (ts: Redis time in ms), kept until it would be full.
_READ = """
local function read(key, rate, cap, now)
  local v = redis.call('GET', key)
  if not v then return cap end
  local sp = string.find(v, ' ', 1, true)
  local tokens, ts = tonumber(string.sub(v, 1, sp - 1)), tonumber(string.sub(v, sp + 1))
  return math.min(cap, tokens + math.max(0, now - ts) * rate)
end
local function write(key, tokens, rate, cap, now)
  redis.call('SET', key, tostring(tokens) .. ' ' .. tostring(now), 'PX', math.ceil(cap / rate) + 60000)
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
"""

# KEYS[1]: the bucket. ARGV: rate per ms, burst, lease wanted, calls admitted locally and not yet
# reported, the level that keeps it local (W*h; 0: never), tokens kept for the others' headroom
# ((W-1)*h). Returns {1 if local, tokens granted, level (text), ms until a token is grantable}.
# (Leasing only once several tokens are spare, to save scripts at the limit, admitted 99 of the
# 140 an exact bucket admits at twice the limit, against 133 this way: leftovers are dropped.)
TAKE = _READ + """
local rate, cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local want, report = tonumber(ARGV[3]), tonumber(ARGV[4])
local keep_local, reserve = tonumber(ARGV[5]), tonumber(ARGV[6])
local tokens = read(KEYS[1], rate, cap, now) - report
local is_local, grant = 0, 0
if keep_local > 0 and tokens >= keep_local then
  is_local = 1
elseif want > 0 and tokens - reserve >= 1 then
  local spare = tokens - reserve
  grant = math.min(want, math.floor(spare), math.max(1, math.floor(spare / 4)))
  tokens = tokens - grant
end
write(KEYS[1], tokens, rate, cap, now)
local wait = 0
if tokens - reserve < 1 then wait = (1 + reserve - tokens) / rate end
return {is_local, grant, tostring(tokens), tostring(wait)}
"""

# KEYS: buckets. ARGV: per bucket, rate per ms, burst, calls to report. Returns each level (text).
REPORT = _READ + """
local out = {}
for i = 1, #KEYS do
  local rate, cap = tonumber(ARGV[3 * i - 2]), tonumber(ARGV[3 * i - 1])
  local tokens = read(KEYS[i], rate, cap, now) - tonumber(ARGV[3 * i])
  write(KEYS[i], tokens, rate, cap, now)
  out[i] = tostring(tokens)
end
return out
"""


class RateBucket:
    """This worker's side of one shared bucket."""

    __slots__ = ("name", "rate", "lock", "local", "unreported", "in_flight", "queued", "level",
                 "tokens", "expires", "want", "empty_until", "used", "forgotten", "local_tokens", "local_ts")

    def __init__(self, name: str) -> None:
        self.name = name
        self.rate: Rate | None = None
        self.lock = threading.Lock()
        self.local = True          # a bucket this worker holds nothing of is local, nothing unreported
        self.unreported = 0        # admitted locally, not yet sent
        self.in_flight = 0         # ... sent in a report not yet answered (still counted against h)
        self.queued = False        # in the next report already
        self.level = -1.0          # tokens in Redis at the last answer (-1: never asked: full)
        self.tokens = 0            # shared: leased, not yet spent
        self.expires = 0.0
        self.want = 1              # next lease size (adaptive)
        self.empty_until = 0.0     # shared: Redis has no token for us until then (monotonic)
        self.used = 0.0            # last call (monotonic): idle buckets are forgotten
        self.forgotten = False     # dropped from the table: a caller that holds it takes a new one
        self.local_tokens: float | None = None   # the fallback's bucket while Redis is unreachable
        self.local_ts = 0.0


class RateLimits:
    """Every rate bucket this worker uses: the call path, the batched reports, the leases."""

    def __init__(self, client: Any, workers: Callable[[], int], reach: Reach, lease_s: float, lease_max: int,
                 clock: Clock) -> None:
        self._redis = client
        self._take = client.register_script(TAKE)
        self._report = client.register_script(REPORT)
        self._cluster = reach.cluster
        self._workers = workers
        self._reach = reach
        self._lease_s = lease_s
        self._lease_max = lease_max
        self._clock = clock
        self._buckets: dict[int | str, RateBucket] = {}   # by key id (int) or client address (str)
        self._lock = threading.Lock()
        self._queue_lock = threading.Lock()
        self._due: list[RateBucket] = []               # half their headroom used
        self._stale: Wheel[RateBucket] = Wheel(lease_s)  # to report by a time
        self.redis_calls = 0       # scripts sent (round trips): takes and reports
        self.reported = 0          # bucket entries sent in reports

    # --- the call path --------------------------------------------------------------
    def bucket(self, ident: int | str) -> RateBucket:
        """The bucket of a key (its id) or of a client address (a string): no name built per call."""
        bucket = self._buckets.get(ident)
        if bucket is None:
            name = rate_bucket("key" if isinstance(ident, int) else "ip", ident)
            with self._lock:
                bucket = self._buckets.setdefault(ident, RateBucket(name))
        return bucket

    def headroom(self, rate: Rate) -> int:
        """h: calls one worker may admit unreported; 0 before a heartbeat has counted the fleet."""
        workers = self._workers()
        return int(rate.burst // (2 * workers)) if workers > 0 else 0

    def spend(self, ident: int | str, rate: Rate, who: str, fallback: Callable[..., Headers]) -> Headers:
        bucket = self.bucket(ident)
        with bucket.lock:
            if bucket.forgotten:   # dropped by forget_idle meanwhile: count on the table's one
                return self.spend(ident, rate, who, fallback)
            now = self._clock()   # read under the lock: a wait for it must not stretch a lease
            bucket.rate, bucket.used = rate, now
            h = self.headroom(rate)
            if bucket.local and bucket.unreported + bucket.in_flight < h:
                self._admit_locally(bucket, h, now)
                return self._headers(bucket, rate)
            if not bucket.local and bucket.tokens > 0 and now < bucket.expires:
                bucket.tokens -= 1
                return self._headers(bucket, rate)
            if now < bucket.empty_until:
                raise rate_limited(bucket.empty_until - now, self._headers(bucket, rate), who)
            if self._reach.is_down(bucket.name, now):
                return fallback(bucket, rate, now, who)
            return self._ask(bucket, rate, h, now, who, fallback)

    def _admit_locally(self, bucket: RateBucket, h: int, now: float) -> None:
        if not bucket.unreported:   # the oldest unreported call: due within a refill time
            rate = bucket.rate
            assert rate is not None
            self._report_by(bucket, now + max(self._lease_s, rate.burst / rate.per_s))
        bucket.unreported += 1
        if not bucket.queued and 2 * (bucket.unreported + bucket.in_flight) >= h:
            self._queue(bucket)

    def _report_by(self, bucket: RateBucket, when: float) -> None:
        self._stale.schedule(bucket, when)

    def _queue(self, bucket: RateBucket) -> None:
        """In the next report (the caller holds the bucket's lock)."""
        bucket.queued = True
        with self._queue_lock:
            self._due.append(bucket)

    def _ask(self, bucket: RateBucket, rate: Rate, h: int, now: float, who: str,
             fallback: Callable[..., Headers]) -> Headers:
        """One script for this call: report what is unreported, then local again, or a lease."""
        workers = max(1, self._workers())
        self._grow_or_shrink(bucket, now)
        report, bucket.unreported = bucket.unreported, 0
        bucket.tokens = 0   # an expired lease's leftovers are dropped (fleet.shared.leases: the bound)
        # With a report in flight, this answer may not count it yet: no headroom on it.
        keep_local = workers * h if not bucket.in_flight else 0
        try:
            is_local, grant, level, wait_ms = self._take(
                keys=[bucket.name], args=[rate.per_s / 1000, rate.burst, bucket.want, report,
                                          keep_local, (workers - 1) * h])
        except redis.RedisError as exc:
            bucket.unreported += report   # sent twice at worst: debited twice, never missed
            self._reach.failed(exc, bucket.name)
            return fallback(bucket, rate, now, who)
        self.redis_calls += 1
        self._reach.succeeded()
        bucket.level = float(level)
        if is_local:
            bucket.local = True
            self._admit_locally(bucket, h, now)
            return self._headers(bucket, rate)
        bucket.local = False
        if grant <= 0:
            bucket.empty_until = now + float(wait_ms) / 1000
            raise rate_limited(float(wait_ms) / 1000, self._headers(bucket, rate), who)
        bucket.tokens = grant - 1
        bucket.expires = now + self._lease_s
        return self._headers(bucket, rate)

    def _grow_or_shrink(self, bucket: RateBucket, now: float) -> None:
        if bucket.tokens > 0:       # expired with leftovers: ask for less
            bucket.want = max(1, bucket.want // 2)
        elif bucket.expires > now or bucket.expires == 0.0 or now - bucket.expires < self._lease_s:
            bucket.want = min(self._lease_max, bucket.want * 2)

    @staticmethod
    def _headers(bucket: RateBucket, rate: Rate) -> Headers:
        level = rate.burst if bucket.level < 0 else bucket.level
        left = max(0, int(level) - bucket.unreported - bucket.in_flight) + max(bucket.tokens, 0)
        return (("X-RateLimit-Limit", str(rate.limit)),
                ("X-RateLimit-Remaining", str(left)),
                ("X-RateLimit-Reset", str(max(0, math.ceil((rate.burst - left) / rate.per_s)))))

    # --- the background: batched reports ------------------------------------------------
    def report(self) -> None:
        """Send every bucket that is due, one script per shard group (one on one server)."""
        now = self._clock()
        groups: dict[int, list[tuple[RateBucket, int, int]]] = {}
        for bucket in self._take_due(now):
            rate = bucket.rate
            assert rate is not None
            with bucket.lock:
                if self._reach.is_down(bucket.name, now):
                    self._requeue(bucket)
                    continue
                sent, bucket.unreported = bucket.unreported, 0
                bucket.in_flight += sent
            groups.setdefault(self._shard(bucket.name), []).append((bucket, sent, self.headroom(rate)))
        for group in groups.values():
            for start in range(0, len(group), BATCH_MAX):
                self._send(group[start:start + BATCH_MAX])

    def _take_due(self, now: float) -> list[RateBucket]:
        with self._queue_lock:
            due, self._due = self._due, []
        due += self._stale.due(now)
        picked: dict[int, RateBucket] = {}
        for bucket in due:
            bucket.queued = False
            if bucket.unreported or not bucket.local:
                picked[id(bucket)] = bucket
        return list(picked.values())

    def _shard(self, name: str) -> int:
        # One script for every bucket on one server; one per hash tag on a cluster.
        return int(name[len("gw:{rl:"):name.index("}")]) if self._cluster else 0

    def _send(self, batch: list[tuple[RateBucket, int, int]]) -> None:
        keys, args = [], []
        for bucket, sent, _ in batch:
            rate = bucket.rate
            assert rate is not None
            keys.append(bucket.name)
            args += [rate.per_s / 1000, rate.burst, sent]
        try:
            levels = self._report(keys=keys, args=args)
        except redis.RedisError as exc:
            for bucket, sent, _ in batch:
                with bucket.lock:
                    bucket.in_flight -= sent
                    bucket.unreported += sent   # again in a later report: at worst debited twice
                    self._requeue(bucket)
            self._reach.failed(exc, keys[0])
            return
        self.redis_calls += 1
        self.reported += len(batch)
        self._reach.succeeded()
        workers = max(1, self._workers())
        for (bucket, sent, h), level in zip(batch, levels, strict=True):
            with bucket.lock:
                bucket.in_flight -= sent
                bucket.level = float(level)
                if h > 0 and bucket.level >= workers * h:
                    if not bucket.local:
                        bucket.local, bucket.tokens = True, 0
                elif bucket.local:
                    bucket.local, bucket.tokens, bucket.empty_until = False, 0, 0.0
                if bucket.unreported:
                    self._requeue(bucket)

    def _requeue(self, bucket: RateBucket) -> None:
        self._report_by(bucket, self._clock() + self._lease_s)

    def forget_idle(self, idle_s: float) -> None:
        """Drop buckets idle for ``idle_s``, local with nothing unreported: a bucket this worker
        holds nothing of is exactly that. An idle shared one is reported (nothing) instead, to
        learn whether it is local again, and dropped at a later sweep."""
        now = self._clock()
        with self._lock:
            buckets = self._buckets.copy()
        for ident, bucket in buckets.items():
            if now - bucket.used < idle_s:
                continue
            with bucket.lock:
                if bucket.queued or bucket.unreported or bucket.in_flight:
                    continue
                if bucket.local:
                    bucket.forgotten = True
                    self._buckets.pop(ident, None)
                else:
                    self._queue(bucket)

    def flush_all(self) -> None:
        """At close: report everything unreported."""
        with self._lock:
            buckets = list(self._buckets.values())
        for bucket in buckets:
            with bucket.lock:
                if bucket.unreported and not bucket.queued:
                    self._queue(bucket)
        self.report()
