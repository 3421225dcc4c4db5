"""Runs a saved query version on a pooled session, in one round trip.

A session prepares each statement once (``PREPARE`` travels in the same simple-query
message as the first ``EXECUTE``), and a caller's lower ``timeout`` is a ``SET LOCAL`` in
that same message, so every call is exactly one round trip to the data database.
"""
from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Sequence
from typing import TYPE_CHECKING, TypeVar, cast

import psycopg2
import psycopg2.errorcodes
import psycopg2.errors
import psycopg2.extensions

from ..errors import GatewayError, bad_request, forbidden, unavailable
from ..model.catalog import Connection, QueryVersion
from . import values
from .bulkhead import Bulkheads
from .formats import unique_names
from .pool import Session, SessionPool, session_options

if TYPE_CHECKING:
    from ..crypto import PasswordBox
    from ..settings import Settings

Batches = Generator[list[tuple], None, None]   # a stream's row batches (close() ends it early)

T = TypeVar("T")

class Result:
    __slots__ = ("columns", "rows", "rowcount")

    def __init__(self, columns: tuple[str, ...], rows: list[tuple], rowcount: int) -> None:
        self.columns = columns
        self.rows = rows
        self.rowcount = rowcount


class Pools:
    """This worker's pools, one per connection and access mode, reused across reloads
    while the connection's settings are unchanged; and each connection's bulkhead (the
    threads its calls may hold, reads and writes together: ``bulkhead.py``)."""

    __slots__ = ("_settings", "_box", "_pools", "bulkheads")

    def __init__(self, settings: Settings, password_box: PasswordBox) -> None:
        self._settings = settings
        self._box = password_box
        self._pools: dict[tuple, SessionPool] = {}
        self.bulkheads = Bulkheads(settings)

    def get(self, connection: Connection, writable: bool) -> SessionPool:
        key = (connection.identity, writable)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools.setdefault(key, SessionPool(
                self._connect_kwargs(connection, writable), self._settings.effective_pool_size(),
                configure=values.configure))
        return pool

    def _connect_kwargs(self, connection: Connection, writable: bool) -> dict:
        return {**connection.driver, "host": connection.host, "port": connection.port, "dbname": connection.database,
                "user": connection.username, "password": self._box.open(connection.password) or None,
                "connect_timeout": self._settings.connect_timeout_s,
                "application_name": "gateway-fleet",
                "options": session_options(self._settings.statement_timeout_ms, read_only=not writable,
                                           search_path=self._settings.search_path)}

    def open_sessions(self) -> int:
        return sum(pool.open_count for pool in list(self._pools.values()))

    def retire_unused(self, connections: Iterable[Connection]) -> None:
        """After a reload: close pools whose connection was changed or deleted."""
        connections = list(connections)
        self.bulkheads.retire_unused(connections)
        live = {c.identity for c in connections}
        # list() copies the keys in one step (request threads may add a pool meanwhile);
        # a pool closed here still takes back the sessions in use and closes them.
        for key in list(self._pools):
            if key[0] not in live:
                pool = self._pools.pop(key, None)
                if pool is not None:
                    pool.close()

    def close(self) -> None:
        for pool in list(self._pools.values()):
            pool.close()
        self._pools.clear()


def _prefix(session: Session, qv: QueryVersion, timeout_ms: int | None) -> tuple[str, bool]:
    parts, preparing = [], qv.statement not in session.prepared
    if timeout_ms is not None:
        parts.append(f"SET LOCAL statement_timeout = {int(timeout_ms)}; ")
    if preparing:
        parts.append(qv.prepare_sql + "; ")
    return "".join(parts), preparing


class _Dead(Exception):
    """The session's connection is gone (the server restarted, the network dropped it)."""

    def __init__(self, error: psycopg2.Error) -> None:
        super().__init__(str(error))
        self.error = error


def _healing(pool: SessionPool, write: bool, attempt: Callable[[], T]) -> T:
    """Run ``attempt`` on a pooled session; when its connection turns out dead, the pool's
    idle sessions are dropped (they died with it) and a read runs once more on a fresh one,
    so a restart of the data database costs callers no more than its own duration. A write
    is never run twice: whether it reached the server cannot be known."""
    try:
        return attempt()
    except _Dead as dead:
        pool.discard_idle()
        if write:
            raise translate(dead.error) from None
    try:
        return attempt()
    except _Dead as dead:
        pool.discard_idle()
        raise translate(dead.error) from None


def execute(pool: SessionPool, qv: QueryVersion, args: tuple, timeout_ms: int | None) -> Result:
    """Reads: one round trip. Writes: the statement inside BEGIN (same message), then COMMIT,
    or ROLLBACK when it touched more than the query's ``max_affected_rows``."""
    return _healing(pool, qv.kind == "write", lambda: _execute(pool, qv, args, timeout_ms))


