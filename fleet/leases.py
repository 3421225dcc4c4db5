"""Shared rate limits and quotas, nearly free per call: pre-debited leases. (A key's
``max_concurrent`` is counted by ``fleet.concurrency``, which this admission holds: a place
cannot be leased in advance as tokens are.)

A shared bucket lives in Redis (a token bucket on Redis server time for rate limits, a
counter per period for quotas). A worker never asks Redis per call: it takes a *lease*
of K tokens (or quota calls) in one atomic script, spends them locally under a per-bucket
lock, and asks again only when the lease is spent or has expired.

Guarantees (T any window, r the refill rate, b the burst, L = ``GATEWAY_LEASE_MS``):

* Tokens are debited before they are spent and a lease is spent only within L of being
  taken, so calls admitted in any window T were taken from the bucket within T + L:
  **admitted(T) <= b + r * (T + L)**. Leftovers of an expired lease are dropped, not handed
  back: a hand-back would re-enter a bucket that refilled meanwhile and let a window admit
  up to b + r * (T + 3L) (a test reproduced it). Dropping costs a little throughput at the
  end of a busy spell; the lease size halves after each expiry with leftovers, and the
  grant is at most a quarter of the bucket, so the loss stays small.
* Quotas: calls are debited before they are admitted, so the fleet **never admits more
  than the quota's calls**; unused leased calls go back. K shrinks to a quarter of what is
  left (down to 1) as a budget runs out, so the last calls spread over workers instead of
  sitting in one worker's lease.
* Rows settle after the call: a worker adds its rows to Redis on its next lease or within
  ``GATEWAY_LEASE_MS`` (a flusher thread), and refuses once the rows it knows of reach the
  quota. So rows can overshoot by at most the rows of calls already admitted and not yet
  settled: (calls in flight + calls in the last L) x their row counts, fleet-wide.
* K adapts per bucket: doubled when a lease is spent before it expires (up to
  ``GATEWAY_LEASE_MAX``), halved when it expires with leftovers. A busy key costs about
  one script per K calls per worker; an idle key costs nothing.

Redis lost its data (a restart without persistence, a failover to a replica that lagged, an
eviction): a quota bucket Redis does not hold (at the start of a period too) is created from
the run history before the key is admitted again: the calls of the key that passed admission
since the period began, whatever their status, and their rows (``history``: the composition
root passes ``gateway.store.history.AdmittedUsage``). The script reports a missing bucket
instead of creating it; the worker reads the store (once per key and period, or after a
loss: never per call) and asks again with what it found; workers that race create it once
(the first script to run wins, the others' reads are dropped). Each bucket carries a random
generation: a lease remembers the one it came from, and leftovers handed back to another
generation are dropped (they were never added to it); a hand-back alone does not create a
bucket, so the rebuild waits for the next admission and the history has caught up. Bounds:

* Calls: the fleet admits at most **the quota + the calls in flight at the loss**: calls
  admitted and not yet in the store's history when the bucket is rebuilt. Those are runs still
  executing or queued in a worker's history writer (written every
  ``GATEWAY_HISTORY_FLUSH_MS``; longer while the store is unreachable), calls spent from
  leases taken from the lost bucket (at most one lease per worker: ``GATEWAY_LEASE_MAX`` and
  a quarter of what was left, spent within L or dropped), and calls a worker's local fallback
  admitted while Redis was away (together at most what was left) that were not yet written.
  A loss while a key has been idle for one flush interval loses nothing: exact.
* Rows: the same, in rows. Rows a worker still had to settle at the loss are added to the
  rebuilt bucket, and count twice when their runs were already read (the strict side: at most
  the rows of the last L). A stream's rows are charged as they are sent and its run records
  none, so streamed rows are not recovered.
* Rate limits are not rebuilt: a bucket restarts full, so a window holding one loss admits
  at most one burst more, **b + b + r * (T + L)** (per key and per client IP).
* The store unreachable when a bucket must be created: the worker decides as with Redis
  unreachable (below) for that bucket and reads the store again after ``SEED_RETRY_S``.

Redis unreachable (``GATEWAY_REDIS_FAILURE``): ``open`` admits through a local token bucket
per worker holding its share (1/W, W = live workers last seen on the bus) of each limit and
quota; ``closed`` answers 503. Either way the worker retries Redis every 250 ms and returns
to the shared buckets by itself; it logs once when it starts deciding locally, once when
Redis answers again, and a summary every ``GATEWAY_DEGRADED_LOG_S`` between
(``fleet.degraded``), never a line per call.

Every Redis key carries a hash tag per bucket (``gw:{rl:key:7}``), so each script touches
one slot and runs on Redis Cluster; scripts are sent with EVALSHA and re-sent on NOSCRIPT
(redis-py's ``Script`` does this; a promoted replica has no scripts cached).

Failover (Redis Cluster or Sentinel, ``fleet.redis_client``): while the failed master's
buckets are unreachable, the worker decides as with Redis unreachable for those buckets
only: the 250 ms windows are kept per server (in a cluster, the master of the bucket's slot
as the client's slot map says), so the buckets on the other masters stay shared (and in
``closed`` mode their keys are not refused), and a partition costs one timeout per server
and window, not one per key. The promoted replica then
serves the buckets it had received. Writes it had not (asynchronous replication) are lost:
a quota bucket it never received is rebuilt from the run history (above: at most the quota
+ the calls in flight); one it received but behind the master lacks the calls leased in
the last replication lag (typically under a millisecond of leases; ``WAIT`` is not used), so
the quota may admit up to those calls more. Rate buckets restart from what the replica
held: at most one burst more, as above.
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import redis
from redis.cluster import RedisCluster

from gateway.errors import GatewayError
from gateway.model.limits import Quota, Rate, quota_period, quota_window
from gateway.ports import Clock, Headers, quota_exceeded, rate_limited

from .concurrency import Place, RunningCalls
from .degraded import DegradedLog
from .redis_client import RedisLink, drop_idle

if TYPE_CHECKING:
    from gateway.model.catalog import ApiKey
    from gateway.settings import Settings

log = logging.getLogger("fleet.leases")

# (key id, period start in epoch seconds) -> (calls admitted, rows returned) since then, as
# the run history holds them (``gateway.store.history.AdmittedUsage``).
UsageReader = Callable[[int, float], tuple[int, int]]
SEED_RETRY_S = 1.0     # a bucket that could not be rebuilt (store unreachable) is retried after this

# KEYS[1]: bucket hash. ARGV: rate per ms, capacity, want, give back (0 from this module).
# Returns {granted, tokens left (text: Lua numbers cross as integers), ms until 1 token}.
_TAKE_TOKENS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local rate, cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local want, back = tonumber(ARGV[3]), tonumber(ARGV[4])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(b[1]) or cap
local ts = tonumber(b[2]) or now
tokens = math.min(cap, tokens + math.max(0, now - ts) * rate + back)
local grant = 0
if tokens >= 1 and want > 0 then
  grant = math.min(want, math.floor(tokens), math.max(1, math.floor(tokens / 4)))
  tokens = tokens - grant
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(cap / rate) + 60000)
local wait = 0
if tokens < 1 then wait = (1 - tokens) / rate end
return {grant, tostring(tokens), tostring(wait)}
"""

