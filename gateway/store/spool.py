"""A worker's crash spool: the runs it has recorded and not yet stored, in files that outlive
the process (tmpfs by default: they survive a SIGKILL, an OOM kill or a crash of the worker or
of its whole master, not a crash of the host; nothing is fsynced).

Writing (request threads): each run is queued first and then appended, as one record (its
length, then the tuple in ``marshal``: about a microsecond, against several for its COPY line,
which the history thread makes), with one ``write(2)`` to the current segment, opened
``O_APPEND`` (the kernel places each write whole, so request threads share no lock). The
history thread rotates to a new segment right before it drains the queue; a run written to a
retired segment was queued before the rotation, so it is in that drain's batches, and the
retired segments are deleted once every drained batch is committed (``HistoryWriter``). A write
that lands in a retired segment late is redundant.

Claiming (the history thread of any worker of the same home on this host): a worker holds
``flock`` on its folder's lock file for its whole life, and the kernel drops it when the process
dies, however it dies; a folder whose lock can be taken is an orphan. ``replay`` copies its
runs (as COPY lines) into a temporary table and inserts those the store does not hold yet (same time, request
id and worker: a batch committed just before the kill is not stored twice), then the folder
is removed. A folder is made under a dot-name and renamed into place with its lock held, so
no one claims it while it is being made. The folders are the user's own (mode 0700): ``marshal``
reads only what a worker of the same user wrote.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import logging
import marshal
import os
import shutil
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psycopg2.extensions

_LENGTH = struct.Struct("<I")
# What one worker's spool may hold. Normally two flush intervals of runs (kilobytes); it grows
# only while the store is unreachable, and tmpfs is memory (64 MiB by default in a container,
# shared with everything else there): past this, newer runs wait in memory only (counted).
MAX_BYTES = 8 * 1024 * 1024
LOCK = "lock"
SUFFIX = ".spool"
COLUMNS = "at, request_id, key_id, query, version, status, code, row_count, duration_ms, worker, admitted"


def default_root(home: str) -> Path:
    """Under ``/dev/shm`` (memory: a write is a copy, never a disk stall), one folder per home,
    so every master of one ``fleet up`` shares it and a restarted one finds its predecessor's
    spools; ``<home>/run/spool`` where there is no ``/dev/shm``."""
    digest = hashlib.sha256(os.path.abspath(home).encode()).hexdigest()[:12]
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return Path("/dev/shm") / f"gateway-fleet-{os.getuid()}-{digest}"
    return Path(home).resolve() / "run" / "spool"


def spool_folder(setting: str, home: str) -> Path | None:
    """``GATEWAY_HISTORY_SPOOL`` read: None with the spool ``off``."""
    if setting == "off":
        return None
    return Path(setting) if setting else default_root(home)


def _lock(path: Path) -> int | None:
    """The file at ``path`` opened and locked, or None when another process holds it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


class Spool:
    """The spool of one worker. ``file`` is the segment request threads append to (read once
    per write: the history thread swaps it)."""

    __slots__ = ("root", "path", "file", "full", "_lock_fd", "_seq", "_retired", "_closing", "_max")

    def __init__(self, root: Path, worker: str, max_bytes: int = MAX_BYTES) -> None:
        self.root = root
        self.full = False         # set by the history thread (``bound``) past ``max_bytes``
        self._max = max_bytes
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        name = f"{worker.replace('/', '_').replace(':', '-')}-{uuid.uuid4().hex[:8]}"
        making = root / f".{name}"
        making.mkdir(mode=0o700)
        fd = _lock(making / LOCK)
        if fd is None:
            raise OSError(f"cannot lock {making / LOCK}")
        self._lock_fd = fd
        self.path = root / name
        os.rename(making, self.path)
        self._seq = 0
        self.file = self._open()
        self._retired: list[io.FileIO] = []    # rotated out, deleted once their lines are stored
        self._closing: list[io.FileIO] = []    # deleted, closed at the next release

    def _open(self) -> io.FileIO:
        self._seq += 1
        return io.FileIO(str(self.path / f"{self._seq:08d}{SUFFIX}"), "a")   # O_APPEND

    def write(self, run: tuple) -> bool:
        """Append one run (request threads). False when it could not be written (the spool's
        file system is full, or a late write met a segment already closed)."""
        if self.full:
            return False
        try:
            # Version 2: no back-references. Versions 3 and 4 keep a hash table of every object
            # written, to share repeats a flat run tuple never has: a third of the dumps' time
            # (300 against 200 ns here). marshal.loads reads every version.
            data = marshal.dumps(run, 2)
            self.file.write(_LENGTH.pack(len(data)) + data)
            return True
        except (OSError, ValueError):
            return False

    def bound(self) -> None:
        """Note whether the spool is past its bound (the history thread, every flush)."""
        self.full = sum(os.fstat(f.fileno()).st_size for f in [self.file, *self._retired]) > self._max

    def rotate(self) -> None:
        """Start a new segment (before a drain), when the current one holds anything."""
        current = self.file
        if os.fstat(current.fileno()).st_size == 0:
            return
        try:
            self.file = self._open()
        except OSError:
            return      # no new file (tmpfs full): keep appending to this one, deleted later
        self._retired.append(current)

    def release(self) -> None:
        """Every line of the retired segments is stored: delete them. A file is closed one
        release later, so a request thread that read ``file`` just before a rotation never
        writes to a descriptor number already reused."""
        for f in self._closing:
            f.close()
        self._closing = self._retired
        self._retired = []
        for f in self._closing:
            with contextlib.suppress(OSError):
                os.unlink(f.name)

    def close(self) -> None:
        """Everything queued is stored (a graceful stop): remove the folder and let go of it."""
        for f in [*self._closing, *self._retired, self.file]:
            f.close()
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._lock_fd)
        with contextlib.suppress(OSError):
            self.root.rmdir()    # the last worker of the home leaves nothing behind


