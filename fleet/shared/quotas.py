"""Quotas, shared by the fleet and never exceeded: a counter per key and period in Redis, taken
from by *leases*: a worker takes K calls in one atomic script and spends them locally under a
per-bucket lock. (Rate limits: ``fleet.shared.rates``; both held by ``fleet.shared.leases.LeasedAdmission``.)

Quotas, L = ``GATEWAY_LEASE_MS``, H = ``GATEWAY_QUOTA_HOLD_S``, W = live workers:

* Calls are debited in Redis before they are admitted, and nothing a worker sends Redis is
  ever sent twice in the direction that gives calls back: leftovers handed back are dropped
  from the worker's lease before the script is sent, so a script that ran on Redis after its
  caller gave up on it (a reply slower than ``GATEWAY_REDIS_TIMEOUT_MS``) loses them instead
  of returning them twice. With Redis unreachable or slow a worker admits only what its lease
  already holds, then answers 503 ``admission_unavailable`` (in both failure modes): so the fleet
  **never admits more than the quota's calls**, partitions and stalls included. (A local share
  while Redis was silent admitted 139 calls of a 100-call quota across a 5 s stall: the shares
  were never reconciled with the counter. Before that, the hand-back above was the cause of a
  51-of-50.)
* A lease is held up to H (not L): a key far below its quota costs one script per K calls per
  worker, cold keys included. K starts at ``GATEWAY_LEASE_MAX``, halves each time a lease is
  handed back unspent and doubles again when one is spent, and it is at most a quarter of what
  is left over W (at least 1), so the last calls spread over the workers.
  Calls leased by a worker that gets no more calls of the key are refused to the others until
  they come back: at most one lease per worker, for at most H (what an exact counter admits
  and this one refuses); all of them come back when the worker stops.
* Rows settle after the call: a worker adds its rows to Redis on its next lease or within L
  (the flusher), and refuses once the rows it knows of reach the quota. So rows can overshoot
  by at most the rows of calls already admitted and not yet settled: (calls in flight + calls
  in the last L) x their row counts, fleet-wide.

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
  ``GATEWAY_HISTORY_FLUSH_MS``; longer while the store is unreachable) and calls spent from
  leases taken from the lost bucket (at most one lease per worker).
  A worker learns of a loss from its bus heartbeat (``fleet.shared.bus``: its own entry gone) and
  drops what its leases still hold, so a loss while a key has been idle for one heartbeat
  loses nothing: exact. On Redis Cluster the heartbeat sees only the bus's master: a loss on
  another master is learned from the rebuild, after the workers spent their leftovers (at
  most one lease each).
* Rows: the same, in rows. Rows a worker still had to settle at the loss are added to the
  rebuilt bucket, and count twice when their runs were already read (the strict side: at most
  the rows of the last L). A stream's rows are charged as they are sent and its run records
  none, so streamed rows are not recovered.
* The store unreachable when a bucket must be created: 503 for that key until the store
  answers (retried after ``SEED_RETRY_S``).

"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import redis

from gateway.errors import GatewayError
from gateway.model.limits import Quota, quota_period, quota_window
from gateway.ports import Clock, Headers, quota_exceeded

from .reach import Reach
from .wheel import Wheel

if TYPE_CHECKING:
    from gateway.model.catalog import ApiKey
    from gateway.settings import Settings

log = logging.getLogger("fleet.shared.quotas")

# (key id, period start in epoch seconds) -> (calls admitted, rows returned) since then, as
# the run history holds them (``gateway.store.history.AdmittedUsage``).
UsageReader = Callable[[int, float], tuple[int, int]]
SEED_RETRY_S = 1.0     # a bucket that could not be rebuilt (store unreachable) is retried after this

# KEYS[1]: quota hash for one key and period. ARGV: calls limit (-1: none), want, give
# back, rows to add, expire at (epoch s), the bucket generation the caller's lease came from,
# and to create a missing bucket: a new generation ('': do not), its calls and rows (what the
# run history holds), then the live workers. Returns {granted, calls used, rows used,
# generation}, or {-1, 0, 0, ''} when the bucket is missing and no generation was given: the
# caller reads the history and asks again. Leftovers handed back count only in the generation
# they were leased from.
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
local workers = math.max(1, tonumber(ARGV[10]))
if gen ~= ARGV[6] then back = 0 end
local used = tonumber(redis.call('HGET', KEYS[1], 'calls') or '0') - back
if used < 0 then used = 0 end
local grant = 0
if limit < 0 then
  grant = want
elseif used < limit and want > 0 then
  local left = limit - used
  grant = math.min(want, left, math.max(1, math.floor(left / (4 * workers))))
end
used = used + grant
redis.call('HSET', KEYS[1], 'calls', used)
local total_rows = redis.call('HINCRBY', KEYS[1], 'rows', rows)
redis.call('EXPIREAT', KEYS[1], tonumber(ARGV[5]) + 86400)
return {grant, used, total_rows, gen}
"""


