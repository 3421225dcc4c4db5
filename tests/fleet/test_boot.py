"""A worker that starts while PostgreSQL is away waits for it (``fleet.app.wait_for_store``)
instead of failing to boot: gunicorn stops the whole master when one worker fails to boot, so
a worker started during a PostgreSQL restart took its instance down. On a PostgreSQL of this
module's own (``private_services``)."""
from __future__ import annotations

import importlib.util
import os
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
        # ... against a store that is away: a sleep that is the test (a worker that gave up on the
        # store would fail to boot, and gunicorn stop the master, within it; nothing shows it waiting).
        time.sleep(3.0)
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
    """fleet/server/boot.py: the master imported the third-party libraries before forking; their C
    extensions are mapped in the master itself (a worker that imported them alone would be the
    only one to map them)."""
    master = Master(services, tmp_path_factory.mktemp("preload-home"), workers=1).start()
    try:
        maps = Path(f"/proc/{master.proc.pid}/maps").read_text()
        for extension in ("/psycopg2/_psycopg", "/orjson/", "/pglast/"):
            assert extension in maps, f"{extension} is not loaded in the master"
    finally:
        master.stop()


def _compiled_for(source: Path) -> bool:
    """Whether ``source`` has bytecode in its ``__pycache__`` made from it as it is now (the
    header holds the source's mtime and size, as the import system checks them)."""
    cached = Path(importlib.util.cache_from_source(str(source)))
    if not cached.exists():
        return False
    header = cached.read_bytes()[:16]
    stat = source.stat()
    return int.from_bytes(header[8:12], "little") == int(stat.st_mtime) & 0xFFFFFFFF \
        and int.from_bytes(header[12:16], "little") == stat.st_size & 0xFFFFFFFF


def test_the_master_compiles_our_own_code_once_for_its_workers(tmp_path):
    """fleet/server/boot.py ``compile_own_code``: where imports write no bytecode
    (PYTHONDONTWRITEBYTECODE, a read-only checkout) every worker compiled gateway/ and fleet/
    from source at each boot (75 of its 180 ms of CPU); the master compiles them once, and again
    what changed (a SIGHUP re-reads gunicorn_conf.py, which calls it)."""
    from fleet.server.boot import OWN_PACKAGES, compile_own_code
    for package in OWN_PACKAGES:
        (tmp_path / package / "inner").mkdir(parents=True)
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / "inner" / "mod.py").write_text("VALUE = 1\n")
    sources = sorted(tmp_path.rglob("*.py"))
    assert not any(_compiled_for(s) for s in sources)
    assert compile_own_code(tmp_path)
    assert all(_compiled_for(s) for s in sources)
    changed = tmp_path / "gateway" / "inner" / "mod.py"
    changed.write_text("VALUE = 22\n")
    os.utime(changed, (changed.stat().st_atime, changed.stat().st_mtime + 5))
    assert not _compiled_for(changed)
    assert compile_own_code(tmp_path)
    assert _compiled_for(changed)
    assert "compile_own_code()" in (Path(__file__).resolve().parents[2] / "fleet" / "server" / "gunicorn_conf.py").read_text()


_WORKER_BOOT = """
import sys
import gunicorn.arbiter, gunicorn.config, gunicorn.http.wsgi, gunicorn.workers.gthread   # the master's own
from fleet.server.boot import preload_libraries
assert not preload_libraries()
before = set(sys.modules)
from fleet.app import create_app
app = create_app()
app.parts.close()
print(sorted(m for m in set(sys.modules) - before if not m.startswith(("gateway", "fleet"))))
"""


def test_a_worker_boot_imports_nothing_the_master_did_not(services, tmp_path):
    """A worker forks from a master that ran ``preload_libraries`` and builds the application:
    every module it imports is our own (each library imported by a worker cost every boot its
    import again: cryptography, sqlglot's PostgreSQL dialect and PyYAML were ~28 ms of CPU
    together, next to the workers that serve). A new import belongs in ``fleet.server.boot.LIBRARIES``."""
    import subprocess
    import sys as _sys

    done = subprocess.run([_sys.executable, "-c", _WORKER_BOOT], cwd=Path(__file__).resolve().parents[2],
                          env=services.env(tmp_path, workers=1), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-2000:]