def open_spool(root: Path, worker: str) -> Spool | None:
    """The worker's spool, or None (logged) when its folder cannot be made: the worker then
    serves without one, as with ``GATEWAY_HISTORY_SPOOL=off``, rather than not at all."""
    try:
        return Spool(root, worker)
    except OSError as exc:
        logging.getLogger("gateway.history").error("history: no crash spool in %s (%s): a crash of this "
                                                   "worker loses the runs not yet stored", root, exc)
        return None


class Orphan:
    """A dead worker's spool, claimed: its lock is held until ``done``."""

    __slots__ = ("path", "_fd")

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd

    def runs(self) -> list[tuple]:
        """Its runs, in order; a last record cut short (the process died inside that write:
        that run's call was never answered) is left out."""
        runs: list[tuple] = []
        try:
            segments = sorted(p for p in self.path.iterdir() if p.name.endswith(SUFFIX))
        except OSError:
            return runs
        for segment in segments:
            try:
                data = segment.read_bytes()
            except OSError:
                continue
            at, size = 0, _LENGTH.size
            while at + size <= len(data):
                (length,) = _LENGTH.unpack_from(data, at)
                if at + size + length > len(data):
                    break
                try:
                    runs.append(marshal.loads(data[at + size:at + size + length]))
                except (ValueError, EOFError, TypeError):
                    break
                at += size + length
        return runs

    def done(self, remove: bool) -> None:
        if remove:
            shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._fd)


def orphans(root: Path, own: Path | None = None) -> Iterator[Orphan]:
    """The spools under ``root`` whose worker is gone, each claimed while it is handled."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return
    for name in names:
        path = root / name
        if name.startswith(".") or path == own:
            continue
        fd = _lock(path / LOCK)
        if fd is None:
            continue     # alive, or claimed by another worker
        if not path.is_dir():
            os.close(fd)
            continue
        yield Orphan(path, fd)


_REPLAY = f"""
CREATE TEMP TABLE gw_spool_replay ON COMMIT DROP AS SELECT {COLUMNS} FROM gw_run_history WITH NO DATA;
"""
_INSERT = f"""
INSERT INTO gw_run_history ({COLUMNS})
SELECT {COLUMNS} FROM gw_spool_replay t
WHERE NOT EXISTS (SELECT 1 FROM gw_run_history h
                  WHERE h.at = t.at AND h.request_id = t.request_id AND h.worker = t.worker)
"""


def replay(conn: psycopg2.extensions.connection, text: str) -> int:
    """Store the runs of ``text`` (COPY lines, ``history.copy_line``) that the store does not hold yet, in one
    transaction; returns how many were inserted. ``conn`` is in autocommit mode."""
    if not text:
        return 0
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        try:
            cur.execute(_REPLAY)
            cur.copy_expert(f"COPY gw_spool_replay ({COLUMNS}) FROM STDIN", io.StringIO(text))
            cur.execute(_INSERT)
            inserted = cur.rowcount
            cur.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(Exception):
                cur.execute("ROLLBACK")
            raise
    return inserted
