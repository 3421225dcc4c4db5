"""The gateway assembled from its parts and its ports: ``build_app(settings, ports)``.

The product knows only the ports (``gateway.ports``); which implementations fill them is
the composition root's choice (``fleet.app:create_app()``, the WSGI entry point, picks the
Redis ones when ``GATEWAY_REDIS_URL`` is set). Each gunicorn worker builds its app after
the fork (nothing is preloaded), so every worker owns its pools, its catalog, its bus
thread and its history thread.
"""
from __future__ import annotations

import logging.handlers
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import falcon
import psycopg2
import psycopg2.extensions
import psycopg2.pool

from .cache import CacheSync, ResponseCache, SharedTier
from .cache.changes import PurgeOnChange
from .cache.metrics import CacheMetrics
from .control import Management
from .crypto import PasswordBox
from .execution.runner import Pools
from .governance.schema_cache import SchemaCache
from .http import errors as http_errors
from .http import management
from .http.adhoc import AdHoc
from .http.cache import CacheEntriesResource, CacheEntryResource
from .http.common import SERVER_START, AdminCheck
from .http.docs import DocsAsset, DocsPage
from .http.events import Events as EventsResource
from .http.health import Health, LoopAnswers, Ready
from .http.metrics import MetricsResource
from .http.middleware import RequestId
from .http.openapi import CatalogResource, Describer, OpenApiResource
from .http.query import QueryResource
from .model.catalog import ApiKey, Catalog
from .model.state import CatalogHolder
from .observe import AccessLog, Metrics, setup_logging
from .pipeline import Pipeline
from .pipeline.from_memory import Answer, FromMemory
from .pipeline.identify import AdminIdentity, admin_identity
from .ports import Admission, AdmitAll, Events, LocalSync, Sync
from .settings import Settings
from .store.history import HistoryWriter
from .store.pool import WaitingPool, borrowed, ping
from .store.purges import PurgeCounter
from .store.schema import migrate
from .store.spool import open_spool, spool_folder
from .warmup import Warmup


@dataclass
class Ports:
    """The implementations a worker runs with; the defaults serve one process, no Redis."""

    sync: Sync = field(default_factory=LocalSync)
    admission: Admission = field(default_factory=AdmitAll)
    events: Events | None = None
    cache_sync: CacheSync | None = None      # None: purges reach this process only
    cache_shared: SharedTier | None = None   # None: no shared tier


class Parts:
    """Everything one worker runs, closed in this order by ``close``."""

    __slots__ = ("settings", "holder", "pools", "history", "sync", "store_pool", "manage", "admission",
                 "events", "ready", "log_listener", "cache", "schemas")

    def __init__(self, settings: Settings, holder: CatalogHolder, pools: Pools, history: HistoryWriter, ports: Ports,
                 store_pool: psycopg2.pool.AbstractConnectionPool, manage: Management, ready: Ready,
                 log_listener: logging.handlers.QueueListener, cache: ResponseCache, schemas: SchemaCache) -> None:
        self.settings = settings
        self.holder = holder
        self.pools = pools
        self.history = history
        self.sync = ports.sync
        self.admission = ports.admission
        self.events = ports.events
        self.store_pool = store_pool
        self.manage = manage
        self.ready = ready
        self.log_listener = log_listener
        self.cache = cache
        self.schemas = schemas

    def drain_when(self, draining: Callable[[], bool]) -> None:
        """From the server's hooks (``fleet/server/gunicorn_conf.py``): once ``draining()``, ``/ready``
        answers 503 and ``/events`` streams end."""
        self.ready.draining = draining
        if self.events is not None:
            self.events.draining = draining

    def close(self) -> None:
        self.ready.close()
        self.schemas.close()      # before the pools: a read may hold one of their sessions
        self.cache.close()
        self.admission.close()
        self.sync.close()
        self.history.close()
        self.pools.close()
        self.holder.close()
        self.store_pool.closeall()
        self.log_listener.stop()


