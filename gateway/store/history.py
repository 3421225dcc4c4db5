"""Run history, written off the hot path.

A call appends one tuple to an in-memory queue (no lock beyond the deque's own) and, with a
spool (``spool.py``), the same run to the worker's crash spool (``marshal``, one ``write(2)`` to
tmpfs, no lock; measured with ``loadtests/recordcost.py``); a background thread writes batches
to the store with ``COPY`` (measured: formatting rows for ``execute_values`` cost the worker
about 9% of its CPU at full load; a hand-built COPY buffer costs a fraction of that, and it is
made here, off the request path) and, every second, stores the spools of dead workers.
The queue is bounded: under overload the oldest runs are not dropped, new ones are, and
counted, so memory stays bounded and the loss is visible.

What a crash loses: with the spool, nothing a caller was answered (a run is recorded before
its answer is sent), as long as a worker of the same home on this host starts or runs after
it (the dead worker's replacement does); without it, or when the host itself goes down, the
runs not yet stored: those of the last ``flush_ms`` and the batch being written.
"""
from __future__ import annotations

import collections
import contextlib
import io
import logging
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

import psycopg2
import psycopg2.extensions

from ..ports import Run
from .oneconn import OneConnection
from .spool import Spool, orphans, replay

log = logging.getLogger("gateway.history")

PRUNE_EVERY_S = 3600
REPLAY_EVERY_S = 1.0      # how often the history thread looks for dead workers' spools
_PRUNE_LOCK = 0x6777_6670
_COPY = ("COPY gw_run_history (at, request_id, key_id, query, version, status, code, "
         "row_count, duration_ms, worker, admitted) FROM STDIN")
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r",
                          "\x00": "\ufffd"})  # COPY refuses NUL: one would block every batch
_NULL = "\\N"


class _Clock:
    """Formats run times for COPY, reusing the text of the current second."""

    __slots__ = ("second", "prefix")

    def __init__(self) -> None:
        self.second = -1
        self.prefix = ""

    def text(self, ts: float) -> str:
        second = int(ts)
        if second != self.second:
            self.second = second
            self.prefix = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%d %H:%M:%S")
        return f"{self.prefix}.{int((ts - second) * 1_000_000):06d}+00"


def _opt(value: object) -> str:
    return _NULL if value is None else str(value)


def copy_line(clock: _Clock, run: Run) -> str:
    """One run in COPY's text format. Only the query name can hold arbitrary text (an
    unknown name from a URL), so only it is escaped; ids, codes and numbers are ours."""
    at, rid, key_id, query, version, status, code, rows, duration_ms, worker, admitted = run
    query = _NULL if query is None else query.translate(_ESCAPES)
    return (f"{clock.text(at)}\t{rid}\t{_opt(key_id)}\t{query}\t{_opt(version)}\t{status}\t"
            f"{_opt(code)}\t{_opt(rows)}\t{duration_ms:.3f}\t{worker}\t{'t' if admitted else 'f'}\n")


