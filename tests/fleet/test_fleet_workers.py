"""Worker pinning under a real gunicorn master (``fleet/server/gunicorn_conf.py``: pre_fork/post_fork):
each worker on its own core, and a worker killed with SIGKILL is replaced on the core it freed."""
from __future__ import annotations

import os
import signal

import pytest
import requests

from helpers.masters import Master
from helpers.procs import cpus_allowed, wait_gone
from helpers.util import wait_until

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs at least 2 usable cores")]

CPUS = sorted(os.sched_getaffinity(0))


def pinning(master: Master) -> dict[int, str]:
    return {pid: cpus_allowed(pid) for pid in master.worker_pids()}


def kill_and_wait_for_replacement(master: Master, victim: int) -> int:
    before = set(master.worker_pids())
    os.kill(victim, signal.SIGKILL)
    assert wait_gone(victim, 10)
    new = wait_until(lambda: set(master.worker_pids()) - before, 30, what="a replacement worker")
    master.wait_ready(30)
    (replacement,) = new
    return replacement


@pytest.mark.parametrize("workers", [len(CPUS), 2 * len(CPUS)])
def test_killed_worker_is_replaced_on_the_core_it_freed(services, tmp_path_factory, workers):
    master = Master(services, tmp_path_factory.mktemp("pin-home"), workers=workers, cpus="auto")
    master.start()
    try:
        pins = pinning(master)
        assert len(pins) == workers
        # Each worker pinned to one core, the cores used evenly.
        assert all(p in {str(c) for c in CPUS} for p in pins.values()), pins
        per_core = {str(c): sum(1 for p in pins.values() if p == str(c)) for c in CPUS}
        assert set(per_core.values()) == {workers // len(CPUS)}, pins
        # Kill a worker of the first core twice over, then one of the last: each replacement
        # takes the core its predecessor left.
        for core in (CPUS[0], CPUS[0], CPUS[-1]):
            victim = next(pid for pid, p in pinning(master).items() if p == str(core))
            replacement = kill_and_wait_for_replacement(master, victim)
            assert cpus_allowed(replacement) == str(core), pinning(master)
            after = pinning(master)
            assert sorted(after.values()) == sorted(pins.values()), (pins, after)
        assert requests.get(master.base + "/ready", timeout=5).status_code == 200
        assert master.proc.poll() is None
    finally:
        master.stop()
