"""A starting worker's warm-up: what its first calls would pay for, paid before it serves.

A worker that takes over (a reload, a recycled worker, a master restarted) gets its share of
the clients at once, and each of its first calls opened a PostgreSQL session (about 5 ms of CPU
on each side), analysed its query again against the worker's schema copy (about 3 ms), and
compiled Falcon's router: eight first calls at once took 47 ms in one process against 3 ms
warm, and during reloads on a 2-core machine they were the slowest calls of the handover.

So a new worker reads what the fleet called in the last ``warm_window_s`` (the store's run
history, its newest ``HISTORY_ROWS`` rows at most: one index scan) and, before it is ready:

- reads the schema of those calls' connections (the copy its plans are made against);
- makes the plans of the ``warm_calls`` most called (key, query) pairs (a refusal too);
- opens ``warm_sessions`` data sessions in all, shared out over those connections by their
  calls (never more than a pool holds), each with the connection's called statements prepared;
- answers one ``GET /health`` in process (Falcon compiles its router on its first request).

Bounded by those settings and by ``WARM_BUDGET_S`` of wall time (plus one connect timeout at
most). Nothing is run: no statement executed, no quota charged, no history written. Whatever
fails is logged once and the worker serves, cold where the warm-up did not reach.
"""
from __future__ import annotations

import io
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

import psycopg2

from .errors import GatewayError
from .pipeline.plans import plan_for
from .store.history import recent_calls
from .store.pool import borrowed

if TYPE_CHECKING:
    from psycopg2.pool import AbstractConnectionPool

    from .execution.pool import Session, SessionPool
    from .execution.runner import Pools
    from .governance.schema_cache import SchemaCache
    from .model.catalog import ApiKey, Catalog, Connection, QueryVersion
    from .model.state import CatalogHolder
    from .settings import Settings

log = logging.getLogger("gateway")
HISTORY_ROWS = 5000      # the newest runs read, whatever the rate: one bounded index scan
WARM_BUDGET_S = 2.0      # no new step starts after this