# KEYS[1]: quota hash for one key and period. ARGV: calls limit (-1: none), want, give
# back, rows to add, expire at (epoch s), the bucket generation the caller's lease came from,
# and to create a missing bucket: a new generation ('': do not), its calls and rows (what the
# run history holds). Returns {granted, calls used, rows used, generation}, or {-1, 0, 0, ''}
# when the bucket is missing and no generation was given: the caller reads the history and
# asks again. Leftovers handed back count only in the generation they were leased from.
_TAKE_CALLS = """
local gen = redis.call('HGET', KEYS[1], 'gen')
if not gen then
  if redis.call('EXISTS', KEYS[1]) == 1 then
    gen = ''
  elseif ARGV[7] == '' then
    return {-1, 0, 0, ''}
  else
    gen = ARGV[7]
    redis.call('HSET', KEYS[1], 'gen', gen, 'calls', ARGV[8], 'rows', ARGV[9])
  end
end
local limit, want = tonumber(ARGV[1]), tonumber(ARGV[2])
local back, rows = tonumber(ARGV[3]), tonumber(ARGV[4])
if gen ~= ARGV[6] then back = 0 end
local used = tonumber(redis.call('HGET', KEYS[1], 'calls') or '0') - back
if used < 0 then used = 0 end
local grant = 0
if limit < 0 then
  grant = want
elseif used < limit and want > 0 then
  local left = limit - used
  grant = math.min(want, left, math.max(1, math.floor(left / 4)))
end
used = used + grant
redis.call('HSET', KEYS[1], 'calls', used)
local total_rows = redis.call('HINCRBY', KEYS[1], 'rows', rows)
redis.call('EXPIREAT', KEYS[1], tonumber(ARGV[5]) + 86400)
return {grant, used, total_rows, gen}
"""


