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

from .ports import free_ports
from .procs import running, wait_gone
from .util import ROOT, wait_until

LEASE_MS = 100
WORKERS = 4


def fleet_command() -> list[str]:
    script = Path(sys.executable).parent / "fleet"
    return [str(script)] if script.exists() else [sys.executable, "-m", "fleet.ops.cli"]


class Fleet:
    def __init__(self, services, home: Path):
        self.home = home
        self.port = free_ports(3, consecutive=True)[0]   # nginx on p, the instances on p+1 and p+2
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

    def supervisor(self) -> int | None:
        try:
            return int((self.home / "run" / "supervisor.pid").read_text().strip())
        except (OSError, ValueError):
            return None

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


def processes_of(home: Path) -> list[int]:
    """Every live process started with ``GATEWAY_HOME`` set to ``home``: the supervisor, the
    masters and their workers (what ``fleet up`` started and ``fleet down`` must end)."""
    marker = f"GATEWAY_HOME={home}".encode() + b"\0"
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if marker in environ and running(int(entry)):
                found.append(int(entry))
    return found


@contextmanager
def started(services, home: Path) -> Iterator[Fleet]:
    """``fleet up --instances 2`` on ``services``; ``fleet down --keep-services`` at the end,
    checking that the supervisor, the masters, their workers and nginx are gone."""
    fleet = Fleet(services, home)
    try:
        done = fleet.run("up", "--instances", "2")
        assert done.returncode == 0, done.stdout + done.stderr
        assert fleet.nginx() and fleet.supervisor() and all(running(p) for p in fleet.masters())
        wait_until(lambda: len(fleet.instance_of()) == 2 * WORKERS, 60, 0.1, "every worker of both instances")
        yield fleet
    finally:
        masters = []
        try:
            masters = fleet.masters()
        except (OSError, ValueError):   # `fleet up` failed before writing them
            pass
        nginx, supervisor = fleet.nginx(), fleet.supervisor()
        down = fleet.run("down", "--keep-services")
        assert down.returncode == 0, down.stdout + down.stderr
        assert all(wait_gone(p, 30) for p in masters), masters
        assert nginx is None or wait_gone(nginx, 10)
        assert supervisor is None or wait_gone(supervisor, 10)
        wait_until(lambda: not processes_of(home), 10, 0.1, "no process of the fleet left")
