"""The invalidation bus: once a management call returns, no worker anywhere serves the old
state, and no request pays a Redis round trip for it.

Protocol (every key shares the ``{fleet}`` hash tag, so it runs on Redis Cluster too):

1. A management change commits in the store and bumps the store's catalog generation G
   in the same transaction (the store is the truth; Redis only carries it).
2. The management call ``PUBLISH``es G on ``gw:{fleet}:invalidate`` and then waits until
   every live worker has acknowledged a generation >= G, or until that worker's freshness
   lease has run out, whichever is first (bounded by ``GATEWAY_SYNC_TIMEOUT_MS``).
   Concurrent calls share the wait (group commit): in a process one waiting call at a time
   polls the acks (the lowest generation every live worker acknowledged), and each poll
   answers every call waiting there whose G is at or below it.
3. Each worker's bus thread receives G, applies the changes logged since its own
   generation (``gateway.model.catalog.refresh``: only the changed rows; it reads up to the
   store's newest generation, so one pass covers every change committed meanwhile), and
   writes its ack (``HSET gw:{fleet}:acks <worker> G'``, G' >= G the generation it reached;
   a message whose G it already passed and acknowledged costs nothing).
4. Every ``GATEWAY_BUS_PING_MS`` the thread writes its heartbeat (``alive``: Redis time +
   lease) and sends ``PING`` on its subscription. The pong renews the worker's local
   lease to (time the ping was sent + lease). Pub/sub delivers in order, so a pong for a
   ping sent after a publish comes after that publish's message, which the thread applies
   before it reads further: a renewed lease implies every earlier change was applied.
5. The local lease ends no later than the heartbeat Redis holds (it starts before Redis
   receives the heartbeat). A worker whose lease ran out (bus down, thread stuck) stops
   trusting its catalog: each request checks the store's generation first (see
   ``gateway.model.state``) until the bus is back. So step 2 may stop waiting for a worker whose
   heartbeat expired: that worker is already checking the store.
6. Every (re)connect refreshes the catalog before the lease is renewed (the store's change
   log covers what was missed; a full load where it does not reach back that far). A subscription that
   ends or is confirmed a second time (the connection was re-established under it, e.g. by a
   failover) counts as a reconnect.

Redis Cluster and Sentinel (``fleet.shared.redis_client``): the keys share the ``{fleet}`` hash tag
(one slot); in a cluster the change is published with ``SPUBLISH`` and the thread subscribes
with ``SSUBSCRIBE`` on the master of that slot, so the publish, the subscription and the pings
meet on one server and keep the order step 4 relies on. A failover closes the subscription
(the master died, Sentinel kills the demoted master's clients, a cluster node that loses the
slot ends its shard subscriptions): the thread reconnects to the new master within
``min(lease, 0.5 s)`` of it answering, and reloads.

Bounds: a management call waits at most ``min(sync timeout, lease + ping)`` for a silent
worker. When Redis does not take the publish (down, stalled past the client's timeout, full),
the call publishes again until it does, for at most one lease and ping: a worker whose
heartbeats Redis answered around a short stall kept its lease and must still hear the change.
Past that the call returns ``degraded`` (every worker that heard nothing meanwhile has fallen
back to checking the store) and a thread keeps publishing the newest such generation until
Redis takes it.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import redis
import redis.client

from .redis_client import RedisLink, listen

if TYPE_CHECKING:
    from gateway.model.state import CatalogHolder

log = logging.getLogger("fleet.shared.bus")

PREFIX = "gw:{fleet}:"
CHANNEL = PREFIX + "invalidate"
ACKS = PREFIX + "acks"
ALIVE = PREFIX + "alive"
GENERATION = PREFIX + "generation"
# A change Redis did not take is published again: first after REPUBLISH_S, doubling up to
# REPUBLISH_MAX_S (a Redis that is down refuses at once; one that stalls, within its timeout).
REPUBLISH_S = 0.05
REPUBLISH_MAX_S = 0.4

# Heartbeat in Redis time, so every host compares against one clock.
_HEARTBEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local new = redis.call('HSET', KEYS[1], ARGV[1], now + tonumber(ARGV[2]))
local live, alive = 0, redis.call('HVALS', KEYS[1])
for i = 1, #alive do if tonumber(alive[i]) > now then live = live + 1 end end
return {live, new}
"""
# The catalog bus's heartbeat also writes the worker's last ack (ARGV[3]) again if it is gone
# (pruned while the worker was stalled): an ack is written once per generation reached, and a
# message the worker already passed writes none.
_BUS_HEARTBEAT = _HEARTBEAT.replace("local live, alive", "if tonumber(ARGV[3]) > 0 then "
                                    "redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[3]) end\nlocal live, alive", 1)