def _execute(pool: SessionPool, qv: QueryVersion, args: tuple, timeout_ms: int | None) -> Result:
    session = pool.acquire()
    broken = False
    preparing = False
    write = qv.kind == "write"
    cur = session.cursor
    try:
        prefix, preparing = _prefix(session, qv, timeout_ms)
        if write:
            prefix = "BEGIN; " + prefix
        cur.execute(prefix + qv.execute_sql if prefix else qv.execute_sql, args)
        if preparing:
            session.prepared.add(qv.statement)
        columns = _columns(session, qv, cur.description)
        result = Result(columns, cur.fetchall() if columns else [], cur.rowcount)
        if write:
            _finish_write(cur, qv, result.rowcount)
        return result
    except psycopg2.Error as exc:
        broken = _is_broken(exc)
        if broken:
            raise _Dead(exc) from None
        if preparing:
            _learn_prepared(session, qv)
        raise translate(exc) from None
    finally:
        _give_back(pool, session, broken)


def execute_text(pool: SessionPool, sql: str, timeout_ms: int | None, write: bool) -> Result:
    """An ad-hoc statement, analysed, its values already bound as checked literals
    (``gateway.sql.Template``): one round trip for a read; a write inside BEGIN ... COMMIT."""
    return _healing(pool, write, lambda: _execute_text(pool, sql, timeout_ms, write))


def _execute_text(pool: SessionPool, sql: str, timeout_ms: int | None, write: bool) -> Result:
    session = pool.acquire()
    broken = False
    cur = session.cursor
    try:
        _literals_read_as_written(session)
        prefix = f"SET LOCAL statement_timeout = {int(timeout_ms)}; " if timeout_ms is not None else ""
        if write:
            prefix = "BEGIN; " + prefix
        cur.execute(prefix + sql)       # no arguments: psycopg2 leaves the text as it is
        columns = () if cur.description is None else tuple(unique_names(d.name for d in cur.description))
        result = Result(columns, cur.fetchall() if columns else [], cur.rowcount)
        if write:
            cur.execute("COMMIT")
        return result
    except psycopg2.Error as exc:
        broken = _is_broken(exc)
        if broken:
            raise _Dead(exc) from None
        raise translate(exc) from None
    finally:
        _give_back(pool, session, broken)


def _literals_read_as_written(session: Session) -> None:
    """Literals in statement text are written for standard_conforming_strings = on and in
    UTF-8, the settings every data session pins (pool.session_options); the server reports
    both to the client (no round trip). Should anything have changed them, nothing runs."""
    info = session.conn.info
    if info.parameter_status("standard_conforming_strings") != "on" or \
            info.parameter_status("client_encoding") != "UTF8":
        raise unavailable("database_unavailable", "the data session does not read strings as the gateway writes "
                          "them (standard_conforming_strings off, or a client encoding other than UTF-8); "
                          "nothing was run")


def _give_back(pool: SessionPool, session: Session, broken: bool) -> None:
    """Return a session to its pool, rolling back a transaction a failed write left open."""
    if not broken and session.conn.info.transaction_status != psycopg2.extensions.TRANSACTION_STATUS_IDLE:
        try:
            session.cursor.execute("ROLLBACK")
        except psycopg2.Error:
            broken = True
    pool.release(session, broken)


def _columns(session: Session, qv: QueryVersion, description: Sequence | None) -> tuple[str, ...]:
    """A statement prepared on a session keeps its result columns for the session's life
    (PostgreSQL refuses to run it once they would change): name them once per session and
    statement. Not per query version: a session that prepares the statement after its
    table changed shape gets other columns, and the masks must see their real names."""
    if description is None:
        return ()
    columns = session.columns.get(qv.statement)
    if columns is None or len(columns) != len(description):
        columns = session.columns[qv.statement] = tuple(unique_names(d.name for d in description))
    return columns


def _finish_write(cur: psycopg2.extensions.cursor, qv: QueryVersion, rowcount: int) -> None:
    limit = qv.max_affected_rows
    if limit is not None and rowcount > limit:
        cur.execute("ROLLBACK")
        raise bad_request("too_many_rows_affected",
                          f"the write touched {rowcount} rows, more than its max_affected_rows of {limit}; "
                          "nothing was changed", rows_affected=rowcount)
    cur.execute("COMMIT")


def stream(pool: SessionPool, sql: str, timeout_ms: int | None, fetch_rows: int) -> tuple[tuple[str, ...], Batches]:
    """Open a server-side cursor over ``sql`` (its values already bound as checked
    literals); returns the column names and a generator of row batches that holds the
    session until it is exhausted or closed. Opening it heals like a read (nothing has been
    sent to the caller yet)."""
    return _healing(pool, False, lambda: _open_stream(pool, sql, timeout_ms, fetch_rows))


