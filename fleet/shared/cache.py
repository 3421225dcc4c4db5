"""The cache's fleet side: an acknowledged purge bus (``RedisCacheSync``) and the shared
tier (``RedisSharedTier``), both in Redis under the ``{fleet}`` hash tag.

The bus is the catalog bus's protocol (``fleet.shared.bus``) on its own channel and its own
sequence, so a purge does not bump the catalog's generation nor make anyone reload:

1. ``announce`` takes the next number of ``gw:{fleet}:cache:seq``, publishes the purge with
   it on ``gw:{fleet}:cache``, then waits until every live worker has acknowledged it
   (``gw:{fleet}:cache:acks``), or that worker's heartbeat (``gw:{fleet}:cache:alive``) ran
   out, or the timeout passed.
2. Each worker's cache thread applies a purge to its memory, then acknowledges its number.
3. The thread pings every ``GATEWAY_BUS_PING_MS``; the pong renews this worker's freshness
   lease (``GATEWAY_FRESHNESS_LEASE_MS``). Pub/sub delivers in order, so a renewed lease means
   every purge published before the ping was applied. A worker whose lease ran out serves no
   entry from memory (``fresh()``) until the thread is back, and a (re)connect empties memory
   first: a purge published while it was away cannot be missed.

The shared tier holds entries (``...:e:<digest>``, expiring with their TTL) and index sets
(by query, by table, by database for entries that read through views or functions). A purge
moves ``...:gen`` to a value it never held (Redis's clock in milliseconds, or one past) and
deletes what the indexes name in one script; a fill stores its entry only if ``gen`` is still
what it was when the fill began, so an answer read before a purge cannot be stored after it,
even across a restart of Redis that lost ``gen``.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING

import orjson
import redis
import redis.client

from gateway.cache.entry import seal, unseal

from .bus import _ACKS, _HEARTBEAT, worker_id
from .redis_client import RedisLink, listen

if TYPE_CHECKING:
    from gateway.cache.entry import Entry
    from gateway.cache.memory import MemoryCache, Purge

log = logging.getLogger("fleet.shared.cache")

PREFIX = "gw:{fleet}:cache:"
CHANNEL = "gw:{fleet}:cache"
SEQ = PREFIX + "seq"
ACKS = PREFIX + "acks"
ALIVE = PREFIX + "alive"
GEN = PREFIX + "gen"
INDEXES = PREFIX + "indexes"      # every index set, so a purge of everything finds them

# KEYS: gen, indexes. ARGV: prefix, op, then the op's arguments. Every key shares {fleet}.
# The generation moves to Redis's clock in milliseconds (or one past where it was): a value it
# never held before, even after a restart without persistence lost it. Counted from 0 again, it
# would come back to the value a fill in flight took before the restart, and that fill's older
# answer would be stored after a purge made since.
_PURGE = """
local p = ARGV[1]
local op = ARGV[2]
local t = redis.call('TIME')
local gen = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held = tonumber(redis.call('GET', KEYS[1]) or '0')
if gen <= held then gen = held + 1 end
redis.call('SET', KEYS[1], string.format('%d', gen))
local sets = {}
local dropped = 0
if op == 'all' then
  sets = redis.call('SMEMBERS', KEYS[2])
elseif op == 'query' then
  sets = {p .. 'q:' .. ARGV[3]}
elseif op == 'db' then
  sets = {p .. 'd:' .. ARGV[3]}
elseif op == 'key' then
  dropped = redis.call('DEL', p .. 'e:' .. ARGV[3])
  return dropped
elseif op == 'tables' then
  sets = {p .. 'w:' .. ARGV[3]}
  for i = 4, #ARGV do sets[#sets + 1] = p .. 't:' .. ARGV[3] .. '|' .. ARGV[i] end
end
for _, s in ipairs(sets) do
  local members = redis.call('SMEMBERS', s)
  for _, e in ipairs(members) do dropped = dropped + redis.call('DEL', p .. 'e:' .. e) end
  redis.call('DEL', s)
  redis.call('SREM', KEYS[2], s)
