"""The crash spool (``gateway/store/spool.py``) with the history writer, on the real store:

- a process SIGKILLed with runs it recorded and never stored: another writer on the same
  spool folder stores every one of them, once;
- a replay is idempotent: runs the store already holds (a batch committed just before the
  kill) are not stored twice;
- a live writer's spool is never claimed; stored segments are deleted; a graceful close
  leaves nothing; a record cut by the kill is left out.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg2
import pytest

from gateway.store.history import HistoryWriter, _Clock, copy_line
from gateway.store.schema import migrate
from gateway.store.spool import SUFFIX, Orphan, Spool, open_spool, orphans, replay
from helpers.util import ROOT, wait_until


@pytest.fixture(scope="module")
def store(services):
    conn = psycopg2.connect(services.store_url)
    try:
        migrate(conn)
    finally:
        conn.close()

    def connect():
        return psycopg2.connect(services.store_url, application_name="spool-test")
    return connect


def stored(sql, prefix: str) -> dict:
    """{request_id: how many rows} for the runs whose request id starts with ``prefix``."""
    rows = sql("SELECT request_id, count(*) FROM gw_run_history WHERE request_id LIKE %s GROUP BY 1",
               (prefix + "%",))
    return dict(rows)


def record(writer: HistoryWriter, prefix: str, n: int) -> list[str]:
    ids = [f"{prefix}{i}" for i in range(n)]
    for rid in ids:
        writer.record(rid, None, "q\tname\\", 1, 200, None, 1, 0.5, True)
    return ids


_DYING = r"""
import os, signal, sys, psycopg2
from pathlib import Path
from gateway.store.history import HistoryWriter
from gateway.store.spool import Spool
url, root, prefix, n, stored_first = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
# The thread never runs: nothing is stored by it before the kill.
writer = HistoryWriter(lambda: psycopg2.connect(url), "spool-test:dying", 500, 60_000, 100_000,
                       spool=Spool(Path(root), "spool-test:dying"))
for i in range(n):
    writer.record(f"{prefix}{i}", None, "q", 1, 200, None, 1, 0.5, True)
if stored_first:   # a batch committed just before the kill, its lines still in the spool
    conn = psycopg2.connect(url)
    conn.autocommit = True
    HistoryWriter._store(conn, list(writer._queue)[:stored_first])
sys.stdout.write("recorded\n"); sys.stdout.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def die_with_runs(services, root: Path, prefix: str, n: int, stored_first: int = 0) -> None:
    """A process records ``n`` runs (the first ``stored_first`` of them also stored) and is
    SIGKILLed."""
    args = [sys.executable, "-c", _DYING, services.store_url, str(root), prefix, str(n), str(stored_first)]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr
    assert done.stdout == "recorded\n", done.stderr


def test_a_killed_writers_runs_are_stored_once_by_another(store, services, superuser, tmp_path):
    root = tmp_path / "spool"
    prefix = f"spool-{uuid.uuid4().hex[:8]}-"
    die_with_runs(services, root, prefix, 1000)
    assert stored(superuser, prefix) == {}            # nothing reached the store
    (dead,) = os.listdir(root)
    writer = HistoryWriter(store, "spool-test:heir", 500, 50, 100_000, spool=Spool(root, "spool-test:heir"))
    writer.start()
    try:
        found = wait_until(lambda: len(stored(superuser, prefix)) == 1000 and stored(superuser, prefix), 10,
                           what="the dead writer's runs")
        assert set(found.values()) == {1}
        assert writer.replayed == 1000
        assert dead not in os.listdir(root)           # its folder is gone once stored
        rows = superuser("SELECT DISTINCT query, worker, status, admitted FROM gw_run_history WHERE request_id LIKE %s",
                         (prefix + "%",))
        assert rows == [("q", "spool-test:dying", 200, True)]
    finally:
        writer.close()
    assert not root.exists()                          # the heir closed cleanly: nothing left


def test_runs_stored_before_the_kill_are_not_stored_twice(store, services, superuser, tmp_path):
    root = tmp_path / "spool"
    prefix = f"spool-{uuid.uuid4().hex[:8]}-"
    die_with_runs(services, root, prefix, 600, stored_first=300)
    before = stored(superuser, prefix)
    assert len(before) == 300                          # the first 300 were stored, the next 300 not
    writer = HistoryWriter(store, "spool-test:heir", 500, 50, 100_000, spool=Spool(root, "spool-test:heir"))
    writer.start()
    try:
        found = wait_until(lambda: len(stored(superuser, prefix)) == 600 and stored(superuser, prefix), 10,
                           what="the dead writer's runs")
        assert set(found.values()) == {1}, "a run stored twice"
        assert writer.replayed == 300
    finally:
        writer.close()


