"""A worker that starts while PostgreSQL is away waits for it (``fleet.app.wait_for_store``)
instead of failing to boot: gunicorn stops the whole master when one worker fails to boot, so
a worker started during a PostgreSQL restart took its instance down. On a PostgreSQL of this
module's own (``private_services``).

A booting worker runs at a lower CPU priority (``GATEWAY_BOOT_NICE``, fleet/boot.py) and every
one of its threads is back at the master's once it serves."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import requests

from helpers.masters import Master

pytestmark = pytest.mark.slow


def nice_of(pid: int, tid: int | None = None) -> int:
    """A thread's nice value (field 19 of /proc/PID/task/TID/stat); the process's main thread by default."""
    stat = Path(f"/proc/{pid}/task/{tid or pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])


def threads_nice(pid: int) -> dict[int, int]:
    return {int(tid): nice_of(pid, int(tid)) for tid in os.listdir(f"/proc/{pid}/task")}


def test_a_master_started_while_postgresql_is_down_serves_once_it_is_back(private_services, tmp_path_factory):
    private_services.pg.stop()
    master = None
    try:
        master = Master(private_services, tmp_path_factory.mktemp("boot-home"), workers=2, boot_nice=7).spawn()
        deadline = time.monotonic() + 30
        while len(master.worker_pids()) < 2:                      # the workers are booting
            assert master.proc.poll() is None and time.monotonic() < deadline, master.log_tail()
            time.sleep(0.05)
        time.sleep(3.0)                                           # ... against a store that is away
        assert master.proc.poll() is None, f"the master stopped:\n{master.log_tail()}"
        base = nice_of(master.proc.pid)
        assert [nice_of(w) for w in master.worker_pids()] == [min(19, base + 7)] * 2   # booting: lower
        private_services.pg.start()
        master.wait_ready(60)
        for worker in master.worker_pids():                       # serving: every thread back at the master's
            assert set(threads_nice(worker).values()) == {base}, threads_nice(worker)
        assert requests.get(master.base + "/ready", timeout=5).status_code == 200
        assert "Worker failed to boot" not in master.log_tail(200)
    finally:
        if not private_services.pg.is_running():
            private_services.pg.start()
        if master is not None:
            master.stop()


def policy_of(pid: int, tid: int) -> int:
    """A thread's scheduling policy (field 41 of /proc/PID/task/TID/stat; 3: SCHED_BATCH)."""
    stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[38])


def test_batch_workers_run_every_thread_under_sched_batch(services, tmp_path_factory):
    master = Master(services, tmp_path_factory.mktemp("batch-home"), workers=2, worker_sched="batch").start()
    try:
        assert requests.get(master.base + "/ready", timeout=5).status_code == 200
        for worker in master.worker_pids():
            policies = {tid: policy_of(worker, int(tid)) for tid in os.listdir(f"/proc/{worker}/task")}
            assert set(policies.values()) == {os.SCHED_BATCH}, policies
        assert policy_of(master.proc.pid, master.proc.pid) == os.SCHED_OTHER    # the master keeps its policy
    finally:
        master.stop()