end
return dropped
"""
# KEYS: gen, indexes. ARGV: prefix, gen at the fill's start, digest, value, ttl ms, index sets...
_PUT = """
if redis.call('GET', KEYS[1]) ~= ARGV[2] then return 0 end
local p = ARGV[1]
local ttl = tonumber(ARGV[5])
redis.call('SET', p .. 'e:' .. ARGV[3], ARGV[4], 'PX', ttl)
for i = 6, #ARGV do
  local s = p .. ARGV[i]
  redis.call('SADD', s, ARGV[3])
  if redis.call('PTTL', s) < ttl then redis.call('PEXPIRE', s, ttl) end
  redis.call('SADD', KEYS[2], s)
end
return 1
"""


class RedisSharedTier:
    """Entries shared by every worker of the fleet. Redis away: a miss, nothing stored."""

    def __init__(self, url: str, secret: bytes, timeout_s: float = 0.25) -> None:
        self._redis = RedisLink(url).client(timeout_s, health_check_interval=0)
        self._secret = secret
        self._put = self._redis.register_script(_PUT)
        self._purge = self._redis.register_script(_PURGE)
        self.fills = 0
        self.errors = 0
        self._down_until = 0.0    # after an error, Redis is not asked for a second: a miss costs no timeout

    def _failed(self) -> None:
        self.errors += 1
        self._down_until = time.monotonic() + 1.0

    def get(self, digest: str) -> tuple[Entry | None, object | None]:
        if time.monotonic() < self._down_until:
            return None, None
        try:
            raw, gen = self._redis.mget(PREFIX + "e:" + digest, GEN)   # bytes (no decode_responses)
        except redis.RedisError:
            self._failed()
            return None, None
        token = gen or b"0"
        if raw is None:
            return None, token
        entry = unseal(digest, raw, self._secret, time.time(), time.monotonic())
        if entry is not None:
            self.fills += 1
        return entry, token

    def put(self, entry: Entry, token: object) -> None:
        ttl_ms = int((entry.expires - time.time()) * 1000)
        if ttl_ms <= 0:
            return
        indexes = ["q:" + entry.query, "d:" + entry.db]
        indexes += ["w:" + entry.db] if entry.wildcard else [f"t:{entry.db}|{t}" for t in sorted(entry.tables)]
        try:
            if token == b"0":   # nothing purged yet: the key may not exist (GET answers nil, not "0")
                self._redis.setnx(GEN, 0)
            args: list = [PREFIX, token, entry.digest, seal(entry, self._secret), ttl_ms, *indexes]
            self._put(keys=[GEN, INDEXES], args=args)
        except redis.RedisError:
            self._failed()

    def purge(self, purge: Purge) -> None:
        """Raises ``redis.RedisError`` when Redis cannot be reached (the caller decides)."""
        op = purge["op"]
        args: list = [PREFIX, op]
        if op == "query":
            args.append(purge["name"])
        elif op == "db":
            args.append(purge["db"])
        elif op == "key":
            args.append(purge["key"])
        elif op == "tables":
            args += [purge["db"], *purge["tables"]]
        self._purge(keys=[GEN, INDEXES], args=args)

    def entries(self, limit: int) -> list[dict]:
        items: list[dict] = []
        try:
            for key in self._redis.scan_iter(match=PREFIX + "e:*", count=500):
                if len(items) >= limit:
                    break
                raw = self._redis.get(key)
                digest = key.decode()[len(PREFIX) + 2:]
                entry = unseal(digest, raw, self._secret, time.time(), time.monotonic()) if raw else None
                if entry is not None:
                    items.append(entry.doc(time.time(), "", tier="shared"))
        except redis.RedisError:
            self.errors += 1
        return items


class RedisCacheSync:
    """Both sides of the purge bus: ``start`` runs the worker's thread, ``announce`` purges."""

    def __init__(self, url: str, lease_ms: int, ping_ms: int, sync_timeout_ms: int,
                 shared: RedisSharedTier | None = None) -> None:
        self._link = RedisLink(url)
        self._shared = shared
        self._served = False
        self._lease_s = lease_ms / 1000
        self._ping_s = ping_ms / 1000
        self._sync_timeout_s = sync_timeout_ms / 1000
        # A worker's lease renewed by a pong to a ping sent just before a purge failed to publish.
        self.away_s = self._lease_s + self._ping_s
        self._redis = self._link.client(0.5, health_check_interval=0)
        self._heartbeat = self._redis.register_script(_HEARTBEAT)
        self._acks = self._redis.register_script(_ACKS)
        # One per cache (not per process): apps in one process (tests) must not ack for each other.
        self._worker = f"{worker_id()}/{os.urandom(3).hex()}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fresh_until = 0.0
        self.connected = False
        self.applied = 0     # purges applied by this worker's thread

    def fresh(self) -> bool:
        return time.monotonic() < self._fresh_until

    # --- worker side -------------------------------------------------------------------
    def start(self, memory: MemoryCache) -> None:
        self._thread = threading.Thread(target=self._run, args=(memory,), name="gateway-cache-bus", daemon=True)
        self._thread.start()

    def _run(self, memory: MemoryCache) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            try:
                self._serve(memory)
                backoff = 0.05
            except (redis.RedisError, OSError) as exc:
                if self.connected:
                    log.warning("cache bus: lost Redis (%s); no cached answer from memory until it is back", exc)
                self.connected = False
            except Exception:
                log.exception("cache bus: failed")
                self.connected = False
            self._fresh_until = 0.0
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, 0.5)

    def _serve(self, memory: MemoryCache) -> None:
        # The catalog bus's way (fleet.shared.bus): sharded pub/sub in a cluster, on the master of the slot.
        pubsub = self._link.subscriber(CHANNEL, max(self._ping_s * 2, 0.5)).pubsub()
        try:
            self._link.subscribe(pubsub, CHANNEL)
            switches = self._link.switches()
            # Subscribed: whatever is published from now on arrives. Anything before may have
            # been missed while away, so memory starts empty, and everything up to now is acknowledged.
            memory.clear()
            if self._served and self._shared is not None:
                # Back after an outage: a purge made meanwhile could not reach the shared tier.
                self._shared.purge({"op": "all"})
            self._served = True
            self._acknowledge(int(self._redis.get(SEQ) or 0))
            self.connected = True
            listen(self._link, pubsub, switches, self._stop, self._ping_s, self._lease_s, self._ping,
                   on_message=lambda message: self._apply(memory, orjson.loads(message["data"])),
                   on_pong=self._renew)
        finally:
            self._fresh_until = 0.0
            pubsub.close()

    def _apply(self, memory: MemoryCache, doc: dict) -> None:
        memory.apply(doc["purge"])
        self.applied += 1
        self._acknowledge(int(doc["seq"]))

    def _renew(self, ping_sent: float) -> None:
        self._fresh_until = ping_sent + self._lease_s

    def _ping(self, pubsub: redis.client.PubSub) -> float:
        sent = time.monotonic()
        self._heartbeat(keys=[ALIVE], args=[self._worker, int(self._lease_s * 1000)])
        pubsub.ping()
        return sent

    def _acknowledge(self, seq: int) -> None:
        self._redis.hset(ACKS, self._worker, seq)

    # --- the side that purges --------------------------------------------------------------
    def announce(self, purge: Purge, timeout_s: float | None = None) -> dict:
        started = time.monotonic()
        wait_s = self._sync_timeout_s if timeout_s is None else min(timeout_s, self._sync_timeout_s)
        try:
            seq = int(self._redis.incr(SEQ))
            pipe = self._redis.pipeline(transaction=False)
            self._link.publish(pipe, CHANNEL, orjson.dumps({"seq": seq, "purge": purge}))
            pipe.execute()
        except redis.RedisError as exc:
            # Nobody can be told: the caller tries again until it is, or for ``away_s``
            # (gateway.cache.service), so every worker has either applied it or stopped serving
            # from memory by then.
            log.warning("cache bus: cannot publish a purge (%s)", exc)
            return {"workers": None, "waited_ms": (time.monotonic() - started) * 1000, "degraded": True}
        deadline = started + wait_s
        delay = 0.0005
        while True:
            try:
                live, _, pending = self._acks(keys=[ALIVE, ACKS], args=[seq])
            except redis.RedisError:
                return {"workers": None, "waited_ms": (time.monotonic() - started) * 1000, "degraded": True}
            if not pending or time.monotonic() >= deadline:
                return {"workers": live, "pending": [p.decode() for p in pending], "seq": seq,
                        "waited_ms": (time.monotonic() - started) * 1000}
            time.sleep(delay)
            delay = min(delay * 2, 0.001)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        try:
            self._redis.hdel(ALIVE, self._worker)
            self._redis.hdel(ACKS, self._worker)
        except redis.RedisError:
            pass