class GatewayApp(falcon.App):
    """A Falcon app that also holds its gateway parts, so gunicorn hooks can close them, and
    tells the server which calls it can answer from memory (``loop_answers``: the worker's loop
    answers those itself, fleet/server/worker.py)."""

    from_memory: FromMemory | None = None
    loop_answers: Callable[[str, tuple, str, str | None], Answer | None] | None = None
    metrics: Metrics | None = None

    def __init__(self, parts: Parts, middleware: list[Any]) -> None:
        super().__init__(media_type=falcon.MEDIA_JSON, middleware=middleware)
        self.parts = parts

    def __call__(self, env: dict, start_response: Callable) -> Any:
        # Kept for an answer that must close its connection (gateway.http.common.close_after).
        env[SERVER_START] = start_response
        return super().__call__(env, start_response)


def worker_name() -> str:
    return f"{os.uname().nodename}:{os.getpid()}"


def store_connector(settings: Settings) -> Callable[[], psycopg2.extensions.connection]:
    def connect() -> psycopg2.extensions.connection:
        return psycopg2.connect(settings.database_url, connect_timeout=settings.connect_timeout_s,
                                application_name="gateway-fleet-store")
    return connect


def build_app(settings: Settings, ports: Ports | None = None,
              store: psycopg2.extensions.connection | None = None) -> GatewayApp:
    """``store``: an open store session to start with (it migrates, then holds the catalog)."""
    ports = ports or Ports()
    log_listener = setup_logging(settings.log_level)
    connect, conn = _migrated_store(settings, store)
    box = PasswordBox(settings.secret_key)
    pools = Pools(settings, box)
    schemas = SchemaCache(settings, box, pools=pools)
    holder = CatalogHolder(connect, on_reload=FollowConnections(pools, schemas), conn=conn)
    holder.reload()
    sync, admission, events = ports.sync, ports.admission, ports.events
    history = _history(settings, connect)
    store_pool = WaitingPool(1, 4, settings.database_url, wait_s=settings.connect_timeout_s + 5,
                             connect_timeout=settings.connect_timeout_s, application_name="gateway-fleet-admin")
    cache = ResponseCache(settings, ports.cache_sync, ports.cache_shared, worker_name(), purges=PurgeCounter(connect))
    admin_caller = admin_identity(settings)
    from_memory = FromMemory(holder, cache, admission, history, schemas, admin_caller)
    metrics = _metrics(history, holder, pools, admission, sync, from_memory)
    history.add_observer(metrics)
    history.add_observer(CacheMetrics(cache, metrics.registry))
    if settings.access_log:
        history.add_observer(AccessLog(settings.access_log_sample))
    if events is not None:
        history.add_observer(events)
    # A committed change: the cache purges what it may have made stale (before the management
    # call returns), then the fleet's event stream tells it.
    on_change = ChangeListeners(PurgeOnChange(cache, holder), *([events.change] if events is not None else []))
    manage = Management(settings, sync, box, store_pool, schemas, on_change=on_change)
    ready = Ready(lambda: _store_reachable(store_pool), sync)
    parts = Parts(settings, holder, pools, history, ports, store_pool, manage, ready, log_listener, cache, schemas)
    app = GatewayApp(parts, middleware=[RequestId()])
    app.req_options.strip_url_path_trailing_slash = True
    http_errors.install(app)
    app.from_memory = from_memory
    app.loop_answers = LoopAnswers(from_memory, ready)
    app.metrics = metrics
    _add_routes(app, Pipeline(holder, pools, history, settings, admission, cache, schemas, from_memory, admin_caller),
                admin_caller, metrics)
    sync.start(holder)
    cache.start()
    history.start()
    # What this worker's first calls would pay for (sessions, plans, Falcon's router), paid before it serves.
    Warmup(settings, holder, pools, schemas, store_pool, ApiKey.admin() if settings.admin_key else None).run(app)
    return app


def _migrated_store(settings: Settings, store: psycopg2.extensions.connection | None
                    ) -> tuple[Callable[[], psycopg2.extensions.connection], psycopg2.extensions.connection]:
    """How to open a store session, and one open and migrated: ``store`` or a new one (the
    catalog holder keeps it: each session opened costs both sides about 4 ms of CPU, at every
    worker boot)."""
    if not settings.database_url:
        raise SystemExit("GATEWAY_DATABASE_URL is not set: start through `fleet up`, or through "
                         "`gunicorn -c fleet/server/gunicorn_conf.py`, which starts the embedded default")
    connect = store_connector(settings)
    conn = store if store is not None else connect()
    try:
        migrate(conn)
    except BaseException:
        conn.close()
        raise
    return connect, conn


