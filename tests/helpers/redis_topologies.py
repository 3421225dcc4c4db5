"""Distributed Redis for tests: a Redis Cluster (three masters, each with a replica) and a
Sentinel group (a master, a replica, three sentinels), every server a child process of the
test (its own process session), bound to 127.0.0.1, password-protected, no persistence.

Ports: free ones (``helpers.ports``), each node's cluster bus port too (named in its
configuration: the default, port + 10000, could be anything). ``GATEWAY_TEST_TOPOLOGY_PORT``
fixes a base instead, for a serial run: a cluster then uses ``base``..``base+5`` and its bus
``base+50``..; a sentinel group ``base+10``..``base+14``.

Both are configured to fail over fast (a node is down after 1 s), so a test measures the
fleet, not Redis's patience: the cluster with ``cluster-require-full-coverage no`` (the
other masters keep serving their slots while one fails over) and
``cluster-replica-validity-factor 0`` (a replica that lagged is still promoted: what the
quota rebuild is for).
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import redis
from redis.cluster import RedisCluster, key_slot
from redis.sentinel import Sentinel

from fleet.ops.local import find_redis_server
from helpers.ports import free_ports
from helpers.procs import wait_gone
from helpers.services import fixed_port

CLUSTER_BUS_OFFSET = 50
NODE_TIMEOUT_MS = 1000


class RedisNode:
    """One ``redis-server`` (or ``redis-server --sentinel``) in the foreground, our child."""

    def __init__(self, home: Path, port: int, password: str, lines: list[str], sentinel: bool = False):
        self.home = home / str(port)
        self.port = port
        self.password = password
        self.lines = lines
        self.sentinel = sentinel
        self.proc: subprocess.Popen | None = None

    @property
    def name(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> RedisNode:
        self.home.mkdir(parents=True, exist_ok=True)
        conf = self.home / ("sentinel.conf" if self.sentinel else "redis.conf")
        base = ["bind 127.0.0.1", f"port {self.port}", "protected-mode yes", f'dir "{self.home}"',
                f'logfile "{self.home / "server.log"}"']
        if not self.sentinel:
            base += ['save ""', "appendonly no", f"requirepass {self.password}", f"masterauth {self.password}",
                     "repl-diskless-sync-delay 0"]   # a replica's first sync at once, not after 5 s
        conf.write_text("".join(f"{line}\n" for line in base + self.lines))
        conf.chmod(0o600)
        args = [find_redis_server(), str(conf)] + (["--sentinel"] if self.sentinel else [])
        self.proc = subprocess.Popen(args, cwd=self.home, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 10
        while not self.answers():
            assert self.proc.poll() is None, f"redis on {self.port} exited:\n{self.log_tail()}"
            assert time.monotonic() < deadline, f"redis on {self.port} did not come up:\n{self.log_tail()}"
            time.sleep(0.05)
        return self

    def client(self, timeout: float = 2.0) -> redis.Redis:
        return redis.Redis("127.0.0.1", self.port, password=None if self.sentinel else self.password,
                           socket_timeout=timeout, socket_connect_timeout=timeout)

    def answers(self) -> bool:
        client = self.client(0.5)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def detach(self, master: RedisNode) -> None:
        """A replica that lags from now on: stopped (SIGSTOP), then its link cut on the
        master's side, so what the master writes meanwhile never reaches it. (SIGSTOP alone
        is no lag: the stream waits in the socket's buffers.) SIGCONT resumes it."""
        self.signal(signal.SIGSTOP)
        client = master.client()
        try:
            client.execute_command("CLIENT", "KILL", "TYPE", "replica")
        finally:
            client.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL: no persistence, so whatever it held is gone."""
        if self.alive():
            self.signal(signal.SIGKILL)
            assert wait_gone(self.proc.pid, 10), f"redis on {self.port} survived SIGKILL"
            self.proc.wait(5)

    def stop(self) -> None:
        if self.alive():
            self.signal(signal.SIGCONT)   # a test may have left it stopped
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join((self.home / "server.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def wait_synced(replica: RedisNode, timeout_s: float) -> None:
    """Until ``replica``'s link to its master is up (its first sync done)."""
    deadline = time.monotonic() + timeout_s
    while True:
        client = replica.client()
        try:
            if client.info("replication").get("master_link_status") == "up":
                return
        except redis.RedisError:
            pass
        finally:
            client.close()
        assert time.monotonic() < deadline, f"{replica.name} did not sync"
        time.sleep(0.05)


