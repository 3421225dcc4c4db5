"""Follow Sentinel's ``+switch-master`` so that no connection outlives its master's role.

A client asks the sentinels for the master only when it opens a connection. After a
failover the connections already open stay on the old master; when that master is alive
(``SENTINEL FAILOVER``, a partition that heals) it keeps accepting writes until Sentinel
reconfigures it, which it does only after seeing it report the wrong role for a while
(measured here: about 10 s). Writes of those seconds (heartbeats, leases, rows) are lost
when it becomes a replica, and part of the fleet works on each master meanwhile.

One watcher per worker process and URL: a thread subscribed to ``+switch-master`` on one
sentinel (the next one when it fails) that, for its master's name, closes the idle
connections of the command pools registered with it and marks those in use to close when
their command returns (never under a thread using them), so the next command connects
through the sentinels to the new master. Long-lived connections (the bus's subscription, an
events reader) poll ``switches`` instead and reconnect themselves. On every (re)subscription
the watcher also compares the master the sentinels name with the last one it knew, so a
switch announced while it was away is not missed.
"""
from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any

import redis

log = logging.getLogger("fleet.sentinel")

_WATCHES: dict[tuple[int, str], SentinelWatch] = {}
_WATCHES_LOCK = threading.Lock()


class SentinelWatch:
    __slots__ = ("_sentinels", "_master", "_password", "_pools", "_lock", "_known", "switches", "__weakref__")

    def __init__(self, sentinels: list[tuple[str, int]], master: str, password: str | None) -> None:
        self._sentinels = sentinels
        self._master = master
        self._password = password
        self._pools: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._known: tuple[str, int] | None = None
        self.switches = 0
        threading.Thread(target=self._run, name="gateway-sentinel-watch", daemon=True).start()

    @classmethod
    def of(cls, sentinels: list[tuple[str, int]], master: str, password: str | None) -> SentinelWatch:
        """This process's watcher of ``master`` (a forked worker makes its own)."""
        key = (os.getpid(), f"{master}@{sentinels}")
        with _WATCHES_LOCK:
            watch = _WATCHES.get(key)
            if watch is None:
                watch = _WATCHES[key] = cls(sentinels, master, password)
            return watch

    def register(self, pool: Any) -> None:
        with self._lock:
            self._pools.add(pool)

    def _switched(self, to: tuple[str, int]) -> None:
        with self._lock:
            before, self._known = self._known, to
            if before is None or before == to:
                return
            self.switches += 1
            pools = list(self._pools)
        log.warning("sentinel: master %s moved from %s:%d to %s:%d; closing the connections to the old one",
                    self._master, *before, *to)
        for pool in pools:
            try:
                pool.update_active_connections_for_reconnect()   # closed when released
                pool.disconnect_free_connections()
            except Exception:   # a pool being closed by its owner meanwhile
                log.debug("sentinel: closing a pool failed", exc_info=True)

    def _run(self) -> None:
        index = 0
        while True:
            host, port = self._sentinels[index % len(self._sentinels)]
            index += 1
            client = redis.Redis(host, port, password=self._password, socket_timeout=5, socket_connect_timeout=1,
                                 health_check_interval=0)
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe("+switch-master")
                address: Any = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self._master)
                if address:
                    host_now = address[0].decode() if isinstance(address[0], bytes) else str(address[0])
                    self._switched((host_now, int(address[1])))
                while True:
                    message = pubsub.get_message(timeout=5)
                    if message is None:
                        continue
                    name, _, _, new_host, new_port = message["data"].decode().split()
                    if name == self._master:
                        self._switched((new_host, int(new_port)))
            except (redis.RedisError, OSError, ValueError):
                threading.Event().wait(0.5)
            finally:
                pubsub.close()
                client.close()