class Warmup:
    __slots__ = ("_settings", "_holder", "_pools", "_schemas", "_mask_key", "_store", "_admin", "_deadline")

    def __init__(self, settings: Settings, holder: CatalogHolder, pools: Pools, schemas: SchemaCache,
                 store: AbstractConnectionPool, admin: ApiKey | None) -> None:
        self._settings = settings
        self._holder = holder
        self._pools = pools
        self._schemas = schemas
        self._mask_key = settings.mask_key_bytes()
        self._store = store              # the worker's store pool (a session of it is open already)
        self._admin = admin              # the admin key on the data plane (id 0 in the history), or None
        self._deadline = 0.0

    def run(self, app: Callable | None = None) -> dict[str, int]:
        """What was warmed (also logged): plans made, sessions opened, statements prepared."""
        started = time.monotonic()
        self._deadline = started + WARM_BUDGET_S
        done = {"plans": 0, "sessions": 0, "prepared": 0}
        try:
            if app is not None:
                _first_request(app)
            if self._settings.warm_calls > 0:
                pairs = self._hot_pairs(self._holder.catalog)
                done["plans"], served = self._plan(pairs)
                if self._settings.warm_sessions > 0:
                    done["sessions"], done["prepared"] = self._open_sessions(served)
        except Exception as exc:    # never a reason not to serve
            log.warning("warm-up stopped (%s: %s); this worker serves cold where it did not reach",
                        type(exc).__name__, str(exc)[:300])
        if done["plans"] or done["sessions"]:
            log.info("warmed up in %.0f ms: %d plans, %d sessions, %d statements prepared",
                     (time.monotonic() - started) * 1000, done["plans"], done["sessions"], done["prepared"])
        return done

    # --- what the fleet calls -------------------------------------------------------------------
    def _hot_pairs(self, catalog: Catalog) -> list[tuple[ApiKey, QueryVersion, int]]:
        """The most called (key, published version) pairs the key still reaches, most called first."""
        with borrowed(self._store) as conn:
            counts = recent_calls(conn, self._settings.warm_window_s, HISTORY_ROWS)
        pairs = []
        for (key_id, name), calls in counts.most_common():
            key = self._key(catalog, key_id)
            query = catalog.queries.get(name)
            qv = query.published if query is not None else None
            if key is None or qv is None or not key.reaches(name, qv.connection.name):
                continue
            pairs.append((key, qv, calls))
            if len(pairs) == self._settings.warm_calls:
                break
        return pairs

    def _key(self, catalog: Catalog, key_id: int) -> ApiKey | None:
        if key_id == 0:
            return self._admin
        prefix = catalog.key_ids.get(key_id)
        return catalog.keys.get(prefix) if prefix is not None else None

    # --- plans ------------------------------------------------------------------------------------
    def _plan(self, pairs: list[tuple[ApiKey, QueryVersion, int]]) -> tuple[int, list]:
        """(plans made, the pairs whose plan serves them): only those get sessions, so a write
        the server no longer allows, or a grant narrowed since, opens nothing."""
        catalog, schemas = self._holder.catalog, self._schemas
        for connection in {qv.connection.identity: qv.connection for _, qv, _ in pairs}.values():
            if time.monotonic() > self._deadline:
                return 0, []
            schemas.kin_now(connection, max(0.0, self._deadline - time.monotonic()))
        made, served = 0, []
        for pair in pairs:
            if time.monotonic() > self._deadline:
                break
            key, qv, _ = pair
            made += 1
            try:
                plan_for(catalog, key, qv, self._settings, self._mask_key, schemas.kin(qv.connection))
            except GatewayError:
                continue        # a refusal is kept in the memo too
            served.append(pair)
        return made, served

    # --- sessions ---------------------------------------------------------------------------------
    def _open_sessions(self, pairs: list[tuple[ApiKey, QueryVersion, int]]) -> tuple[int, int]:
        """``warm_sessions`` in all, shared out by calls (at least one per pool while any are
        left, never more than a pool holds), each with its pool's called statements prepared."""
        calls: Counter = Counter()
        versions: dict[tuple, dict[str, QueryVersion]] = {}
        connections: dict[tuple, Connection] = {}
        for _, qv, n in pairs:
            where = (qv.connection.identity, qv.kind == "write")
            calls[where] += n
            versions.setdefault(where, {})[qv.statement] = qv
            connections[where] = qv.connection
        budget, total = self._settings.warm_sessions, sum(calls.values())
        opened = prepared = 0
        for where, n in calls.most_common():
            share = min(budget - opened, max(1, round(self._settings.warm_sessions * n / total)),
                        self._settings.effective_pool_size())
            if share <= 0 or time.monotonic() > self._deadline:
                break
            pool = self._pools.get(connections[where], where[1])
            got, made = _fill(pool, share, list(versions[where].values()), self._deadline)
            opened += got
            prepared += made
        return opened, prepared


def _fill(pool: SessionPool, count: int, statements: list[QueryVersion], deadline: float) -> tuple[int, int]:
    """Hold ``count`` sessions of ``pool`` at once (opened, or idle ones it already has; fewer
    if the time is up), prepare ``statements`` on each, and give them back idle. (opened, prepared)"""
    sessions: list[Session] = []
    prepared = 0
    try:
        while len(sessions) < count and time.monotonic() <= deadline:
            session = pool.acquire()
            sessions.append(session)
            for qv in statements:
                if qv.statement in session.prepared:
                    continue
                try:
                    session.cursor.execute(qv.prepare_sql)
                except psycopg2.Error:       # the table changed since the save: the call will say how
                    continue
                session.prepared.add(qv.statement)
                prepared += 1
    finally:
        for session in sessions:
            pool.release(session)
    return len(sessions), prepared


def _first_request(app: Callable) -> None:
    """Falcon compiles its router on the first request it routes: ``GET /health``, in process."""
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/health", "QUERY_STRING": "", "SERVER_NAME": "localhost",
               "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1", "REMOTE_ADDR": "127.0.0.1",
               "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(), "wsgi.errors": sys.stderr,
               "wsgi.version": (1, 0), "wsgi.multithread": True, "wsgi.multiprocess": True, "wsgi.run_once": False}
    body = app(environ, lambda status, headers, exc_info=None: None)
    close = getattr(body, "close", None)
    if close is not None:
        close()
