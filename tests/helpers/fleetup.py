"""``fleet up --instances 2`` for tests: nginx in front of two gunicorn masters on one store
and one Redis (the services given), driven through the real ``fleet`` command."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .procs import running, wait_gone
from .util import ROOT, wait_until

LEASE_MS = 100
WORKERS = 4


def three_free_ports() -> int:
    """A port p with p, p+1 and p+2 free (nginx on p, the instances on p+1 and p+2)."""
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            base = sock.getsockname()[1]
        if base > 65000:
            continue
        try:
            for port in (base, base + 1, base + 2):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no three consecutive free ports")


def fleet_command() -> list[str]:
    script = Path(sys.executable).parent / "fleet"
    return [str(script)] if script.exists() else [sys.executable, "-m", "fleet.cli"]


class Fleet:
    def __init__(self, services, home: Path):
        self.home = home
        self.port = three_free_ports()
        self.base = f"http://127.0.0.1:{self.port}"
        self.instances = [f"http://127.0.0.1:{self.port + 1}", f"http://127.0.0.1:{self.port + 2}"]
        self.env = services.env(home, bind=f"127.0.0.1:{self.port}", workers=WORKERS, cpus="auto",
                                lease_ms=LEASE_MS)

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([*fleet_command(), *args], cwd=ROOT, env=self.env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def masters(self) -> list[int]:
        pids = []
        for name in ("i0", "i1"):
            pid_file = self.home / "run" / f"gunicorn-{name}.pid"
            pids.append(int(pid_file.read_text().strip()))
        return pids

    def nginx(self) -> int | None:
        try:
            return int((self.home / "run" / "nginx.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def instance_of(self) -> dict[str, int]:
        """worker ("host:pid") -> index of its instance, for the workers alive now."""
        out = {}
        host = socket.gethostname()
        for index, master in enumerate(self.masters()):
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        stat = Path(f"/proc/{entry}/stat").read_text()
                    except OSError:
                        continue
                    if int(stat.rsplit(")", 1)[1].split()[1]) == master:
                        out[f"{host}:{entry}"] = index
        return out


@contextmanager
def started(services, home: Path) -> Iterator[Fleet]:
    """``fleet up --instances 2`` on ``services``; ``fleet down --keep-services`` at the end,
    checking that the masters and nginx are gone."""
    fleet = Fleet(services, home)
    try:
        done = fleet.run("up", "--instances", "2")
        assert done.returncode == 0, done.stdout + done.stderr
        assert fleet.nginx() and all(running(p) for p in fleet.masters())
        wait_until(lambda: len(fleet.instance_of()) == 2 * WORKERS, 60, 0.1, "every worker of both instances")
        yield fleet
    finally:
        masters = []
        try:
            masters = fleet.masters()
        except (OSError, ValueError):   # `fleet up` failed before writing them
            pass
        nginx = fleet.nginx()
        down = fleet.run("down", "--keep-services")
        assert down.returncode == 0, down.stdout + down.stderr
        assert all(wait_gone(p, 30) for p in masters), masters
        assert nginx is None or wait_gone(nginx, 10)