def test_replay_is_idempotent(store, superuser):
    prefix = f"spool-{uuid.uuid4().hex[:8]}-"
    clock = _Clock()
    now = time.time()
    text = "".join(copy_line(clock, (now + i / 1000, f"{prefix}{i}", None, "q", 1, 200, None, 1, 0.5, "w:1", True))
                   for i in range(10))
    conn = store()
    conn.autocommit = True
    try:
        assert replay(conn, text) == 10
        assert replay(conn, text) == 0
        assert replay(conn, "") == 0
    finally:
        conn.close()
    assert set(stored(superuser, prefix).values()) == {1} and len(stored(superuser, prefix)) == 10


def test_a_live_spool_is_never_claimed_and_stored_segments_go(store, superuser, tmp_path):
    root = tmp_path / "spool"
    prefix = f"spool-{uuid.uuid4().hex[:8]}-"
    writer = HistoryWriter(store, "spool-test:live", 500, 50, 100_000, spool=Spool(root, "spool-test:live"))
    other = Spool(root, "spool-test:other")          # another live worker of the same home
    try:
        assert list(orphans(root)) == []              # both locked by their (live) owners
        writer.start()
        ids = record(writer, prefix, 200)
        wait_until(lambda: len(stored(superuser, prefix)) == 200, 10, what="the runs")
        (mine,) = [p for p in root.iterdir() if p != other.path]
        # Once stored, the segments holding them are deleted (the one being written stays).
        wait_until(lambda: sum(p.stat().st_size for p in mine.glob("*" + SUFFIX)) == 0, 5, what="segments deleted")
        assert len(ids) == 200 and writer.replayed == 0
        assert other.path.exists()                    # a live spool is not taken
        assert stored(superuser, prefix)[ids[0]] == 1
    finally:
        writer.close()
        other.close()
    assert not root.exists()


def test_a_record_cut_by_the_kill_is_left_out(tmp_path):
    root = tmp_path / "spool"
    writer = Spool(root, "w:1")
    runs = [(1.5, f"r{i}", None, "q\n", 1, 200, None, 1, 0.5, "w:1", True) for i in range(3)]
    writer.write(runs[0])
    writer.rotate()
    writer.write(runs[1])
    writer.write(runs[2])
    segment = sorted(writer.path.glob("*" + SUFFIX))[-1]
    whole = segment.read_bytes()
    os.close(writer._lock_fd)                         # the worker dies ...
    segment.write_bytes(whole[:-3])                   # ... inside its last write
    (claimed,) = list(orphans(root))
    assert isinstance(claimed, Orphan)
    assert claimed.runs() == runs[:2]
    assert list(orphans(root)) == []                  # claimed: no second replayer takes it
    claimed.done(remove=True)
    assert not writer.path.exists()


def test_a_spool_that_cannot_be_made_leaves_the_worker_serving(tmp_path, caplog):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    assert open_spool(blocked, "w:1") is None
    assert "no crash spool" in caplog.text
    spool = open_spool(tmp_path / "spool", "w:1")
    assert isinstance(spool, Spool)
    spool.close()


def test_a_spool_past_its_bound_takes_no_more_until_stored(tmp_path):
    """While the store is away the spool grows; past its bound newer runs wait in memory only
    (counted), so tmpfs is never filled."""
    spool = Spool(tmp_path / "spool", "w:1", max_bytes=2000)
    writer = HistoryWriter(None, "w:1", 500, 200, 100_000, spool=spool)
    try:
        record(writer, "bound-", 50)                      # ~60 bytes each: past 2,000
        spool.bound()                                     # the history thread, at its next flush
        assert spool.full
        record(writer, "more-", 10)
        assert writer.spool_failed == 10 and writer.depth() == 60   # all still queued in memory
        spool.rotate()
        spool.release()                                   # stored: the retired segment goes
        spool.bound()
        assert not spool.full
        record(writer, "again-", 1)
        assert writer.spool_failed == 10
    finally:
        spool.close()