class HistoryWriter:
    """The run stream of one worker. Request threads only ``record``; the thread hands each
    batch once to the observers (metrics, access log, live events: all off the hot path)
    and then stores it, retrying the store alone while it is unreachable. Runs replayed from a
    dead worker's spool go to the store only (that worker's observers already had them)."""

    __slots__ = ("_connect", "_worker", "_batch", "_flush_s", "_max", "_queue", "_wake", "_stop",
                 "_thread", "_retention_days", "_pruned_at", "_observers", "_unstored", "dropped",
                 "written", "_spool", "_replayed_at", "replayed", "spool_failed")

    def __init__(self, connect: Callable[[], psycopg2.extensions.connection], worker: str, batch: int,
                 flush_ms: int, queue_max: int, retention_days: int = 30,
                 observers: Iterable[Callable[[list[Run]], object]] = (), spool: Spool | None = None) -> None:
        self._connect = connect
        self._worker = worker
        self._batch = batch
        self._flush_s = flush_ms / 1000
        self._max = queue_max
        self._queue: collections.deque[Run] = collections.deque()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._retention_days = retention_days
        self._pruned_at = 0.0
        self._observers = list(observers)
        self._unstored: collections.deque[list[Run]] = collections.deque()
        self.dropped = 0
        self.written = 0
        self._spool = spool
        self._replayed_at = 0.0
        self.replayed = 0         # runs of dead workers this one stored
        self.spool_failed = 0     # runs its spool could not take (the store still gets them)

    def record(self, request_id: str, key_id: int | None, query: str | None, version: int | None, status: int,
               code: str | None, rows: int | None, duration_ms: float, admitted: bool) -> None:
        if len(self._queue) >= self._max:
            self.dropped += 1
            return
        run = (time.time(), request_id, key_id, query, version, status, code, rows, duration_ms, self._worker,
               admitted)
        # Queued before it is spooled: a run in a segment the thread has rotated out is in the
        # queue it drains next (spool.py).
        self._queue.append(run)
        spool = self._spool
        if spool is not None and not spool.write(run):
            self.spool_failed += 1

    def depth(self) -> int:
        return len(self._queue) + sum(map(len, self._unstored))

    def add_observer(self, observer: Callable[[list[Run]], object]) -> None:
        self._observers.append(observer)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gateway-history", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        conn = None
        while True:
            self._wake.wait(self._flush_s)
            self._wake.clear()
            stopping = self._stop
            spool = self._spool
            if spool is not None:
                spool.bound()
                if not self._unstored:
                    spool.rotate()     # what the drain below takes is what the retired segments hold
            self._drain()
            for observer in self._observers:
                tick = getattr(observer, "tick", None)
                if tick is not None:
                    tick()
            try:
                if conn is None or conn.closed:
                    conn = self._connect()
                    conn.autocommit = True  # one COPY is one transaction and one round trip
                while self._unstored:
                    try:
                        self._store(conn, self._unstored[0])
                    except (psycopg2.OperationalError, psycopg2.InterfaceError):
                        raise
                    except psycopg2.Error as exc:
                        # A batch the store refuses (not a lost connection) would be refused
                        # forever: drop it, count it, keep the rest flowing.
                        self.dropped += len(self._unstored[0])
                        log.error("history: the store refused a batch of %d runs (%s); dropped",
                                  len(self._unstored.popleft()), exc)
                        continue
                    self.written += len(self._unstored.popleft())
                if spool is not None:
                    spool.release()     # every batch drained so far is stored
                    if time.monotonic() - self._replayed_at >= REPLAY_EVERY_S:
                        self._replay_orphans(conn, spool)
                if self._retention_days and time.monotonic() - self._pruned_at > PRUNE_EVERY_S:
                    self._prune(conn)
            except psycopg2.Error:
                log.warning("history: store unreachable, %d runs waiting", self.depth())
                conn = None
                if stopping:
                    return     # a spool stays behind: another worker stores it
                self._wake.wait(1)
            if stopping:
                if spool is not None and not self._unstored and not self._queue:
                    spool.close()
                return

    def _drain(self) -> None:
        # Only what is queued now: draining "until empty" while calls keep arriving would
        # cut the stream into many tiny batches (a COPY and an XADD each).
        waiting = len(self._queue)
        while waiting > 0:
            batch = [self._queue.popleft() for _ in range(min(waiting, self._batch))]
            waiting -= len(batch)
            for observer in self._observers:
                try:
                    observer(batch)
                except Exception:
                    log.exception("history: an observer failed")
            self._unstored.append(batch)
        while self._unstored and sum(map(len, self._unstored)) > self._max:
            self.dropped += len(self._unstored.popleft())  # the store has been down too long

    @staticmethod
    def _store(conn: psycopg2.extensions.connection, batch: list[Run]) -> None:
        with conn.cursor() as cur:
            clock = _Clock()
            cur.copy_expert(_COPY, io.StringIO("".join([copy_line(clock, run) for run in batch])))

    def _replay_orphans(self, conn: psycopg2.extensions.connection, spool: Spool) -> None:
        """Store what dead workers of this home recorded and did not store (their spools)."""
        self._replayed_at = time.monotonic()
        for orphan in orphans(spool.root, own=spool.path):
            stored = False
            try:
                clock = _Clock()
                count = replay(conn, "".join([copy_line(clock, run) for run in orphan.runs()]))
                stored = True
            except (psycopg2.OperationalError, psycopg2.InterfaceError):
                raise              # the store went away: the spool waits for the next try
            except psycopg2.Error as exc:
                # Refused (not a lost connection): it would be refused forever. Kept aside
                # under a dot-name for an operator, never tried again.
                log.error("history: the store refused the spool %s (%s); kept as .failed", orphan.path, exc)
                with contextlib.suppress(OSError):
                    orphan.path.rename(orphan.path.with_name(".failed-" + orphan.path.name))
                continue
            finally:
                orphan.done(remove=stored)
            self.replayed += count
            if count:
                log.warning("history: stored %d runs a dead worker had not stored (%s)", count, orphan.path.name)

    def _prune(self, conn: psycopg2.extensions.connection) -> None:
        """Drop runs older than the retention; one worker of the fleet does it at a time."""
        self._pruned_at = time.monotonic()
        with conn.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s)", (_PRUNE_LOCK,))
            if not cur.fetchone()[0]:
                return
            try:
                cur.execute("DELETE FROM gw_run_history WHERE at < now() - make_interval(days => %s)",
                            (self._retention_days,))
                if cur.rowcount:
                    log.info("history: pruned %d runs older than %d days", cur.rowcount, self._retention_days)
            finally:
                cur.execute("SELECT pg_advisory_unlock(%s)", (_PRUNE_LOCK,))

    def close(self, timeout: float = 10.0) -> None:
        """Flush what is queued (graceful shutdown) and stop the thread."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)


# --- what a key was charged in a quota period, read back (quota recovery) --------------------
_ADMITTED = ("SELECT count(*), coalesce(sum(row_count), 0) FROM gw_run_history "
             "WHERE key_id = %s AND at >= to_timestamp(%s) AND coalesce(admitted, status = 200)")


class AdmittedUsage:
    """``usage(key_id, since)`` -> (calls, rows): the calls of a key that passed admission
    since ``since`` (epoch seconds) and the rows they returned, as the history holds them.

    The admission's quota counters live in Redis; when one is (re)created, at the start of a
    period or after Redis lost it, it starts from this (``fleet.shared.leases``), so it is read once
    per key and period, or after a loss, never per call. One connection (``oneconn.OneConnection``).
    Runs written before the ``admitted`` column count when they succeeded.
    """

    def __init__(self, connect: Callable[[], psycopg2.extensions.connection]) -> None:
        self._conn = OneConnection(connect)

    def __call__(self, key_id: int, since: float) -> tuple[int, int]:
        row = self._conn.fetchone(_ADMITTED, (key_id, since))
        calls, rows = row if row else (0, 0)
        return int(calls), int(rows)

    def close(self) -> None:
        self._conn.close()


_RECENT = ("SELECT key_id, query FROM gw_run_history WHERE at > now() - make_interval(secs => %s) "
           "AND key_id IS NOT NULL AND query IS NOT NULL AND status < 400 ORDER BY at DESC LIMIT %s")


def recent_calls(conn: psycopg2.extensions.connection, window_s: float, limit: int) -> collections.Counter:
    """{(key_id, query): calls} over the newest ``limit`` served runs of the last ``window_s``
    (one index scan on ``at``, whatever the rate): what a starting worker warms (``gateway.warmup``)."""
    with conn.cursor() as cur:
        cur.execute(_RECENT, (window_s, limit))
        return collections.Counter(cur.fetchall())
