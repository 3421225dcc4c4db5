"""A small pool of psycopg2 sessions per worker per connection.

Every session is configured once, when it is opened, through libpq's ``options``: read-only
by default and with the server's statement timeout. So a call never spends a round trip on
``SET``. Sessions are handed out last-in first-out, which keeps the warm ones (with their
prepared statements) busy and lets the rest idle.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

import psycopg2
import psycopg2.extensions

from ..errors import unavailable


class Session:
    __slots__ = ("conn", "cursor", "prepared", "columns")

    def __init__(self, conn: psycopg2.extensions.connection) -> None:
        self.conn = conn
        self.cursor = conn.cursor()
        self.prepared: set[str] = set()          # statements prepared on this session
        self.columns: dict[str, tuple] = {}      # their result column names (see runner._columns)


class SessionPool:
    __slots__ = ("_connect_kwargs", "_configure", "_size", "_idle", "_open", "_cond", "_closed", "wait_s")

    def __init__(self, connect_kwargs: dict, size: int, wait_s: float = 5.0,
                 configure: Callable[[psycopg2.extensions.connection], None] | None = None) -> None:
        self._connect_kwargs = connect_kwargs
        self._configure = configure
        self._size = size
        self._idle: list[Session] = []
        self._open = 0
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self.wait_s = wait_s

    def acquire(self) -> Session:
        with self._cond:
            while True:
                if self._idle:
                    return self._idle.pop()
                if self._open < self._size:
                    self._open += 1
                    break
                if not self._cond.wait(self.wait_s):
                    raise unavailable("pool_exhausted", "every database session of this worker is busy")
        return self._open_counted()

    def take_idle(self) -> Session | None:
        """An idle session while another one stays idle for the calls, else None (never opens
        one, never waits): for work that has a way of its own and must neither grow the pool
        nor make a call open a session, as a schema read."""
        with self._cond:
            return self._idle.pop(0) if len(self._idle) > 1 else None

    def _open_counted(self) -> Session:
        """Open the session already counted in ``_open``; uncounted again if that fails."""
        try:
            return self._connect()
        except BaseException:
            with self._cond:
                self._open -= 1
                self._cond.notify()
            raise

    def _connect(self) -> Session:
        try:
            conn = psycopg2.connect(**self._connect_kwargs)
        except psycopg2.OperationalError as exc:
            # Why (refused, no such database, a password rejected) is for the log, not the caller.
            raise unavailable("database_unavailable", "the data database cannot be reached").with_detail(
                str(exc).strip()) from None
        conn.autocommit = True
        if self._configure is not None:
            self._configure(conn)
        return Session(conn)

    @property
    def open_count(self) -> int:
        return self._open

    def release(self, session: Session, broken: bool = False) -> None:
        if not broken and session.conn.closed == 0 and \
                session.conn.info.transaction_status == psycopg2.extensions.TRANSACTION_STATUS_IDLE:
            with self._cond:
                if not self._closed:
                    self._idle.append(session)
                    self._cond.notify()
                    return
        self._discard(session)

    def _discard(self, session: Session) -> None:
        try:
            session.conn.close()
        except Exception:
            pass
        with self._cond:
            self._open -= 1
            self._cond.notify()

    def discard_idle(self) -> None:
        """One session was found dead: the server was likely restarted, and every idle
        session opened before is dead too. Close them all, so the next calls open fresh
        ones instead of each finding a dead one."""
        with self._cond:
            idle, self._idle = self._idle, []
        for session in idle:
            self._discard(session)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
        for session in idle:
            self._discard(session)


def session_options(statement_timeout_ms: int, read_only: bool, search_path: str = "public") -> str:
    # The search path is pinned: the analysis resolved table names through it.
    path = search_path.replace(" ", "").replace(",", "\\,")
    # standard_conforming_strings is pinned on: gateway.sql reads and writes literals that
    # way, so the server must too, whatever the database's or the role's default. The client
    # encoding is pinned to UTF-8, the text gateway.sql reads: in a database of another
    # encoding (LATIN1, SQL_ASCII) the driver would otherwise encode values and statements
    # itself and fail on a character it cannot encode (a 500); the server's conversion
    # refuses such a character with its SQLSTATE (22P05) instead.
    # The texts values are answered in (gateway.execution.values) are pinned too, whatever the
    # database's defaults: bytea as \x hex, floats in their shortest exact text (any positive
    # extra_float_digits since PostgreSQL 12; 17 digits, exact too, before), intervals in the
    # postgres style.
    opts = (f"-c statement_timeout={int(statement_timeout_ms)} -c idle_in_transaction_session_timeout=60000"
            f" -c search_path={path} -c standard_conforming_strings=on -c client_encoding=UTF8"
            " -c bytea_output=hex -c extra_float_digits=3 -c IntervalStyle=postgres")
    if read_only:
        opts += " -c default_transaction_read_only=on"
    return opts
