"""Two gateway instances (two gunicorn masters) behind a real nginx, as ``fleet up --instances 2``
starts them, on one PostgreSQL store and one Redis: calls reach both instances, and a key's rate
limit and its revocation hold across them. ``fleet down --keep-services`` stops them.

Which instance answered a call: the store's run history names the worker (``host:pid``), and
each worker's parent is its instance's master (its pid file under ``<home>/run``).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.api import Api
from helpers.history import key_id, runs_by_worker
from helpers.load import Load, statuses
from helpers.procs import running, wait_gone
from helpers.util import ROOT, wait_until

pytestmark = pytest.mark.slow

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


@pytest.fixture(scope="module")
def fleet(services, tmp_path_factory):
    fleet = Fleet(services, tmp_path_factory.mktemp("fleet-up-home"))
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


@pytest.fixture(scope="module")
def admin(fleet, services):
    api = Api.over_http(fleet.base, services)   # through nginx: either instance may take a management call
    yield api
    api.close()


def by_instance(fleet, sql, kid: int, expected_200: int) -> dict[int, dict]:
    """{instance index: {status: count}} from the run history, once ``expected_200`` 200s are in."""
    def settled():
        runs = runs_by_worker(sql, kid)
        return runs if sum(s.get(200, 0) for s in runs.values()) >= expected_200 else None
    runs = wait_until(settled, 5, 0.1, "the run history")
    owner = fleet.instance_of()
    out: dict[int, dict] = {}
    for worker, counts in runs.items():
        assert worker in owner, (worker, owner)   # every run was served by a worker of one of the two
        bucket = out.setdefault(owner[worker], {})
        for status, n in counts.items():
            bucket[status] = bucket.get(status, 0) + n
    return out


def test_calls_reach_both_instances_and_a_rate_limit_holds_across_them(fleet, admin, superuser):
    rate, burst, seconds = 40, 5, 4.0
    connection = admin.connection()
    query = admin.query("SELECT 1 AS v", connection=connection)
    name, secret = admin.named_key([query], [connection], rate_limit=f"{rate}/second", rate_limit_burst=burst)
    load = Load(fleet.base, f"/q/{query}", secret, threads=8)
    with load:
        time.sleep(seconds)
    calls = load.calls
    ok = [c for c in calls if c.status == 200]
    span = calls[-1].ended - calls[0].started
    bound = burst + rate * (span + LEASE_MS / 1000)
    print(f"two instances: {len(ok)} admitted of {len(calls)} in {span:.2f}s, bound {bound:.1f}")
    assert len(ok) <= bound, (len(ok), bound)
    assert len(ok) >= 0.8 * rate * span, (len(ok), span)
    assert set(statuses(calls)) == {(200, None), (429, "rate_limited")}, statuses(calls)
    runs = by_instance(fleet, superuser, key_id(superuser, name), len(ok))
    print("by instance:", runs)
    assert set(runs) == {0, 1}, runs
    assert all(runs[i].get(200, 0) >= 0.2 * len(ok) for i in (0, 1)), runs       # both admitted a share
    assert sum(r.get(200, 0) for r in runs.values()) == len(ok)


def test_revocation_holds_across_instances(fleet, admin, superuser):
    connection = admin.connection()
    query = admin.query("SELECT 1 AS v", connection=connection)
    name, secret = admin.named_key([query], [connection])
    kid = key_id(superuser, name)
    # Clients on nginx and on each instance directly.
    load = Load([fleet.base, *fleet.instances], f"/q/{query}", secret, threads=9, close=True)
    with load:
        time.sleep(1.0)
        admin.ok("DELETE", f"/api-keys/{name}")
        returned = time.monotonic()
        time.sleep(0.8)
    calls = load.calls
    before = [c for c in calls if c.ended < returned]
    after = [c for c in calls if c.started > returned]
    assert sum(c.status == 200 for c in before) > 30, statuses(before)
    for target in [fleet.base, *fleet.instances]:
        mine = [c for c in after if c.target == target]
        assert len(mine) > 10, (target, len(mine))
        assert statuses(mine) == {(401, "unauthorized"): len(mine)}, (target, statuses(mine))
    runs = by_instance(fleet, superuser, kid, sum(c.status == 200 for c in calls))
    assert set(runs) == {0, 1} and all(runs[i].get(200) for i in (0, 1)), runs