class _Lease:
    """This worker's share of one key's quota bucket for one period."""

    __slots__ = ("bucket", "lock", "tokens", "expires", "want", "empty_until", "shared", "rows_pending",
                 "rows_used", "period_end", "key_id", "period_start", "gen", "seed_after", "queued")

    def __init__(self, bucket: str, want: int) -> None:
        self.bucket = bucket       # the Redis key of the shared bucket
        self.lock = threading.Lock()
        self.tokens = 0            # leased, not yet spent
        self.expires = 0.0         # the lease is spent only before this (monotonic)
        self.want = want           # next lease size (adaptive)
        self.empty_until = 0.0     # shared bucket known empty until (monotonic)
        self.shared = 0            # calls used in Redis at the last lease
        self.rows_pending = 0      # rows returned, not yet added in Redis
        self.rows_used = 0         # rows in Redis at the last lease
        self.period_end = 0
        self.key_id = 0            # whose bucket, and when its period began
        self.period_start = 0
        self.gen = b""             # the generation of the shared bucket the lease came from
        self.seed_after = 0.0      # the bucket could not be rebuilt; 503 until this (monotonic)
        self.queued = False        # rows to settle: in the flusher's next round


class QuotaLeases:
    """Every quota this worker has leased from, by bucket. ``unavailable()``: the 503 given when
    no leased call is left and Redis cannot be asked (the admission's, counted by it)."""

    def __init__(self, client: redis.Redis, settings: Settings, reach: Reach, workers_hint: Callable[[], int],
                 unavailable: Callable[[], GatewayError], clock: Clock = time.monotonic,
                 wall: Clock = time.time, history: UsageReader | None = None) -> None:
        self._redis = client
        self._take_calls = client.register_script(_TAKE_CALLS)
        self._lease_s = settings.lease_ms / 1000
        self._hold_s = settings.quota_hold_s
        self._lease_max = settings.lease_max
        self.reach = reach
        self._workers_hint = workers_hint
        self._unleased = unavailable
        self._clock = clock
        self._wall = wall
        self._history = history
        self._leases: dict[str, _Lease] = {}
        self._windows: dict[str, tuple[str, int, int]] = {}
        self._leases_lock = threading.Lock()
        self._queue_lock = threading.Lock()
        self._rows_due: list[_Lease] = []                  # rows to settle
        self._expiring: Wheel[_Lease] = Wheel(self._lease_s)  # leases to hand back when they expire
        self.redis_calls = 0        # quota scripts sent (round trips)
        self.rebuilt = 0            # quota buckets created from the run history (new period or lost)
        self.lost = 0               # ... of which this worker had leased from before: Redis lost them
        self._warned_until = 0.0

    # --- the admission's interface -------------------------------------------------------
    def spend(self, key: ApiKey, quota: Quota, rate_headers: Headers) -> Headers:
        """One call of ``key``'s quota, or ``quota_exceeded`` (``rate_headers`` go with it)."""
        lease = self._lease(key, quota)
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
            if self.reach.is_down(lease.bucket, now) or now < lease.seed_after:
                raise self._unleased()
            return self._lease_calls(lease, quota, quota.calls, reset_s, rate_headers, now)

    def settle(self, key: ApiKey, rows: int) -> None:
        """Rows a call returned, added in Redis later (the flusher, or the next lease)."""
        quota = key.quota
        if quota is None or quota.rows is None or not rows:
            return
        lease = self._lease(key, quota)
        with lease.lock:
            lease.rows_pending += rows
            self._rows_to_settle(lease)

    def rows_left(self, key: ApiKey) -> int | None:
        quota = key.quota
        if quota is None or quota.rows is None:
            return None
        lease = self._lease(key, quota)
        with lease.lock:
            return max(quota.rows - lease.rows_used - lease.rows_pending, 0)

    def take_rows(self, key: ApiKey, wanted: int) -> int:
        quota = key.quota
        if quota is None or quota.rows is None:
            return wanted
        lease = self._lease(key, quota)
        with lease.lock:   # checked and charged at once: concurrent streams share what is left
            granted = max(0, min(wanted, quota.rows - lease.rows_used - lease.rows_pending))
            lease.rows_pending += granted
            if granted:
                self._rows_to_settle(lease)
        return granted

    # --- leasing ----------------------------------------------------------------------
    def _window(self, per: str) -> tuple[str, int, int]:
        """The current quota period, recomputed only when it has ended (no datetime per call)."""
        window = self._windows.get(per)
        if window is None or self._wall() >= window[2]:
            window = self._windows[per] = quota_period(per, self._wall())
        return window

    def _lease(self, key: ApiKey, quota: Quota) -> _Lease:
        period, start, end = self._window(quota.per)
        bucket = f"gw:{{q:{key.id}}}:{period}"
        lease = self._leases.get(bucket)
        if lease is None:
            with self._leases_lock:
                # The first lease as large as the rest: the script caps it at a quarter of what is
                # left over W, which is what keeps a small quota's last calls spread.
                lease = self._leases.setdefault(bucket, _Lease(bucket, self._lease_max))
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
        workers = max(1, self._workers_hint())
        history = self._history
        if history is None:
            reply = self._take_calls(keys=[lease.bucket], args=[*args, _new_gen(), 0, 0, workers])
        else:
            reply = self._take_calls(keys=[lease.bucket], args=[*args, "", 0, 0, workers])
            if reply[0] < 0 and want == 0 and rows == 0:
                return None
            if reply[0] < 0:
                try:
                    calls, rows_seen = history(lease.key_id, lease.period_start)
                except Exception as exc:
                    raise _NoHistory(exc) from exc
                reply = self._take_calls(keys=[lease.bucket], args=[*args, _new_gen(), calls, rows_seen, workers])
                self.redis_calls += 1
                self.rebuilt += 1
                if lease.gen:   # this worker had leased from the bucket before: Redis lost it
                    self.lost += 1
                    self._warn(f"admission: quota bucket {lease.bucket} was lost from Redis; rebuilt from the "
                               f"run history ({calls} calls, {rows_seen} rows since the period began)")
        self.redis_calls += 1
        grant, used, rows_used, lease.gen = reply
        return int(grant), int(used), int(rows_used)

    def _no_history(self, lease: _Lease, exc: Exception, now: float) -> None:
        lease.seed_after = now + SEED_RETRY_S
        self._warn(f"admission: cannot read the run history to create quota bucket {lease.bucket} ({exc}); "
                   f"refusing its key for {SEED_RETRY_S:.0f}s")

    def _warn(self, message: str) -> None:
        """At most one warning per 10 s: a loss touches every key of every worker at once."""
        now = self._clock()
        if now >= self._warned_until:
            self._warned_until = now + 10.0
            log.warning("%s", message)

    def _lease_calls(self, lease: _Lease, quota: Quota, calls: int, reset_s: int, rate_headers: Headers,
                     now: float) -> Headers:
        if lease.tokens > 0:      # expired with leftovers: they go back with this script, and less next time
            lease.want = max(1, lease.want // 2)
        elif lease.expires:
            lease.want = min(self._lease_max, lease.want * 2)
        # What is sent is taken off the lease first: a script that ran after its caller gave up
        # (a timeout) has handed the leftovers back, and they must not go back a second time.
        back, lease.tokens = lease.tokens, 0
        rows, lease.rows_pending = lease.rows_pending, 0
        try:
            taken = self._take(lease, calls, lease.want, back, rows)
        except redis.RedisError as exc:
            lease.rows_pending += rows    # rows may count twice: the strict side
            self.reach.failed(exc, lease.bucket)
            raise self._unleased() from exc
        except _NoHistory as exc:
            lease.rows_pending += rows
            self._no_history(lease, exc, now)
            raise self._unleased() from exc
        self.reach.succeeded()
        grant, used, rows_used = taken or (0, 0, 0)   # None only when nothing was asked for
        lease.shared, lease.rows_used = used, rows_used
        if grant <= 0:
            # Others may still hand back leftovers: look again after one lease length.
            lease.empty_until = now + self._lease_s
            raise quota_exceeded("calls", reset_s, rate_headers + self._quota_headers(lease, quota, reset_s))
        lease.tokens = grant - 1
        lease.expires = now + self._hold_s
        self._expiring.schedule(lease, lease.expires)
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

    def _rows_to_settle(self, lease: _Lease) -> None:
        """(the caller holds the lease's lock)"""
        if not lease.queued:
            lease.queued = True
            with self._queue_lock:
                self._rows_due.append(lease)

    # --- background: hand back expired leftovers, settle rows ------------------------------
    def flush(self, now: float) -> None:
        """Settle the rows due and hand back what expired leases hold (the admission's flusher)."""
        with self._queue_lock:
            due, self._rows_due = self._rows_due, []
        due += self._expiring.due(now)
        for lease in {id(lease): lease for lease in due}.values():
            if self.reach.is_down(lease.bucket, now):
                with lease.lock:
                    self._rows_to_settle(lease)
                continue
            try:
                self._settle_quota(lease, now)
            except redis.RedisError as exc:
                self.reach.failed(exc, lease.bucket)

    def _settle_quota(self, lease: _Lease, now: float) -> None:
        # The Redis call is made holding the lease's lock, as _spend_quota's is: released in
        # between, the rows on their way to Redis would be counted nowhere, and a call in that
        # gap could pass the rows check with the quota already spent (one round trip per key
        # and flush, off the request path).
        with lease.lock:
            lease.queued = False
            expired = lease.tokens > 0 and now >= lease.expires
            if not (lease.rows_pending or expired) or now < lease.seed_after:
                return
            back = lease.tokens if expired else 0
            lease.tokens -= back            # before the script: never handed back twice
            rows, lease.rows_pending = lease.rows_pending, 0
            try:
                taken = self._take(lease, -1, 0, back, rows)
            except _NoHistory as exc:
                lease.rows_pending += rows
                self._no_history(lease, exc, now)
                return
            except redis.RedisError:
                lease.rows_pending += rows
                self._rows_to_settle(lease)
                raise
            if back:
                lease.want = max(1, lease.want // 2)
            if taken is None:   # the bucket is gone, and its leftovers with it
                return
            _, used, rows_used = taken
            lease.shared, lease.rows_used = used, rows_used

    def sweep(self) -> None:
        """Forget the leases of ended periods that hold nothing."""
        wall = self._wall()
        with self._leases_lock:
            leases = self._leases.copy()
        for name, lease in leases.items():
            if lease.period_end and wall > lease.period_end + 60 and not (lease.tokens or lease.rows_pending):
                self._leases.pop(name, None)

    def drop_leftovers(self) -> None:
        """Redis lost its data (``fleet.shared.bus`` found this worker's heartbeat gone): the calls
        left in a lease whose bucket is gone were never counted anywhere the rebuild can see
        (the run history counts calls made), so they are dropped, not handed back, and a loss
        while a key is idle stays exact. A lease taken since then from the rebuilt bucket (the
        heartbeat learns of a loss up to one beat late) is kept: the bucket still carries the
        lease's generation. One pipelined read per loss, off the request path; unreadable:
        every leftover dropped (the strict side)."""
        held = [(lease, lease.gen) for lease in list(self._leases.values()) if lease.tokens > 0]
        try:
            pipe = self._redis.pipeline(transaction=False)
            for lease, _ in held:
                pipe.hget(lease.bucket, "gen")
            current = pipe.execute()
        except redis.RedisError:
            current = [None] * len(held)
        for (lease, gen), now_gen in zip(held, current, strict=True):
            with lease.lock:
                if lease.gen == gen and now_gen != gen:
                    lease.tokens, lease.expires = 0, 0.0

    def usage(self, keys: Iterable[ApiKey]) -> list[dict]:
        """Calls used as Redis counts them: calls leased by workers count as used (at most one
        lease per worker more than were made)."""
        items = []
        for key in keys:
            if key.quota is None:
                continue
            period, end = quota_window(key.quota.per, self._wall())
            calls, rows = self._redis.hmget(f"gw:{{q:{key.id}}}:{period}", "calls", "rows")
            items.append({"key": key.name, "period": period, "resets_at": end, "quota": key.quota.to_doc(),
                          "calls_used": int(calls or 0), "rows_used": int(rows or 0)})
        return items

    def hand_back_all(self) -> None:
        """At stop: every lease's leftovers back and every row settled, now."""
        for lease in self._leases.values():
            lease.expires = 0.0
            with self._queue_lock:
                self._rows_due.append(lease)
        self.flush(self._clock())


class _NoHistory(Exception):
    """The run history could not be read, so a quota bucket could not be created."""


def _new_gen() -> str:
    return os.urandom(6).hex()
