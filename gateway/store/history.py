"""Run history, written off the hot path.

A call appends one tuple to an in-memory queue (no I/O, no lock beyond the deque's own);
a background thread writes batches to the store with ``COPY`` (measured: formatting rows
for ``execute_values`` cost the worker about 9% of its CPU at full load; a hand-built
COPY buffer costs a fraction of that). The queue is bounded: under overload the oldest runs are not dropped, new ones
are, and counted, so memory stays bounded and the loss is visible.
"""
from __future__ import annotations

import collections
import io
import logging
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

import psycopg2
import psycopg2.extensions

from ..ports import Run

log = logging.getLogger("gateway.history")

PRUNE_EVERY_S = 3600
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
    and then stores it, retrying the store alone while it is unreachable."""

    __slots__ = ("_connect", "_worker", "_batch", "_flush_s", "_max", "_queue", "_wake", "_stop",
                 "_thread", "_retention_days", "_pruned_at", "_observers", "_unstored", "dropped",
                 "written")

    def __init__(self, connect: Callable[[], psycopg2.extensions.connection], worker: str, batch: int,
                 flush_ms: int, queue_max: int, retention_days: int = 30,
                 observers: Iterable[Callable[[list[Run]], object]] = ()) -> None:
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

    def record(self, request_id: str, key_id: int | None, query: str | None, version: int | None, status: int,
               code: str | None, rows: int | None, duration_ms: float, admitted: bool) -> None:
        if len(self._queue) >= self._max:
            self.dropped += 1
            return
        self._queue.append((time.time(), request_id, key_id, query, version, status, code, rows,
                            duration_ms, self._worker, admitted))

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
                if self._retention_days and time.monotonic() - self._pruned_at > PRUNE_EVERY_S:
                    self._prune(conn)
            except psycopg2.Error:
                log.warning("history: store unreachable, %d runs waiting", self.depth())
                conn = None
                if stopping:
                    return
                self._wake.wait(1)
            if stopping:
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
    period or after Redis lost it, it starts from this (``fleet.leases``), so it is read once
    per key and period, or after a loss, never per call. One connection, opened on first use,
    reopened once when it broke; a caller sees the store's error only when that fails too.
    Runs written before the ``admitted`` column count when they succeeded.
    """

    def __init__(self, connect: Callable[[], psycopg2.extensions.connection]) -> None:
        self._connect = connect
        self._conn: psycopg2.extensions.connection | None = None
        self._lock = threading.Lock()

    def __call__(self, key_id: int, since: float) -> tuple[int, int]:
        with self._lock:
            try:
                return self._read(key_id, since)
            except (psycopg2.OperationalError, psycopg2.InterfaceError):
                self._drop()   # a broken connection (the store restarted): once more on a fresh one
            try:
                return self._read(key_id, since)
            except (psycopg2.OperationalError, psycopg2.InterfaceError):
                self._drop()
                raise

    def _read(self, key_id: int, since: float) -> tuple[int, int]:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
            self._conn.autocommit = True
        with self._conn.cursor() as cur:
            cur.execute(_ADMITTED, (key_id, since))
            calls, rows = cur.fetchone()
        return int(calls), int(rows)

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            try:
                conn.close()
            except psycopg2.Error:
                pass

    def close(self) -> None:
        with self._lock:
            self._drop()