# The live workers, the lowest generation all of them acknowledged (-1: none is live), and those
# that have not acknowledged ARGV[1] yet (0: none asked); prunes long-dead entries. The shared
# poll of a management call (see RedisBus.announce) and the report of one that timed out.
_ACKS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local alive = redis.call('HGETALL', KEYS[1])
local live, lowest, pending = 0, -1, {}
for i = 1, #alive, 2 do
  local worker, expiry = alive[i], tonumber(alive[i + 1])
  if expiry > now then
    live = live + 1
    local ack = tonumber(redis.call('HGET', KEYS[2], worker) or '0')
    if lowest < 0 or ack < lowest then lowest = ack end
    if ack < tonumber(ARGV[1]) then pending[#pending + 1] = worker end
  elseif expiry < now - 60000 then
    redis.call('HDEL', KEYS[1], worker)
    redis.call('HDEL', KEYS[2], worker)
  end
end
return {live, lowest, pending}
"""


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def client(url: str, timeout_s: float = 0.5) -> redis.Redis:
    return RedisLink(url).client(timeout_s, health_check_interval=0)


class RedisBus:
    """Both sides of the protocol: ``start`` runs the worker's bus thread, ``announce`` is
    what a management call does after its commit."""

    def __init__(self, url: str, lease_ms: int, ping_ms: int, sync_timeout_ms: int) -> None:
        self._link = RedisLink(url)
        self._lease_s = lease_ms / 1000
        self._ping_s = ping_ms / 1000
        self._sync_timeout_s = sync_timeout_ms / 1000
        self._redis = self._link.client(0.5, health_check_interval=0)
        self._heartbeat = self._redis.register_script(_BUS_HEARTBEAT)
        self._acks = self._redis.register_script(_ACKS)
        self._worker = worker_id()
        self._acked = 0            # the generation this worker last acknowledged (bus thread only)
        # The management side's shared wait: the lowest generation every live worker had
        # acknowledged at the last poll, and whether a waiting call is polling now.
        self._waits = threading.Condition(threading.Lock())
        self._all_acked = 0
        self._polled_at = 0.0      # when that poll started (time.monotonic())
        self._live_seen = 0
        self._polling = False
        self._behind = 0           # a generation Redis did not take, published again by a thread
        self._behind_thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._holder: CatalogHolder | None = None
        self.connected = False
        self.live_workers = 0      # seen on the last heartbeat (0: not yet); admission's headroom and shares
        self._beaten = False
        # Called (on the bus thread) when a heartbeat finds this worker's entry gone from Redis.
        self.redis_lost_data: Callable[[], None] | None = None

    # --- worker side -------------------------------------------------------------------
    def start(self, holder: CatalogHolder) -> None:
        self._holder = holder
        self._thread = threading.Thread(target=self._run, args=(holder,), name="gateway-bus", daemon=True)
        self._thread.start()

    def _run(self, holder: CatalogHolder) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            try:
                self._serve(holder)
                backoff = 0.05
            except (redis.RedisError, OSError) as exc:
                if self.connected:
                    log.warning("bus: lost Redis (%s); checking the store per request until it is back", exc)
                self.connected = False
            except Exception:  # a failed reload (store down): retry, never die
                log.exception("bus: reload failed")
                self.connected = False
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, 0.5)

    def _serve(self, holder: CatalogHolder) -> None:
        pubsub = self._link.subscriber(CHANNEL, max(self._ping_s * 2, 0.5)).pubsub()
        try:
            self._link.subscribe(pubsub, CHANNEL)
            switches = self._link.switches()
            # A refresh on every (re)connect: anything published while away is covered (the
            # store's change log, or a full load when the log does not reach back that far).
            # Acknowledged whatever was acknowledged before: Redis may have lost the ack.
            self._acknowledge(holder.reload(), always=True)
            if not self.connected:
                log.info("bus: connected, catalog at generation %d", holder.catalog.generation)
            self.connected = True
            listen(self._link, pubsub, switches, self._stop, self._ping_s, self._lease_s, self._ping,
                   on_message=lambda message: self._acknowledge(holder.reload(at_least=int(message["data"]))),
                   on_pong=lambda sent: holder.renew(sent + self._lease_s))
        finally:
            if not self._stop.is_set():
                holder.distrust()
            pubsub.close()

    def _ping(self, pubsub: redis.client.PubSub) -> float:
        sent = time.monotonic()
        live, new = self._heartbeat(keys=[ALIVE, ACKS], args=[self._worker, int(self._lease_s * 1000), self._acked])
        self.live_workers = int(live)
        if new and self._beaten and self.redis_lost_data is not None:
            # Our own entry was gone: Redis lost its data (a restart without persistence, a
            # failover to a replica that never had it) since the last beat.
            self.redis_lost_data()
        self._beaten = True
        pubsub.ping()
        return sent

    def _acknowledge(self, generation: int, always: bool = False) -> None:
        # Concurrent changes arrive as a burst of messages; the first one's refresh reaches
        # past most of them, and the rest need no second write of the same ack.
        if always or generation > self._acked:
            self._redis.hset(ACKS, self._worker, generation)
            self._acked = generation

    # --- management side ---------------------------------------------------------------
    def announce(self, generation: int) -> dict:
        try:
            return self._announce(generation)
        finally:
            self._caught_up(generation)

    def _caught_up(self, generation: int) -> None:
        """The worker that made a change serves it when its call returns, whatever the fleet's
        acknowledgements said: its own bus thread may have been starved past the sync timeout
        (seen on a loaded CI machine: a key created through a worker, then 401 from it)."""
        if self._holder is None:
            return
        try:
            self._holder.reload(at_least=generation)
        except Exception as exc:   # the store went away after the commit: the bus thread catches up
            log.warning("bus: generation %d not loaded by the worker that made it (%s)", generation, exc)

    def _announce(self, generation: int) -> dict:
        started = time.monotonic()
        if not self._publish(generation):
            # Nobody was told. Waiting out one lease is not enough: a worker whose heartbeats Redis
            # answered before and after a short stall keeps its lease, and would serve the old
            # catalog (a revoked key) until the next change. So the change is published again
            # until Redis takes it; past one lease, by a thread behind the call (a worker that
            # heard nothing meanwhile has stopped trusting its catalog by then).
            log.warning("bus: cannot publish generation %d; publishing it again", generation)
            if not self._publish_until(generation, started + self._lease_s + self._ping_s):
                self._publish_behind(generation)
                return {"workers": None, "waited_ms": (time.monotonic() - started) * 1000, "degraded": True}
        published = time.monotonic()
        deadline = published + self._sync_timeout_s
        try:
            live = self._wait_acks(generation, published, deadline)
            pending: list = [] if live is not None else self._acks(keys=[ALIVE, ACKS], args=[generation])[2]
        except redis.RedisError:
            time.sleep(self._lease_s + self._ping_s)
            return {"workers": None, "waited_ms": (time.monotonic() - started) * 1000, "degraded": True}
        return {"workers": self._live_seen if live is None else live, "pending": [p.decode() for p in pending],
                "waited_ms": (time.monotonic() - started) * 1000}

    def _publish(self, generation: int) -> bool:
        """One try: the generation set and published; whether Redis took it."""
        try:
            pipe = self._redis.pipeline(transaction=False)
            pipe.set(GENERATION, generation)
            self._link.publish(pipe, CHANNEL, generation)
            pipe.execute()
            return True
        except redis.RedisError:
            return False

    def _publish_until(self, generation: int, deadline: float) -> bool:
        delay = REPUBLISH_S
        while time.monotonic() + delay < deadline:
            time.sleep(delay)
            if self._publish(generation):
                return True
            delay = min(delay * 2, REPUBLISH_MAX_S)
        return False

    def _publish_behind(self, generation: int) -> None:
        """Publish the newest generation not yet published again, on one thread, until Redis
        takes it (an older one is covered by a newer: a worker reloads up to the store's newest)."""
        with self._waits:
            self._behind = max(self._behind, generation)
            if self._behind_thread is not None:
                return
            self._behind_thread = threading.Thread(target=self._run_behind, name="gateway-bus-republish",
                                                   daemon=True)
            self._behind_thread.start()

    def _run_behind(self) -> None:
        while not self._stop.wait(REPUBLISH_MAX_S):
            with self._waits:
                generation = self._behind
            if self._publish(generation):
                log.info("bus: generation %d published after Redis came back", generation)
                with self._waits:
                    if self._behind == generation:
                        self._behind_thread = None
                        return

    def _wait_acks(self, generation: int, published: float, deadline: float) -> int | None:
        """Wait until every live worker acknowledged ``generation`` or a later one; the live
        workers then, or None at the deadline. Calls waiting at once in this process share
        the polls: one of them polls (every 1 ms at most), the others wait on the condition
        and each poll wakes them; a call whose generation is covered returns, and when the
        poller's own is covered another waiting call takes over the polling.

        A call trusts only a poll that started after its own publish (``published``), as if
        it had polled itself: a worker left out of an earlier poll (its heartbeat had run
        out) may since have renewed its lease by a ping sent before this publish, without
        this change; a later poll sees it live and waits for its ack."""
        with self._waits:
            while True:
                if self._polled_at > published and self._all_acked >= generation:
                    return self._live_seen
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                if not self._polling:
                    self._polling = True
                    break
                self._waits.wait(left)
        try:
            delay = 0.0005
            while True:
                polled_at = time.monotonic()
                live, lowest, _ = self._acks(keys=[ALIVE, ACKS], args=[0])
                if lowest < 0:   # no live worker: none serves the old state
                    lowest = generation
                with self._waits:
                    self._live_seen, self._all_acked, self._polled_at = live, lowest, polled_at
                    self._waits.notify_all()
                if lowest >= generation:
                    return live
                if time.monotonic() >= deadline:
                    return None
                time.sleep(delay)
                delay = min(delay * 2, 0.001)   # a 1 ms poll: coarser steps would add to the tail
        finally:
            with self._waits:
                self._polling = False
                self._waits.notify_all()

    def ready(self) -> bool:
        try:
            # A keyed command: in a cluster it asks the master of the bus's slot (a PING
            # would ask every node, and fail while any one of them fails over).
            self._redis.exists(ALIVE)
            return True
        except redis.RedisError:
            return False

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        try:
            self._redis.hdel(ALIVE, self._worker)
            self._redis.hdel(ACKS, self._worker)
        except redis.RedisError:
            pass
