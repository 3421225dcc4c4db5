"""A worker that starts while PostgreSQL is away waits for it (``fleet.app.wait_for_store``)
instead of failing to boot: gunicorn stops the whole master when one worker fails to boot, so
a worker started during a PostgreSQL restart took its instance down. On a PostgreSQL of this
module's own (``private_services``)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests

from helpers.masters import Master

pytestmark = pytest.mark.slow


def test_a_master_started_while_postgresql_is_down_serves_once_it_is_back(private_services, tmp_path_factory):
    private_services.pg.stop()
    master = None
    try:
        master = Master(private_services, tmp_path_factory.mktemp("boot-home"), workers=2).spawn()
        deadline = time.monotonic() + 30
        while len(master.worker_pids()) < 2:                      # the workers are booting
            assert master.proc.poll() is None and time.monotonic() < deadline, master.log_tail()
            time.sleep(0.05)
        time.sleep(3.0)                                           # ... against a store that is away
        assert master.proc.poll() is None, f"the master stopped:\n{master.log_tail()}"
        private_services.pg.start()
        master.wait_ready(60)
        assert requests.get(master.base + "/ready", timeout=5).status_code == 200
        assert "Worker failed to boot" not in master.log_tail(200)
    finally:
        if not private_services.pg.is_running():
            private_services.pg.start()
        if master is not None:
            master.stop()



def test_the_master_preloads_the_libraries_its_workers_fork_with(services, tmp_path_factory):
    """fleet/boot.py: the master imported the third-party libraries before forking; their C
    extensions are mapped in the master itself (a worker that imported them alone would be the
    only one to map them)."""
    master = Master(services, tmp_path_factory.mktemp("preload-home"), workers=1).start()
    try:
        maps = Path(f"/proc/{master.proc.pid}/maps").read_text()
        for extension in ("/psycopg2/_psycopg", "/orjson/", "/pglast/"):
            assert extension in maps, f"{extension} is not loaded in the master"
    finally:
        master.stop()
