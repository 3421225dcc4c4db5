"""The one factory of the fleet's Redis clients: one server, a Redis Cluster, or a master
watched by Sentinel, chosen by the scheme of ``GATEWAY_REDIS_URL``:

    redis://[:password@]host:port[/db]                      one server (rediss:// for TLS)
    redis+cluster://[:password@]host:port[,host:port...]    Redis Cluster; the nodes are seeds
    redis+sentinel://[:password@]host:port[,host:port...]/<master>[/db][?sentinel_password=...]
                                                            the master Sentinel names <master>

(``user:password@`` for an ACL user in each.) The password is the data nodes'; sentinels
that require one of their own get ``sentinel_password``.

What each mode changes for the fleet's code (``leases``, ``bus``, ``events``) is here, so the
callers stay one code path:

* ``client``: commands. Every key of one script shares a hash tag, so a script touches one
  slot and a cluster client routes it by its key; on a node that fails the cluster client
  refreshes its slot map (and retries once), the sentinel client asks the sentinels for
  the master on its next connection. Failures surface as ``redis.RedisError`` to the caller,
  which decides (admission falls back, the bus reconnects).
* ``subscriber``: a plain connection to the server that serves a channel now, for the bus's
  subscription and its pings. Pub/sub keeps order on one connection only, and the bus's
  freshness proof needs the pong after a publish to come after that publish's message, so
  in a cluster the bus uses *sharded* pub/sub (``SPUBLISH`` / ``SSUBSCRIBE``): the
  publish and the subscription meet on the master of the channel's slot, as on one server.
  Plain ``PUBLISH`` would reach every node too, but through the cluster bus, after the
  publisher's reply: a pong could then overtake the message.
* Client-side retries are off for the subscriber (one retry after a slot-map refresh for
  commands): a connection redis-py quietly re-established would resubscribe without the bus
  knowing that messages were missed in between (the bus reloads everything on a reconnect).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry
from redis.sentinel import Sentinel

from .sentinel_watch import SentinelWatch

MODES = {"redis": "single", "rediss": "single", "unix": "single",
         "redis+cluster": "cluster", "redis+sentinel": "sentinel"}


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """What ``GATEWAY_REDIS_URL`` names (see the module docstring)."""

    url: str
    mode: str                              # single | cluster | sentinel
    nodes: tuple[tuple[str, int], ...]     # cluster seeds or sentinels (empty for single)
    username: str | None = None
    password: str | None = None
    db: int = 0
    master: str = ""                       # sentinel: the monitored master's name
    sentinel_password: str | None = None

    @classmethod
    def parse(cls, url: str) -> RedisTarget:
        scheme = url.split("://", 1)[0].lower() if "://" in url else ""
        mode = MODES.get(scheme)
        if mode is None:
            raise ValueError(f"GATEWAY_REDIS_URL: unknown scheme {scheme!r} (redis://, rediss://, "
                             "redis+cluster://, redis+sentinel://)")
        if mode == "single":
            return cls(url, mode, ())
        parts = urlsplit(url)
        netloc = parts.netloc.rsplit("@", 1)
        userinfo, hosts = (netloc[0], netloc[1]) if len(netloc) == 2 else ("", netloc[0])
        username, _, password = userinfo.partition(":")
        nodes = tuple(_host_port(h) for h in hosts.split(",") if h)
        if not nodes:
            raise ValueError(f"GATEWAY_REDIS_URL: {scheme}:// needs at least one host:port")
        path = [p for p in parts.path.split("/") if p]
        query = parse_qs(parts.query)
        master, db = "", 0
        if mode == "sentinel":
            if not path:
                raise ValueError("GATEWAY_REDIS_URL: redis+sentinel:// names the master: .../<master>")
            master, path = unquote(path[0]), path[1:]
        if path:
            db = int(path[0])
        if mode == "cluster" and db:
            raise ValueError("GATEWAY_REDIS_URL: Redis Cluster has database 0 only")
        sentinel_password = query.get("sentinel_password", [None])[0]
        return cls(url, mode, nodes, unquote(username) or None, unquote(password) or None, db, master,
                   sentinel_password)


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host:
        return text, 6379
    return host.strip("[]"), int(port)


class RedisLink:
    """Clients for one ``RedisTarget``: ``client`` for commands, ``subscriber`` for the bus."""

    __slots__ = ("target", "_sentinel", "_watch")

    def __init__(self, url: str) -> None:
        self.target = RedisTarget.parse(url)
        self._sentinel: Sentinel | None = None
        self._watch: SentinelWatch | None = None

    def switches(self) -> int:
        """How many times Sentinel moved the master since this process began watching (0
        for the other modes): a long-lived connection made before a change reconnects."""
        return self._watch.switches if self._watch is not None else 0

    @property
    def mode(self) -> str:
        return self.target.mode

    @property
    def sharded(self) -> bool:
        """Whether the bus publishes and subscribes with sharded pub/sub (cluster)."""
        return self.target.mode == "cluster"

    def _auth(self) -> dict[str, Any]:
        return {"username": self.target.username, "password": self.target.password}

    def client(self, timeout_s: float, connect_timeout_s: float | None = None, register: bool = True,
               **extra: Any) -> Any:
        """A command client (``redis.Redis`` or ``RedisCluster``: the same commands, scripts,
        pipelines without transactions). Sentinel: its connections follow ``+switch-master``
        (``fleet.shared.sentinel_watch``) unless ``register`` is off (a long-lived connection that
        watches ``switches()`` itself)."""
        timeouts: dict[str, Any] = {"socket_timeout": timeout_s,
                                    "socket_connect_timeout": connect_timeout_s or timeout_s}
        target = self.target
        if target.mode == "single":
            return redis.Redis.from_url(target.url, **timeouts, **extra)
        if target.mode == "cluster":
            # require_full_coverage off: while one master fails over, the others' slots serve.
            return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in target.nodes], **self._auth(),
                                require_full_coverage=False, retry=Retry(NoBackoff(), 1), **timeouts, **extra)
        client = self._sentinels(timeout_s).master_for(target.master, db=target.db, **self._auth(), **timeouts,
                                                       **extra)
        if self._watch is None:
            self._watch = SentinelWatch.of(list(target.nodes), target.master, target.sentinel_password)
        if register:
            self._watch.register(client.connection_pool)
        return client

    def _sentinels(self, timeout_s: float) -> Sentinel:
        if self._sentinel is None:
            self._sentinel = Sentinel(list(self.target.nodes), sentinel_kwargs={
                "password": self.target.sentinel_password, "socket_timeout": timeout_s,
                "socket_connect_timeout": timeout_s})
        return self._sentinel

    def subscriber(self, channel: str, timeout_s: float) -> redis.Redis:
        """A plain connection to the server that serves ``channel`` now (a cluster: the
        master of its slot, looked up afresh), with no client-side retry."""
        no_retry: dict[str, Any] = {"retry": Retry(NoBackoff(), 0), "health_check_interval": 0}
        target = self.target
        if target.mode != "cluster":
            return self.client(timeout_s, register=False, **no_retry)
        cluster = self.client(timeout_s)
        try:
            node = cluster.get_node_from_key(channel)
            return redis.Redis(node.host, node.port, **self._auth(), socket_timeout=timeout_s,
                               socket_connect_timeout=timeout_s, **no_retry)
        finally:
            cluster.close()

    def publish(self, pipe: Any, channel: str, message: Any) -> None:
        """Queue a publish on ``pipe`` (a pipeline of ``client``), sharded in a cluster."""
        if self.sharded:
            pipe.spublish(channel, message)
        else:
            pipe.publish(channel, message)

    def subscribe(self, pubsub: Any, channel: str) -> None:
        if self.sharded:
            pubsub.ssubscribe(channel)
        else:
            pubsub.subscribe(channel)


def drop_idle(client: Any) -> None:
    """Close a client's idle pooled connections (after a failure: a stale socket would fail
    once more). Connections in use are left to their threads."""
    if isinstance(client, RedisCluster):
        for node in client.get_nodes():
            if node.redis_connection is not None:
                node.redis_connection.connection_pool.disconnect(inuse_connections=False)
    else:
        client.connection_pool.disconnect(inuse_connections=False)


def listen(link: RedisLink, pubsub: Any, switches: int, stop: Any, ping_s: float, lease_s: float,
           ping: Callable[[Any], float], on_message: Callable[[dict], None],
           on_pong: Callable[[float], None]) -> None:
    """The loop of a bus that must know it heard everything (the catalog's, the cache's).

    Pings every ``ping_s`` (``ping`` writes the heartbeat and pings the subscription, and
    returns when it was sent); a pong hands that time to ``on_pong`` (pub/sub delivers in
    order, so everything published before the ping was handed to ``on_message`` first).
    Raises ``redis.ConnectionError`` whenever a message may have been missed: no pong within
    ``lease_s``, a subscription re-established under us, ended by the server (the slot
    moved), or a Sentinel switch since ``switches`` (read by the caller before it caught up).
    Returns when ``stop`` is set."""
    subscribed = False
    ping_sent: float | None
    ping_sent = last_ping = ping(pubsub)
    while not stop.is_set():
        message = pubsub.get_message(timeout=ping_s)
        if message is not None:
            kind = message["type"]
            if kind in ("message", "smessage"):
                on_message(message)
            elif kind == "pong" and ping_sent is not None:
                on_pong(ping_sent)
                ping_sent = None
            elif kind in ("subscribe", "ssubscribe"):
                if subscribed:   # re-established under us: messages may have been missed
                    raise redis.ConnectionError("the subscription was re-established")
                subscribed = True
            elif kind in ("unsubscribe", "sunsubscribe"):
                raise redis.ConnectionError("the server ended the subscription (the slot moved)")
        if link.switches() != switches:   # Sentinel moved the master
            raise redis.ConnectionError("the master moved")
        now = time.monotonic()
        if ping_sent is not None and now - ping_sent > lease_s:
            raise redis.ConnectionError("no pong within the lease")
        if ping_sent is None and now - last_ping >= ping_s:
            ping_sent = last_ping = ping(pubsub)
