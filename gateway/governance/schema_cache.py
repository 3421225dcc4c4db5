"""The data databases' schemas, for the analysis (``gateway.governance``).

Saving a query reads its connection's schema afresh (a management call may wait for it; a
call of a saved query never does: its analysis was stored with it). Ad-hoc statements use the copy
each worker keeps: read in the background when the worker starts and when a change brings a
new or changed connection, refreshed in the background once older than ``ttl_s``; only a
statement that arrives before the first read has finished waits for it.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import psycopg2

from ..errors import GatewayError, unavailable
from .schema import Kin, Schema, load_schema

if TYPE_CHECKING:
    from ..crypto import PasswordBox
    from ..execution.runner import Pools
    from ..model.catalog import Connection
    from ..settings import Settings

log = logging.getLogger("gateway.schemas")


class SchemaCache:
    def __init__(self, settings: Settings, password_box: PasswordBox, ttl_s: float = 30.0,
                 pools: Pools | None = None) -> None:
        """``pools``: the worker's session pools, whose read sessions the reads borrow when one
        is free (else a read opens a session of its own)."""
        self._settings = settings
        self._pools = pools
        self._box = password_box
        self._ttl_s = ttl_s
        self._schemas: dict[tuple, tuple[float, Schema]] = {}
        self._kin: dict[tuple, Kin] = {}
        self._tried: dict[tuple, float] = {}   # when kin() last started a read, per connection
        self._kin_until: dict[tuple, tuple[float, Kin]] = {}   # (fresh until, kin), per connection
        self._lock = threading.Lock()
        self._loading: set = set()      # read under way or queued by ``warm``, per connection
        self._queued: dict[tuple, Connection] = {}   # ``warm``'s reads not yet begun, in order
        self._threads: list[threading.Thread] = []   # reads behind, joined by ``close``
        self._closed = False

    def _load(self, connection: Connection) -> Schema:
        # When the read began: a read that began earlier and ends later (a warm-up slowed by
        # load, behind a save's own read) must not replace the newer copy.
        began, began_wall = time.monotonic(), time.time()
        schema = self._read_pooled(connection)
        if schema is None:
            schema = self._read_own(connection)
        kin = schema.kinship()
        identity = connection.identity
        with self._lock:
            held = self._schemas.get(identity)
            if held is not None and held[0] > began:   # a newer read is in already
                return held[1]
            self._schemas[identity] = (began, schema)
            if self._kin.get(identity) != kin:   # an unchanged schema keeps its object
                self._kin[identity] = kin
            kept = self._kin[identity]
            kept.read_at = max(kept.read_at, began_wall)
            self._kin_until[identity] = (began + self._ttl_s, kept)
        return schema

    def _read_pooled(self, connection: Connection) -> Schema | None:
        """On an idle read session of the connection's pool (same role, options and search path
        as the calls'), given back after: opening a session costs both sides about 4 ms of CPU
        (SCRAM), and a worker reads each schema again every ``ttl_s`` while it is called. None
        when there are no pools here or fewer than two idle sessions (the read opens its own: it
        never adds a session to a pool, nor takes the one a call would find)."""
        if self._pools is None:
            return None
        pool = self._pools.get(connection, False)
        session = pool.take_idle()
        if session is None:
            return None
        broken = True
        try:
            with session.conn.cursor() as cur:
                cur.execute("SET statement_timeout = 0")      # the calls' timeout is not the read's
                schema = load_schema(session.conn, self._settings.search_path_tuple())
                cur.execute("RESET statement_timeout")       # back to the session's own (its options)
            broken = False
            return schema
        except (psycopg2.OperationalError, psycopg2.InterfaceError):
            # A session that died idle (the server restarted): so did the others opened before
            # it; the read is made on a fresh session of its own.
            pool.discard_idle()
            return None
        finally:
            pool.release(session, broken=broken)

    def _read_own(self, connection: Connection) -> Schema:
        """On a session of its own, closed after."""
        try:
            conn = psycopg2.connect(**connection.driver,
                                    host=connection.host, port=connection.port, dbname=connection.database,
                                    user=connection.username, password=self._box.open(connection.password) or None,
                                    connect_timeout=self._settings.connect_timeout_s,
                                    application_name="gateway-fleet-schema",
                                    options=f"-c search_path={self._settings.search_path.replace(' ', '')}")
        except psycopg2.OperationalError:
            raise self._unreachable(connection) from None
        try:
            conn.set_session(readonly=True, autocommit=True)
            return load_schema(conn, self._settings.search_path_tuple())
        finally:
            conn.close()

    @staticmethod
    def _unreachable(connection: Connection) -> GatewayError:
        return unavailable("database_unavailable", f"connection '{connection.name}' cannot be reached to "
                           "read its schema")

    def fresh(self, connection: Connection) -> Schema:
        """For saving a query: read now. A table or function created a moment ago must be
        seen (a user-defined function missed here would pass as a built-in one)."""
        return self._load(connection)

    def kin_now(self, connection: Connection, wait_s: float) -> Kin | None:
        """For a starting worker (``gateway.warmup``): the trees as ``kin`` gives them, read now
        if there is no copy yet. A read already under way is waited for, at most ``wait_s``,
        rather than made twice; one that ``warm`` has only queued is taken out of its queue and
        made now: behind hundreds of connections (some unreachable, each a connect timeout)
        the hot one would come too late for the warm-up."""
        with self._lock:
            queued = self._queued.pop(connection.identity, None)
        if queued is not None:
            self._reload_behind(connection)
        deadline = time.monotonic() + wait_s
        while connection.identity in self._loading and time.monotonic() < deadline:
            time.sleep(0.005)
        if self._kin.get(connection.identity) is None and connection.identity not in self._loading:
            self.fresh(connection)
        return self.kin(connection)

    def warm(self, connections: Iterable[Connection]) -> None:
        """In the background: read the schema of every active connection this worker has no
        copy of yet (at start, and after a change brings a new or changed connection), so
        an ad-hoc statement does not wait for it. One read at a time, in order; ``kin_now``
        takes one still queued out of the line."""
        missing = [c for c in connections if c.active and c.identity not in self._schemas
                   and c.identity not in self._loading]
        if not missing:
            return
        with self._lock:
            self._loading.update(c.identity for c in missing)
            self._queued.update((c.identity, c) for c in missing)
        self._behind(self._drain, "gateway-schemas")

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queued or self._closed:
                    return
                connection = self._queued.pop(next(iter(self._queued)))
            self._reload_behind(connection)

    def for_adhoc(self, connection: Connection) -> Schema:
        """For an ad-hoc statement: the worker's copy. Only the first statement on a
        connection waits for it; a stale copy is served while a fresh one loads behind."""
        held = self._schemas.get(connection.identity)
        if held is None:
            return self._load(connection)
        if time.monotonic() - held[0] >= self._ttl_s and connection.identity not in self._loading:
            self._read_behind(connection)
        return held[1]

    def kin(self, connection: Connection) -> Kin | None:
        """For every call: the connection's inheritance and partition trees as last read
        (``gateway.governance.schema.kinship``; the same object while they are unchanged), or
        None before the first read. Never waits: a stale copy is read again behind, as for
        ad-hoc statements, so a partition attached after a query was saved counts within
        ``ttl_s`` of the change."""
        fresh = self._kin_until.get(connection.identity)
        if fresh is not None and fresh[0] > time.monotonic():   # the hot path: one lookup, one clock read
            return fresh[1]
        return self._kin_stale(connection)

    def _kin_stale(self, connection: Connection) -> Kin | None:
        identity = connection.identity
        held = self._schemas.get(identity)
        now = time.monotonic()
        if (held is None or now - held[0] >= self._ttl_s) and identity not in self._loading \
                and now - self._tried.get(identity, -self._ttl_s) >= self._ttl_s:   # a failing read: once a ttl
            self._tried[identity] = now
            self._read_behind(connection)
        return self._kin.get(identity)

    def _read_behind(self, connection: Connection) -> None:
        """Read the connection's schema again on a thread of its own; the caller goes on with
        the copy it has."""
        self._loading.add(connection.identity)
        self._behind(lambda: self._reload_behind(connection), "gateway-schema")

    def _behind(self, target: Callable[[], object], name: str) -> None:
        with self._lock:
            if self._closed:
                return
            self._threads = [t for t in self._threads if t.is_alive()]
            thread = threading.Thread(target=target, name=name, daemon=True)
            self._threads.append(thread)
        thread.start()

    def close(self, wait_s: float = 2.0) -> None:
        """No read starts after this; those under way are waited for, ``wait_s`` at most. A
        daemon thread still inside libpq when the interpreter exits can crash it (a worker's
        exit, a test's process: SIGSEGV after its work was done, seen in CI)."""
        with self._lock:
            self._closed = True
            self._queued.clear()
            threads = list(self._threads)
        deadline = time.monotonic() + wait_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _reload_behind(self, connection: Connection) -> None:
        try:
            self._load(connection)
        except Exception as exc:  # unreachable: keep serving the copy we have
            log.warning("schema of connection %s not refreshed: %s", connection.name, exc)
        finally:
            self._loading.discard(connection.identity)