class Cluster:
    """Three masters and three replicas (``redis-cli --cluster create --cluster-replicas 1``);
    ``url``: ``redis+cluster://`` with every master as a seed."""

    def __init__(self, home: Path, base_port: int | None = None):
        base_port = base_port or fixed_port("topology")
        ports, buses = ([base_port + i for i in range(6)], [base_port + i + CLUSTER_BUS_OFFSET for i in range(6)]) \
            if base_port else (free_ports(6), free_ports(6))
        self.password = uuid.uuid4().hex
        lines = ["cluster-enabled yes", f"cluster-node-timeout {NODE_TIMEOUT_MS}",
                 "cluster-require-full-coverage no", "cluster-replica-validity-factor 0",
                 "cluster-allow-replica-migration no"]
        self.nodes = [RedisNode(home, port, self.password,
                                lines + [f"cluster-port {bus}", f'cluster-config-file "nodes-{port}.conf"'])
                      for port, bus in zip(ports, buses, strict=True)]

    @property
    def url(self) -> str:
        return f"redis+cluster://:{quote(self.password, safe='')}@" + ",".join(n.name for n in self.nodes[:3])

    def start(self) -> Cluster:
        try:
            for node in self.nodes:
                node.start()
            subprocess.run(["redis-cli", "--no-auth-warning", "-a", self.password, "--cluster", "create",
                            *(n.name for n in self.nodes), "--cluster-replicas", "1", "--cluster-yes"],
                           check=True, capture_output=True, timeout=60)
            self.wait_healthy(30)
            for node in self.nodes:
                if self.role(node) == "slave":
                    wait_synced(node, 30)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def client(self) -> RedisCluster:
        return RedisCluster("127.0.0.1", self.nodes[0].port, password=self.password, socket_timeout=2,
                            socket_connect_timeout=2, require_full_coverage=False)

    def _node(self, port: int) -> RedisNode:
        return next(n for n in self.nodes if n.port == port)

    def _live(self) -> list[RedisNode]:
        return [n for n in self.nodes if n.alive()]

    def master_of(self, key: str) -> RedisNode:
        """The master that serves ``key``'s slot now, as a live node sees it."""
        slot = key_slot(key.encode())
        for node in self._live():
            client = node.client()
            try:
                for start, end, master, *_ in client.execute_command("CLUSTER SLOTS"):
                    if start <= slot <= end:
                        return self._node(int(master[1]))
            except redis.RedisError:
                continue
            finally:
                client.close()
        raise AssertionError(f"no node serves the slot of {key}")

    def replicas_of(self, master: RedisNode) -> list[RedisNode]:
        client = master.client()
        try:
            info = client.info("replication")
        finally:
            client.close()
        return [self._node(int(v["port"])) for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]

    def role(self, node: RedisNode) -> str:
        client = node.client()
        try:
            return client.execute_command("ROLE")[0].decode()
        finally:
            client.close()

    def wait_healthy(self, timeout_s: float) -> None:
        """Every live node says the cluster is ok and all 16384 slots are served."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = []
            for node in self._live():
                client = node.client()
                try:
                    info = client.cluster("info")
                    states.append(info.get("cluster_state") == "ok" and int(info.get("cluster_slots_ok", 0)) == 16384)
                except redis.RedisError:
                    states.append(False)
                finally:
                    client.close()
            if states and all(states):
                return
            assert time.monotonic() < deadline, "the cluster did not become healthy"
            time.sleep(0.1)

    def wait_master(self, node: RedisNode, timeout_s: float) -> float:
        """Seconds until ``node`` is a master (a promoted replica)."""
        started = time.monotonic()
        while True:
            try:
                if self.role(node) == "master":
                    return time.monotonic() - started
            except redis.RedisError:
                pass
            assert time.monotonic() - started < timeout_s, f"{node.name} was not promoted"
            time.sleep(0.02)

    def restore(self, killed: RedisNode) -> None:
        """Start a killed master again (it rejoins as a replica of its promoted replica)."""
        killed.start()
        self.wait_healthy(30)
        wait_synced(killed, 30)


class SentinelGroup:
    """A master, a replica and three sentinels monitoring them as ``gw``; ``url``:
    ``redis+sentinel://`` with the three sentinels."""

    NAME = "gw"

    def __init__(self, home: Path, base_port: int | None = None):
        fixed = fixed_port("topology")
        base_port = base_port or (fixed + 10 if fixed else None)
        ports = [base_port + i for i in range(5)] if base_port else free_ports(5)
        self.password = uuid.uuid4().hex
        self.master = RedisNode(home, ports[0], self.password, [])
        self.replica = RedisNode(home, ports[1], self.password, [f"replicaof 127.0.0.1 {ports[0]}"])
        self.sentinels = [RedisNode(home, port, self.password, [
            f"sentinel monitor {self.NAME} 127.0.0.1 {ports[0]} 2",
            f"sentinel auth-pass {self.NAME} {self.password}",
            f"sentinel down-after-milliseconds {self.NAME} {NODE_TIMEOUT_MS}",
            f"sentinel failover-timeout {self.NAME} 5000",
            f"sentinel parallel-syncs {self.NAME} 1"], sentinel=True) for port in ports[2:]]

    @property
    def url(self) -> str:
        return (f"redis+sentinel://:{quote(self.password, safe='')}@"
                + ",".join(s.name for s in self.sentinels) + f"/{self.NAME}")

    @property
    def servers(self) -> list[RedisNode]:
        return [self.master, self.replica]

    def start(self, wait: bool = True) -> SentinelGroup:
        """``wait=False``: return before the sentinels have found each other (hello messages
        every 2 s: about 7 s), which ``wait_known`` waits for; clients work meanwhile."""
        try:
            self.master.start()
            self.replica.start()
            self.wait_synced(self.replica, 20)
            for sentinel in self.sentinels:
                sentinel.start()
            if wait:
                self.wait_known(20)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.sentinels + self.servers:
            node.stop()

    def client(self):
        """A client of the master the sentinels name (followed through failovers)."""
        sentinel = Sentinel([("127.0.0.1", s.port) for s in self.sentinels], socket_timeout=2)
        return sentinel.master_for(self.NAME, password=self.password, socket_timeout=2, socket_connect_timeout=2)

    def sentinel_master(self) -> RedisNode:
        """The master the sentinels announce now."""
        client = self.sentinels[0].client()
        try:
            _, port = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.NAME)
        finally:
            client.close()
        return next(n for n in self.servers if n.port == int(port))

    def other(self, node: RedisNode) -> RedisNode:
        return self.replica if node is self.master else self.master

    def wait_synced(self, replica: RedisNode, timeout_s: float) -> None:
        wait_synced(replica, timeout_s)

    def wait_known(self, timeout_s: float) -> None:
        """Every sentinel knows the replica and the other sentinels (so a failover can be
        agreed on)."""
        deadline = time.monotonic() + timeout_s
        while True:
            ready = []
            for sentinel in self.sentinels:
                client = sentinel.client()
                try:
                    state = client.sentinel_master(self.NAME)
                    ready.append(int(state["num-slaves"]) >= 1 and int(state["num-other-sentinels"]) >= 2)
                except redis.RedisError:
                    ready.append(False)
                finally:
                    client.close()
            if all(ready):
                return
            assert time.monotonic() < deadline, "the sentinels did not discover each other"
            time.sleep(0.1)

    def wait_master(self, node: RedisNode, timeout_s: float) -> float:
        """Seconds until the sentinels announce ``node`` as the master and it is one."""
        started = time.monotonic()
        while True:
            try:
                if self.sentinel_master() is node:
                    client = node.client()
                    try:
                        if client.execute_command("ROLE")[0] == b"master":
                            return time.monotonic() - started
                    finally:
                        client.close()
            except redis.RedisError:
                pass
            assert time.monotonic() - started < timeout_s, f"{node.name} was not promoted"
            time.sleep(0.02)

    def failover(self) -> None:
        """``SENTINEL FAILOVER``: a planned switch (the old master is demoted, not killed)."""
        client = self.sentinels[0].client()
        try:
            client.execute_command("SENTINEL", "FAILOVER", self.NAME)
        finally:
            client.close()