def _history(settings: Settings, connect: Callable[[], psycopg2.extensions.connection]) -> HistoryWriter:
    spool_root = spool_folder(settings.history_spool, settings.home)
    return HistoryWriter(connect, worker_name(), settings.history_batch, settings.history_flush_ms,
                         settings.history_queue_max, settings.history_retention_days,
                         spool=open_spool(spool_root, worker_name()) if spool_root else None)


def _metrics(history: HistoryWriter, holder: CatalogHolder, pools: Pools, admission: Admission, sync: Sync,
             from_memory: FromMemory) -> Metrics:
    return Metrics({"queue_depth": history.depth, "dropped": lambda: history.dropped,
                    "generation": lambda: holder.catalog.generation, "reloads": lambda: holder.reloads,
                    "full_loads": lambda: holder.full_loads,
                    "pool_sessions": pools.open_sessions, "fallbacks": lambda: admission.fallbacks,
                    "bus_connected": lambda: sync.connected, "loop_answers": lambda: from_memory.answered})


def _add_routes(app: GatewayApp, pipeline: Pipeline, admin_caller: AdminIdentity | None, metrics: Metrics) -> None:
    parts = app.parts
    settings, holder, cache = parts.settings, parts.holder, parts.cache
    admin = AdminCheck(settings.admin_key, holder)   # a data key on /api/v1: 403 admin_only
    app.add_route("/q/{name}", QueryResource(pipeline, settings))
    app.add_route("/execute_sql", AdHoc(pipeline, settings, parts.schemas))
    app.add_route("/api/v1/usage/quotas", management.QuotaUsageResource(parts.admission, holder, admin))
    for path, resource in management.ROUTES:
        app.add_route(path, resource(parts.manage, admin, settings))
    app.add_route("/api/v1/cache/entries", CacheEntriesResource(cache, admin))
    app.add_route("/api/v1/cache/entries/{key}", CacheEntryResource(cache, admin))
    app.add_route("/health", Health())
    # Self-description for the calling key (QueryAPIGate's /openapi.json and /catalog).
    describer = Describer(holder, settings, admin_caller)
    app.add_route("/openapi.json", OpenApiResource(describer))
    app.add_route("/catalog", CatalogResource(describer))
    app.add_route("/docs", DocsPage())                     # renders /openapi.json (Swagger UI, served here)
    app.add_route("/docs/assets/{name}", DocsAsset())
    app.add_route("/metrics", MetricsResource(metrics, settings.metrics_token))
    app.add_route("/events", EventsResource(parts.events, admin))
    app.add_route("/ready", parts.ready)


class FollowConnections:
    """A catalog reload's listener: when the change touched connections, the pools of those
    gone or changed are retired and the new ones' schemas read."""

    __slots__ = ("_pools", "_schemas")

    def __init__(self, pools: Pools, schemas: SchemaCache) -> None:
        self._pools = pools
        self._schemas = schemas

    def __call__(self, old: Catalog, new: Catalog) -> None:
        if new.connections is old.connections:   # a change that left every connection as it was
            return
        self._pools.retire_unused(new.connections.values())
        self._schemas.warm(new.connections.values())


class ChangeListeners:
    """Who hears a committed management change, each in turn (``Management(on_change=...)``)."""

    __slots__ = ("_listeners",)

    def __init__(self, *listeners: Callable[[dict], object]) -> None:
        self._listeners = listeners

    def __call__(self, change: dict) -> None:
        for listener in self._listeners:
            listener(change)


def _store_reachable(store_pool: psycopg2.pool.AbstractConnectionPool) -> bool:
    try:
        with borrowed(store_pool) as conn:
            ping(conn)
        return True
    except (psycopg2.Error, psycopg2.pool.PoolError):
        return False