class _Lease:
    """This worker's share of one shared bucket (rate limit or quota)."""

    __slots__ = ("bucket", "rate", "lock", "tokens", "expires", "want", "empty_until", "shared", "reset_s",
                 "rows_pending", "rows_used", "local_tokens", "local_ts", "period_end", "key_id",
                 "period_start", "gen", "seed_after")

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket       # the Redis key of the shared bucket
        self.rate: Rate | None = None
        self.lock = threading.Lock()
        self.tokens = 0            # leased, not yet spent
        self.expires = 0.0         # the lease is spent only before this (monotonic)
        self.want = 1              # next lease size (adaptive)
        self.empty_until = 0.0     # shared bucket known empty until (monotonic)
        self.shared = 0.0          # tokens (or calls used) in Redis at the last lease
        self.reset_s = 0           # for X-RateLimit-Reset
        self.rows_pending = 0      # rows returned, not yet added in Redis
        self.rows_used = 0         # rows in Redis at the last lease
        self.local_tokens: float | None = None   # fallback bucket while Redis is unreachable
        self.local_ts = 0.0
        self.period_end = 0
        self.key_id = 0            # quotas: whose bucket, and when its period began
        self.period_start = 0
        self.gen = b""             # quotas: the generation of the shared bucket the lease came from
        self.seed_after = 0.0      # quotas: the bucket could not be rebuilt; local until this (monotonic)


