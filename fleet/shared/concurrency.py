"""A key's ``max_concurrent``, fleet-wide: how many of its calls run at once, from admission until
the answer is sent (a stream: until its last row), counted across every worker of every host,
as QueryAPIGate counts it across its instances (its ``limits.py``), and with its answer:
429 ``too_many_concurrent``, ``Retry-After: 1``, ``retry_after`` and ``max_concurrent`` in the body.

Fleet-wide rather than per worker because the number is the user's: "4 at once" must not mean
4 per worker (a fleet of 16 workers would run 64), and a per-worker share (4/16) refuses a key's
second call whenever the balancer puts two on one worker.

How: one sorted set per key in Redis (``gw:{mc:<key id>}``), a member per running call (a random
token) scored by when its lease ends (Redis server time). ``enter`` is one script: drop the
expired members, count, add one if under the limit. ``leave`` removes the member (ZREM). A
thread of each worker renews the leases of the places it holds every third of
``GATEWAY_CONCURRENCY_LEASE_MS`` (L, 10 s by default), one script per key; a renewal re-adds a
member Redis no longer holds (data lost, or a lease that ran out while its call still runs), so
the set comes back to the calls really running. Cost: two Redis round trips per call, for keys
with ``max_concurrent`` only (a key without one costs one attribute test); it cannot be leased
in advance as tokens are (``fleet.shared.leases``): a place kept idle by one worker would refuse
another worker's call while the key runs fewer than its limit.

Bounds (N = the key's ``max_concurrent``, W = live workers last seen on the bus):

* Redis up and every worker renewing: **at most N calls of a key run at once**, fleet-wide.
* A worker killed (SIGKILL, OOM) holding places: they are freed **within L of its last renewal**,
  so at most L after the kill; until then the key runs that many fewer. A worker stalled past L
  (no renewal) loses its places: another call may take them, and the renewal that follows
  re-adds them, so for that while up to N + (the stalled worker's places) run.
* ``enter`` timing out after Redis ran it: a place nobody renews, freed within L.
* Redis unreachable (``GATEWAY_REDIS_FAILURE``): ``open``: each worker counts its own calls of the
  key against its share, max(1, N // W), so at most max(N, W) new calls at once fleet-wide, plus
  the calls admitted through Redis before the outage that still run; places taken locally are
  given back locally. ``closed``: 503 ``admission_unavailable``. Redis is tried again every 250 ms.
* Redis lost its data: the running calls' places come back with their next renewal (within L/3);
  until then up to N more may be admitted.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import redis

from gateway.errors import GatewayError
from gateway.ports import Clock, too_many_concurrent

from .degraded import DegradedLog
from .redis_client import drop_idle

if TYPE_CHECKING:
    from gateway.model.catalog import ApiKey

log = logging.getLogger("fleet.shared.concurrency")
RETRY_S = 0.25      # Redis unreachable: decided locally this long before it is tried again

# KEYS[1]: the key's set. ARGV: max_concurrent, token, lease ms. Returns 1 (entered) or 0 (full).
_ENTER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) + 60000)
return 1
"""

# KEYS[1]: the key's set. ARGV: lease ms, tokens... (re-added when missing: see the module's doc).
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ends = now + tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], ends, ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]) + 60000)
return #ARGV - 1
"""


def bucket(key_id: int) -> str:
    return f"gw:{{mc:{key_id}}}"


class Place:
    """One running call's place: a member of the key's set, or one counted by this worker alone."""

    __slots__ = ("bucket", "token", "key_id", "local")

    def __init__(self, key_id: int, token: str, local: bool) -> None:
        self.key_id = key_id
        self.bucket = bucket(key_id)
        self.token = token
        self.local = local


class RunningCalls:
    def __init__(self, client: redis.Redis, lease_ms: int, closed_on_failure: bool,
                 workers_hint: Callable[[], int], degraded: DegradedLog, clock: Clock = time.monotonic) -> None:
        self._redis = client
        self._enter = client.register_script(_ENTER)
        self._renew = client.register_script(_RENEW)
        self._lease_ms = lease_ms
        self._closed_on_failure = closed_on_failure
        self._workers_hint = workers_hint
        self._degraded = degraded
        self._clock = clock
        self._lock = threading.Lock()
        self._held: dict[str, Place] = {}     # token -> place held in Redis (renewed)
        self._local: dict[int, int] = {}      # key id -> places taken locally (Redis unreachable)
        self._down_until = 0.0
        self.fallbacks = 0
        self.renewals = 0
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew_loop, name="gateway-concurrency", daemon=True)
        self._renewer.start()

    def enter(self, key: ApiKey) -> Place:
        maximum = key.max_concurrent or 0
        if self._clock() >= self._down_until:
            place = Place(key.id, os.urandom(9).hex(), False)
            with self._lock:    # renewed from the start: the script may run and its answer be lost
                self._held[place.token] = place
            try:
                entered = self._enter(keys=[place.bucket], args=[maximum, place.token, self._lease_ms])
            except redis.RedisError as exc:
                with self._lock:
                    self._held.pop(place.token, None)
                self._failed(exc)
            else:
                if self._degraded.degraded:
                    self._degraded.succeeded()
                if entered:
                    return place
                with self._lock:
                    self._held.pop(place.token, None)
                raise too_many_concurrent(maximum)
        return self._enter_locally(key.id, maximum)

    def _enter_locally(self, key_id: int, maximum: int) -> Place:
        self.fallbacks += 1
        if self._closed_on_failure:
            self._degraded.refused += 1
            raise GatewayError(503, "admission_unavailable", "shared limits are unreachable; retry shortly",
                               headers={"Retry-After": "1"})
        share = max(1, maximum // max(1, self._workers_hint()))
        with self._lock:
            running = self._local.get(key_id, 0)
            if running < share:
                self._local[key_id] = running + 1
        if running >= share:
            self._degraded.refused += 1
            raise too_many_concurrent(maximum)
        self._degraded.admitted += 1
        return Place(key_id, "", True)

    def leave(self, place: Place) -> None:
        if place.local:
            with self._lock:
                left = self._local.get(place.key_id, 0) - 1
                if left > 0:
                    self._local[place.key_id] = left
                else:
                    self._local.pop(place.key_id, None)
            return
        with self._lock:
            self._held.pop(place.token, None)
        if self._clock() < self._down_until:
            return      # its lease frees it (no timeout paid per call while Redis is away)
        try:
            self._redis.zrem(place.bucket, place.token)
        except redis.RedisError as exc:   # its lease frees it
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        drop_idle(self._redis)
        self._degraded.failed(exc)
        self._down_until = self._clock() + RETRY_S

    # --- the renewing thread ----------------------------------------------------------------
    def renew(self) -> None:
        """Every held place's lease, one script per key."""
        with self._lock:
            by_bucket: dict[str, list[str]] = {}
            for token, place in self._held.items():
                by_bucket.setdefault(place.bucket, []).append(token)
        for name, tokens in by_bucket.items():
            self._renew(keys=[name], args=[self._lease_ms, *tokens])
            self.renewals += 1

    def _renew_loop(self) -> None:
        while not self._stop.wait(self._lease_ms / 3000):
            try:
                self.renew()
            except redis.RedisError as exc:
                self._failed(exc)
            except Exception:   # a bug must not end the renewals (places would then run out)
                log.exception("renewing max_concurrent places failed")

    def close(self) -> None:
        self._stop.set()
        self._renewer.join(1)