def _open_stream(pool: SessionPool, sql: str, timeout_ms: int | None,
                 fetch_rows: int) -> tuple[tuple[str, ...], Batches]:
    session = pool.acquire()
    conn = session.conn
    try:
        _literals_read_as_written(session)
        conn.autocommit = False
        if timeout_ms is not None:
            session.cursor.execute(f"SET LOCAL statement_timeout = {int(timeout_ms)}")
        cur = conn.cursor(name=f"gw_stream_{id(session):x}")
        cur.itersize = fetch_rows
        cur.execute(sql)                # no arguments: psycopg2 leaves the text as it is
        first = cur.fetchmany(fetch_rows)
        columns = tuple(unique_names(d.name for d in cur.description))
    except psycopg2.Error as exc:
        broken = _is_broken(exc)
        _end_stream(pool, session, broken)
        if broken:
            raise _Dead(exc) from None
        raise translate(exc) from None
    except GatewayError:
        _end_stream(pool, session, False)
        raise
    except BaseException:
        _end_stream(pool, session, True)
        raise
    return columns, cast(Batches, _Batches(pool, session, cur, first, fetch_rows))


class _Batches:
    """A stream's batches, holding its session: ``close()`` gives the session back even when
    no batch was asked for yet (a refusal after the cursor was opened, a client gone before
    the first chunk), which a generator's ``finally`` would not do (it never started)."""

    __slots__ = ("_gen", "_pool", "_session", "_started")

    def __init__(self, pool: SessionPool, session: Session, cur: psycopg2.extensions.cursor, first: list[tuple],
                 fetch_rows: int) -> None:
        self._gen = _batches(pool, session, cur, first, fetch_rows)
        self._pool: SessionPool | None = pool
        self._session: Session | None = session
        self._started = False

    def __iter__(self) -> _Batches:
        return self

    def __next__(self) -> list[tuple]:
        self._started = True
        return next(self._gen)

    def close(self) -> None:
        if self._started:
            self._gen.close()          # its finally gives the session back (once)
        elif self._session is not None and self._pool is not None:
            session, self._session = self._session, None
            _end_stream(self._pool, session, True)   # a cursor never read: the session is not reused


def _batches(pool: SessionPool, session: Session, cur: psycopg2.extensions.cursor, first: list[tuple],
             fetch_rows: int) -> Batches:
    broken = True
    try:
        rows = first
        while rows:
            yield rows
            if len(rows) < fetch_rows:
                break
            rows = cur.fetchmany(fetch_rows)
        cur.close()
        broken = False
    except psycopg2.Error as exc:
        # Rows were sent already: the caller's stream is cut (gateway.pipeline logs why, with
        # the request id); the server's text, which can quote values, goes no further than that.
        broken = _is_broken(exc)
        raise translate(exc) from None
    finally:
        # A client that hangs up mid-stream closes the generator: the transaction is rolled back.
        _end_stream(pool, session, broken)


def _end_stream(pool: SessionPool, session: Session, broken: bool) -> None:
    conn = session.conn
    try:
        if not broken and not conn.closed:
            conn.rollback()
            conn.autocommit = True
    except psycopg2.Error:
        broken = True
    pool.release(session, broken)


def _learn_prepared(session: Session, qv: QueryVersion) -> None:
    # PREPARE is not undone when a later statement of the same message fails; ask once, on
    # this error path only, whether it stuck.
    try:
        session.cursor.execute("SELECT 1 FROM pg_prepared_statements WHERE name = %s", (qv.statement,))
        if session.cursor.fetchone():
            session.prepared.add(qv.statement)
    except psycopg2.Error:
        pass


def _is_broken(exc: psycopg2.Error) -> bool:
    return isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError)) and \
        not isinstance(exc, psycopg2.errors.QueryCanceled)


def translate(exc: psycopg2.Error) -> GatewayError:
    if isinstance(exc, psycopg2.errors.QueryCanceled):
        return GatewayError(504, "query_timeout", "the statement ran past its timeout and was cancelled")
    if isinstance(exc, psycopg2.errors.ReadOnlySqlTransaction):
        return forbidden("write_not_allowed", "this session is read-only")
    if _is_broken(exc):
        return unavailable("database_unavailable", "the data database cannot be reached").with_detail(
            server_message(exc))
    # The server's message can quote the values it choked on (a masked column's among them:
    # 'invalid input syntax for type integer: "alan@..."'): the caller gets the SQLSTATE and
    # its condition name, the log gets the message, with the request id.
    code = exc.pgcode or "XX000"
    condition = (psycopg2.errorcodes.lookup(code) or "error").lower() if exc.pgcode else "error"
    return bad_request("query_failed", f"the database rejected the statement ({condition}, SQLSTATE {code})",
                       sqlstate=code, condition=condition).with_detail(server_message(exc))


def server_message(exc: psycopg2.Error) -> str:
    """The server's whole report, for the log: the message and its DETAIL (a constraint's
    ``Key (email)=(...) already exists``), HINT and CONTEXT (a function's RAISE), each of
    which can quote values; never for the caller."""
    diag = exc.diag
    primary = diag.message_primary if diag else None
    if not primary:
        return str(exc).strip()
    parts = [primary.strip()]
    for label, text in (("DETAIL", diag.message_detail), ("HINT", diag.message_hint), ("CONTEXT", diag.context)):
        if text:
            parts.append(f"{label}: {text.strip()}")
    return "\n".join(parts)
