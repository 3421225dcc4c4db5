"""Real gunicorn masters (``fleet/server/gunicorn_conf.py``, ``fleet.app:create_app()``) on a
``Services`` pair, each in its own home and its own process session, ended by its own pid
or group."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis
import requests

from helpers.ports import free_port
from helpers.procs import child_pids
from helpers.util import ROOT

HOSTNAME = socket.gethostname()
ALIVE = "gw:{fleet}:alive"     # the bus's heartbeats: {"host:pid": expiry}


class Master:
    """``python -m gunicorn -c fleet/server/gunicorn_conf.py --bind 127.0.0.1:<port> 'fleet.app:create_app()'``."""

    def __init__(self, services, home: Path, workers: int = 4, redis_client=None, **settings):
        """``redis_client``: makes a client of the fleet's Redis when it is not ``services``'
        (a cluster, a sentinel group: ``settings`` then carry its ``redis_url``)."""
        self.services = services
        self.redis_client = redis_client or services.redis_client
        self.home = home
        self.workers = workers
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        home.mkdir(parents=True, exist_ok=True)
        self.log_path = home / f"gunicorn-{self.port}.log"
        settings.setdefault("cpus", "auto")
        settings.setdefault("instance", f"t{self.port}")
        self.env = services.env(home, workers=workers, **settings)
        self.proc: subprocess.Popen | None = None

    def spawn(self) -> Master:
        """Start the master; do not wait for it."""
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "fleet" / "server" / "gunicorn_conf.py"),
                 "--bind", f"127.0.0.1:{self.port}", "fleet.app:create_app()"],
                cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        return self

    def start(self, timeout_s: float = 60) -> Master:
        self.spawn()
        self.wait_ready(timeout_s)
        return self

    def worker_pids(self) -> list[int]:
        return child_pids(self.proc.pid)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def wait_ready(self, timeout_s: float = 60) -> list[int]:
        """Every worker forked, on the bus (its heartbeat in Redis) and /ready answering 200."""
        client = self.redis_client()
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                assert self.proc.poll() is None, f"gunicorn exited:\n{self.log_tail()}"
                workers = self.worker_pids()
                try:
                    registered = {k.decode() for k in client.hkeys(ALIVE)}
                except redis.RedisError:
                    registered = set()
                if len(workers) == self.workers and all(f"{HOSTNAME}:{w}" in registered for w in workers):
                    try:
                        if requests.get(self.base + "/ready", timeout=2).status_code == 200:
                            return workers
                    except requests.RequestException:
                        pass
                assert time.monotonic() < deadline, f"gunicorn did not come up:\n{self.log_tail()}"
                time.sleep(0.1)
        finally:
            client.close()

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        try:  # stragglers of the group this master was started in (start_new_session)
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait(timeout=10)


def stop_all(masters) -> None:
    """Stop several masters at once (SIGTERM to each, then wait for each)."""
    for master in masters:
        if master.proc is not None and master.proc.poll() is None:
            master.proc.send_signal(signal.SIGTERM)
    for master in masters:
        master.stop()


def start_masters(services, home_factory, *configs: dict) -> list[Master]:
    """Start one master per ``configs`` entry (``workers``, default 2, and GATEWAY_* settings),
    all at once, and wait until every one is ready."""
    masters = []
    try:
        for config in configs:
            config = dict(config)
            masters.append(Master(services, home_factory(), workers=config.pop("workers", 2), **config).spawn())
        for master in masters:
            master.wait_ready(90)
    except BaseException:
        for master in masters:
            master.stop()
        raise
    return masters