class LeasedAdmission:
    def __init__(self, redis_url: str, settings: Settings, workers_hint: Callable[[], int] = lambda: 1,
                 clock: Clock = time.monotonic, wall: Clock = time.time, history: UsageReader | None = None) -> None:
        """``history``: what a key was admitted since its period began, read from the store
        when a quota bucket is created (without it, a bucket starts at 0)."""
        self._redis = RedisLink(redis_url).client(settings.redis_timeout_ms / 1000)
        self._take_tokens = self._redis.register_script(_TAKE_TOKENS)
        self._take_calls = self._redis.register_script(_TAKE_CALLS)
        self._lease_s = settings.lease_ms / 1000
        self._lease_max = settings.lease_max
        self._closed_on_failure = settings.redis_failure == "closed"
        self._ip_rate = Rate.parse(settings.rate_limit, settings.rate_limit_burst or None, "GATEWAY_RATE_LIMIT") \
            if settings.rate_limit else None
        self._workers_hint = workers_hint
        self._clock = clock
        self._wall = wall
        self._history = history
        self._leases: dict[str, _Lease] = {}
        self._windows: dict[str, tuple[str, int, int]] = {}
        self._leases_lock = threading.Lock()
        # server -> until when it counts as unreachable (monotonic); one entry ("") unless a cluster
        self._down: dict[str, float] = {}
        self._cluster = self._redis if isinstance(self._redis, RedisCluster) else None
        self.fallbacks = 0          # calls admitted or refused by the local fallback
        self.redis_calls = 0
        self.rebuilt = 0            # quota buckets created from the run history (new period or lost)
        self.lost = 0               # ... of which this worker had leased from before: Redis lost them
        self._warned_until = 0.0
        self.degraded = DegradedLog(log, "refusing with 503" if self._closed_on_failure else
                                    "admitting through this worker's local share of each limit",
                                    settings.degraded_log_s, clock)
        self._failed_bucket = ""    # probed by the flusher to find Redis back when no call does
        # max_concurrent: places held while calls run (fleet.concurrency), on the same client and log.
        self.running = RunningCalls(self._redis, settings.concurrency_lease_ms, self._closed_on_failure,
                                    workers_hint, self.degraded, clock)
        self._stop = threading.Event()
        self._flusher = threading.Thread(target=self._flush_loop, name="gateway-leases", daemon=True)
        self._flusher.start()

    # --- the data plane's interface ---------------------------------------------------
    def admit_ip(self, ip: str) -> Headers:
        rate = self._ip_rate
        if rate is None:
            return ()
        return self._spend_rate(self._lease(f"gw:{{rl:ip:{ip}}}"), rate, "this client")

    def admit_key(self, key: ApiKey) -> Headers:
        rate, quota = key.rate, key.quota
        if rate is None and quota is None:
            return ()
        headers: Headers = ()
        if rate is not None:
            headers = self._spend_rate(self._lease(f"gw:{{rl:key:{key.id}}}"), rate, "this key")
        if quota is not None:
            headers += self._spend_quota(key, quota, headers)
        return headers

    def settle(self, key: ApiKey, rows: int) -> None:
        quota = key.quota
        if quota is None or quota.rows is None or not rows:
            return
        lease = self._quota_lease(key, quota)
        with lease.lock:
            lease.rows_pending += rows

    def rows_left(self, key: ApiKey) -> int | None:
        quota = key.quota
        if quota is None or quota.rows is None:
            return None
        lease = self._quota_lease(key, quota)
        with lease.lock:
            return max(quota.rows - lease.rows_used - lease.rows_pending, 0)

    def take_rows(self, key: ApiKey, wanted: int) -> int:
        quota = key.quota
        if quota is None or quota.rows is None:
            return wanted
        lease = self._quota_lease(key, quota)
        with lease.lock:   # checked and charged at once: concurrent streams share what is left
            granted = max(0, min(wanted, quota.rows - lease.rows_used - lease.rows_pending))
            lease.rows_pending += granted
        return granted

    def enter(self, key: ApiKey) -> Place:
        return self.running.enter(key)

    def leave(self, key: ApiKey, place: object) -> None:
        self.running.leave(place)  # type: ignore[arg-type]  # what enter() returned

    def local(self, key: ApiKey) -> bool:
        return self._ip_rate is None and key.rate is None and key.quota is None and key.max_concurrent is None

    # --- rate limits ------------------------------------------------------------------
    def _lease(self, bucket: str) -> _Lease:
        lease = self._leases.get(bucket)
        if lease is None:
            with self._leases_lock:
                lease = self._leases.setdefault(bucket, _Lease(bucket))
        return lease

    def _spend_rate(self, lease: _Lease, rate: Rate, who: str) -> Headers:
        with lease.lock:
            now = self._clock()   # read under the lock: a wait for it must not stretch a lease
            lease.rate = rate
            if lease.tokens > 0 and now < lease.expires:
                lease.tokens -= 1
                return self._rate_headers(lease, rate)
            if now < lease.empty_until:
                raise rate_limited(lease.empty_until - now, self._rate_headers(lease, rate), who)
            if self._down and self._is_down(lease.bucket, now):
                return self._local_rate(lease, rate, now, who)
            self._grow_or_shrink(lease, now)
            lease.tokens = 0   # an expired lease's leftovers are dropped (see the bound above)
            try:
                grant, left, wait_ms = self._take_tokens(
                    keys=[lease.bucket], args=[rate.per_s / 1000, rate.burst, lease.want, 0])
            except redis.RedisError as exc:
                self._redis_down(exc, lease.bucket)
                return self._local_rate(lease, rate, now, who)
            self.redis_calls += 1
            if self.degraded.degraded:
                self.degraded.succeeded()
            lease.shared = float(left)
            lease.reset_s = math.ceil((rate.burst - lease.shared) / rate.per_s)
            if grant <= 0:
                lease.empty_until = now + float(wait_ms) / 1000
                raise rate_limited(float(wait_ms) / 1000, self._rate_headers(lease, rate), who)
            lease.tokens = grant - 1
            lease.expires = now + self._lease_s
            return self._rate_headers(lease, rate)

    def _grow_or_shrink(self, lease: _Lease, now: float) -> None:
        if lease.tokens > 0:       # expired with leftovers: ask for less
            lease.want = max(1, lease.want // 2)
        elif lease.expires > now or lease.expires == 0.0 or now - lease.expires < self._lease_s:
            lease.want = min(self._lease_max, lease.want * 2)

    @staticmethod
    def _rate_headers(lease: _Lease, rate: Rate) -> Headers:
        return (("X-RateLimit-Limit", str(rate.limit)),
                ("X-RateLimit-Remaining", str(int(lease.shared) + max(lease.tokens, 0))),
                ("X-RateLimit-Reset", str(lease.reset_s)))

    # --- quotas ---------------------------------------------------------------------
    def _window(self, per: str) -> tuple[str, int, int]:
        """The current quota period, recomputed only when it has ended (no datetime per call)."""
        window = self._windows.get(per)
        if window is None or self._wall() >= window[2]:
            window = self._windows[per] = quota_period(per, self._wall())
        return window

    def _quota_lease(self, key: ApiKey, quota: Quota) -> _Lease:
        period, start, end = self._window(quota.per)
        lease = self._lease(f"gw:{{q:{key.id}}}:{period}")
        lease.key_id, lease.period_start, lease.period_end = key.id, start, end
        return lease

    def _take(self, lease: _Lease, limit: int, want: int, back: int, rows: int) -> tuple[int, int, int] | None:
        """The quota script on ``lease``'s bucket: (granted, calls used, rows used). A missing
        bucket (a new period, or Redis lost it) is created from the run history first: one
        store read, then the script again with what it found; when several workers race, the
        script creates the bucket once and the others' reads are ignored. Only leftovers to
        hand back to a missing bucket: None, nothing is created (they were leased from the
        bucket that is gone; the next admission creates it, the history having caught up)."""
        args: list[int | bytes | str] = [limit, want, back, rows, lease.period_end, lease.gen]
        history = self._history
        if history is None:
            reply = self._take_calls(keys=[lease.bucket], args=[*args, _new_gen(), 0, 0])
        else:
            reply = self._take_calls(keys=[lease.bucket], args=[*args, "", 0, 0])
            if reply[0] < 0 and want == 0 and rows == 0:
                return None
            if reply[0] < 0:
                try:
                    calls, rows_seen = history(lease.key_id, lease.period_start)
                except Exception as exc:
                    raise _NoHistory(exc) from exc
                reply = self._take_calls(keys=[lease.bucket], args=[*args, _new_gen(), calls, rows_seen])
                self.redis_calls += 1
                self.rebuilt += 1
                if lease.gen:   # this worker had leased from the bucket before: Redis lost it
                    self.lost += 1
                    self._warn(f"admission: quota bucket {lease.bucket} was lost from Redis; rebuilt from the "
                               f"run history ({calls} calls, {rows_seen} rows since the period began)")
        grant, used, rows_used, lease.gen = reply
        return int(grant), int(used), int(rows_used)

    def _no_history(self, lease: _Lease, exc: Exception, now: float) -> None:
        lease.seed_after = now + SEED_RETRY_S
        self._warn(f"admission: cannot read the run history to create quota bucket {lease.bucket} ({exc}); "
                   f"{'refusing' if self._closed_on_failure else 'using local shares'} for {SEED_RETRY_S:.0f}s")

    def _warn(self, message: str) -> None:
        """At most one warning per 10 s: a loss touches every key of every worker at once."""
        now = self._clock()
        if now >= self._warned_until:
            self._warned_until = now + 10.0
            log.warning("%s", message)

    def _spend_quota(self, key: ApiKey, quota: Quota, rate_headers: Headers) -> Headers:
        lease = self._quota_lease(key, quota)
        reset_s = max(1, int(lease.period_end - self._wall()))
        with lease.lock:
            now = self._clock()
            if quota.rows is not None and lease.rows_used + lease.rows_pending >= quota.rows:
                raise quota_exceeded("rows", reset_s, rate_headers + self._quota_headers(lease, quota, reset_s))
            if quota.calls is None:
                return self._quota_headers(lease, quota, reset_s)
            if lease.tokens > 0 and now < lease.expires:
                lease.tokens -= 1
                return self._quota_headers(lease, quota, reset_s)
            if now < lease.empty_until:
                raise quota_exceeded("calls", reset_s, rate_headers + self._quota_headers(lease, quota, reset_s))
            if (self._down and self._is_down(lease.bucket, now)) or now < lease.seed_after:
                return self._local_quota(lease, quota.calls, reset_s, now)
            self._grow_or_shrink(lease, now)
            back, lease.tokens = lease.tokens, 0
            rows, lease.rows_pending = lease.rows_pending, 0
            try:
                taken = self._take(lease, quota.calls, lease.want, back, rows)
            except redis.RedisError as exc:
                lease.rows_pending += rows
                self._redis_down(exc, lease.bucket)
                return self._local_quota(lease, quota.calls, reset_s, now)
            except _NoHistory as exc:
                lease.rows_pending += rows
                self._no_history(lease, exc, now)
                return self._local_quota(lease, quota.calls, reset_s, now)
            self.redis_calls += 1
            if self.degraded.degraded:
                self.degraded.succeeded()
            grant, used, rows_used = taken or (0, 0, 0)   # None only when nothing was asked for
            lease.shared, lease.rows_used = used, rows_used
            if grant <= 0:
                # Others may still hand back leftovers: look again after one lease length.
                lease.empty_until = now + self._lease_s
                raise quota_exceeded("calls", reset_s, rate_headers + self._quota_headers(lease, quota, reset_s))
            lease.tokens = grant - 1
            lease.expires = now + self._lease_s
            return self._quota_headers(lease, quota, reset_s)

    @staticmethod
    def _quota_headers(lease: _Lease, quota: Quota, reset_s: int) -> Headers:
        headers: Headers = (("X-Quota-Reset", str(reset_s)),)
        if quota.calls is not None:
            left = quota.calls - int(lease.shared) + max(lease.tokens, 0)
            headers += (("X-Quota-Remaining-Calls", str(max(left, 0))),)
        if quota.rows is not None:
            headers += (("X-Quota-Remaining-Rows", str(max(quota.rows - lease.rows_used - lease.rows_pending, 0))),)
        return headers

    # --- Redis unreachable ------------------------------------------------------------
    def _redis_down(self, exc: Exception, bucket: str = "") -> None:
        # Drop the idle pooled connections: after a restart each stale socket would otherwise
        # fail once more and push the return to shared state back by another 250 ms. (Not the
        # ones in use: that would fail other threads' calls and feed the outage itself.)
        drop_idle(self._redis)
        if bucket:
            self._failed_bucket = bucket
        self.degraded.failed(exc)
        self._down[self._server(bucket)] = self._clock() + 0.25

    def _server(self, bucket: str) -> str:
        """Which server holds ``bucket``: the master of its slot in a cluster (as the client's
        slot map says: after a failover, the promoted one), else the one server ("")."""
        cluster = self._cluster
        if cluster is None or not bucket:
            return ""
        try:
            return cluster.nodes_manager.get_node_from_slot(cluster.keyslot(bucket)).name
        except Exception:   # the slot map does not cover it (yet): one window for those
            return "?"

    def _is_down(self, bucket: str, now: float) -> bool:
        down = self._down
        until = max(down.get(self._server(bucket), 0.0), down.get("", 0.0))
        return now < until

    def _any_down(self, now: float) -> bool:
        return any(now < until for until in list(self._down.values()))

    def _probe(self) -> None:
        """One keyed read on the bucket that failed last (in a cluster: its slot's master)."""
        self._redis.exists(self._failed_bucket or "gw:{probe}")

    def _unavailable(self) -> GatewayError:
        return GatewayError(503, "admission_unavailable", "shared limits are unreachable; retry shortly",
                            headers={"Retry-After": "1"})

    def _local_take(self, lease: _Lease, per_s: float, cap: float, now: float) -> float:
        """A local token bucket at 1/W of the shared one; returns seconds until a token
        (0 when one was taken)."""
        workers = max(1, self._workers_hint())
        per_s, cap = per_s / workers, max(1.0, cap / workers)
        if lease.local_tokens is None:
            lease.local_tokens, lease.local_ts = cap, now
        lease.local_tokens = min(cap, lease.local_tokens + (now - lease.local_ts) * per_s)
        lease.local_ts = now
        if lease.local_tokens >= 1:
            lease.local_tokens -= 1
            return 0.0
        return (1 - lease.local_tokens) / per_s if per_s > 0 else 3600.0

    def _local_rate(self, lease: _Lease, rate: Rate, now: float, who: str) -> Headers:
        self.fallbacks += 1
        if self._closed_on_failure:
            self.degraded.refused += 1
            raise self._unavailable()
        wait = self._local_take(lease, rate.per_s, rate.burst, now)
        left = lease.local_tokens or 0.0   # set by _local_take just above
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

    def _local_quota(self, lease: _Lease, calls: int, reset_s: int, now: float) -> Headers:
        self.fallbacks += 1
        if self._closed_on_failure:
            self.degraded.refused += 1
            raise self._unavailable()
        # The worker's share of what was left when Redis was last seen, spent locally.
        left = calls - int(lease.shared)
        if self._local_take(lease, 0.0, left, now):
            self.degraded.refused += 1
            raise quota_exceeded("calls", reset_s, ())
        self.degraded.admitted += 1
        return (("X-Quota-Reset", str(reset_s)),)

    # --- background: hand back expired leftovers, settle rows ---------------------------
    def _flush_loop(self) -> None:
        while not self._stop.wait(self._lease_s):
            try:
                self.flush()
            except redis.RedisError as exc:
                self._redis_down(exc)
            except Exception:
                log.exception("admission: flush failed")
            if self.degraded.degraded:   # the summary; and Redis back when no call tried it
                self.degraded.tick(None if self._any_down(self._clock()) else self._probe)

    def flush(self) -> None:
        now = self._clock()
        for lease in list(self._leases.values()):
            if lease.rate is None and not (self._down and self._is_down(lease.bucket, now)):
                try:
                    self._settle_quota(lease, now)
                except redis.RedisError as exc:
                    self._redis_down(exc, lease.bucket)

    def _settle_quota(self, lease: _Lease, now: float) -> None:
        # The Redis call is made holding the lease's lock, as _spend_quota's is: released in
        # between, the rows on their way to Redis would be counted nowhere, and a call in that
        # gap could pass the rows check with the quota already spent (one round trip per key
        # and flush, off the request path).
        with lease.lock:
            expired = lease.tokens > 0 and now >= lease.expires
            if not (lease.rows_pending or expired):
                if lease.period_end and self._wall() > lease.period_end + 60:
                    self._leases.pop(lease.bucket, None)
                return
            if now < lease.seed_after:
                return
            back = lease.tokens if expired else 0
            rows = lease.rows_pending
            try:
                taken = self._take(lease, -1, 0, back, rows)
            except _NoHistory as exc:
                self._no_history(lease, exc, now)
                return
            lease.tokens -= back
            if taken is None:   # the bucket is gone, and its leftovers with it
                return
            _, used, rows_used = taken
            lease.rows_pending -= rows
            lease.shared, lease.rows_used = used, rows_used

    # --- management: GET /api/v1/usage/quotas ---------------------------------------------
    def usage(self, keys: Iterable[ApiKey]) -> list[dict]:
        items = []
        for key in keys:
            if key.quota is None:
                continue
            period, end = quota_window(key.quota.per, self._wall())
            calls, rows = self._redis.hmget(f"gw:{{q:{key.id}}}:{period}", "calls", "rows")
            items.append({"key": key.name, "period": period, "resets_at": end, "quota": key.quota.to_doc(),
                          "calls_used": int(calls or 0), "rows_used": int(rows or 0)})
        return items

    def close(self) -> None:
        self.running.close()
        self._stop.set()
        self._flusher.join(1)
        try:
            for lease in self._leases.values():
                lease.expires = 0.0
            self.flush()
        except redis.RedisError:
            pass
        close = getattr(self._history, "close", None)
        if close is not None:
            close()


class _NoHistory(Exception):
    """The run history could not be read, so a quota bucket could not be created."""


def _new_gen() -> str:
    return os.urandom(6).hex()
