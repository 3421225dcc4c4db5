"""The WSGI application: ``gateway.app:create_app()``.

Each gunicorn worker calls ``create_app`` after the fork (the app is not preloaded), so
every worker owns its pools, its catalog, its bus thread and its history thread.
"""
from __future__ import annotations

import logging
import traceback
import os

import falcon
import orjson
import psycopg2
import psycopg2.pool

from .admission import AdmitAll
from .crypto import PasswordBox
from .errors import GatewayError
from .execution.runner import Pools
from .history import HistoryWriter
from .manage import Management
from .middleware import RequestId
from .observe import AccessLog, Metrics, MetricsResource, setup_logging
from .resources import management
from .resources.common import AdminCheck, request_id
from .resources.adhoc import AdHoc
from .resources.data import QueryResource
from .resources.events import Events
from .resources.health import Health, Ready
from .schemas import SchemaCache
from .settings import Settings
from .state import CatalogHolder
from .store.schema import migrate
from .sync import LocalSync

log = logging.getLogger("gateway")

_FALCON_CODES = {400: "invalid_body", 401: "unauthorized", 404: "not_found", 405: "method_not_allowed",
                 413: "payload_too_large", 415: "unsupported_media_type"}


class GatewayApp(falcon.App):
    """A Falcon app that also holds its gateway parts, so gunicorn hooks can close them."""

    parts: "Parts"


class Parts:
    """Everything one worker runs, in the order it is closed."""

    def __init__(self, settings, holder, pools, history, sync, store_pool, manage, admission, log_listener):
        self.admission = admission
        self.log_listener = log_listener
        self.settings = settings
        self.holder = holder
        self.pools = pools
        self.history = history
        self.sync = sync
        self.store_pool = store_pool
        self.manage = manage

    def close(self) -> None:
        self.admission.close()
        self.sync.close()
        self.history.close()
        self.pools.close()
        self.holder.close()
        self.store_pool.closeall()
        self.log_listener.stop()


def _send_error(req, resp, error: GatewayError) -> None:
    resp.status = error.status
    resp.data = orjson.dumps(error.body(request_id(req)))
    resp.content_type = "application/json"
    if error.headers:
        for name, value in error.headers.items():
            resp.set_header(name, value)


def _on_gateway_error(req, resp, ex, params):
    if ex.detail:
        log.warning("request %s: %s: %s", request_id(req), ex.code, ex.detail[:_MAX_LOGGED])
    _send_error(req, resp, ex)


def _on_http_error(req, resp, ex, params):
    status = ex.status_code
    message = ex.title if not ex.description else f"{ex.title}: {ex.description}"
    _send_error(req, resp, GatewayError(status, _FALCON_CODES.get(status, "invalid_body"), message,
                                        headers=ex.headers))  # e.g. a 405's Allow


_MAX_LOGGED = 2000


def _on_unexpected(req, resp, ex, params):
    # Bounded: a hostile input must not buy a megabyte of log per request.
    text = "".join(traceback.format_exception(ex))
    if len(text) > 2 * _MAX_LOGGED:
        text = f"{text[:_MAX_LOGGED]}\n[... {len(text) - 2 * _MAX_LOGGED} characters left out ...]\n{text[-_MAX_LOGGED:]}"
    log.error("unhandled error in request %s\n%s", request_id(req), text)
    _send_error(req, resp, GatewayError(500, "internal_error", "internal error; quote the request id"))


def _store_connector(settings):
    def connect():
        return psycopg2.connect(settings.database_url, connect_timeout=settings.connect_timeout_s,
                                application_name="gateway-fleet-store")
    return connect


def _make_sync(settings):
    if not settings.redis_url:
        return LocalSync()
    from fleet.bus import RedisBus  # the fleet's implementation of gateway.sync.Sync
    return RedisBus(settings.redis_url, settings.freshness_lease_ms, settings.bus_ping_ms,
                    settings.sync_timeout_ms)


def _make_admission(settings, sync):
    if settings.admission == "off" or not settings.redis_url:
        return AdmitAll()
    from fleet.leases import LeasedAdmission  # the fleet's implementation of gateway.admission
    return LeasedAdmission(settings.redis_url, settings, workers_hint=lambda: getattr(sync, "live_workers", 1))


def _make_events(settings):
    if not settings.redis_url or not settings.events:
        return None
    from fleet.events import RedisEvents  # live events fanned out through a Redis stream
    return RedisEvents(settings.redis_url, settings.events_maxlen, settings.events_max_streams,
                       f"{os.uname().nodename}:{os.getpid()}")


def create_app(settings: Settings | None = None, sync=None) -> GatewayApp:
    settings = settings or Settings.from_env()
    log_listener = setup_logging(settings.log_level)
    if not settings.database_url:
        raise SystemExit("GATEWAY_DATABASE_URL is not set: start through `fleet up`, or through "
                         "`gunicorn -c fleet/gunicorn_conf.py`, which starts the embedded default")
    connect = _store_connector(settings)
    conn = connect()
    try:
        migrate(conn)
    finally:
        conn.close()

    box = PasswordBox(settings.secret_key)
    pools = Pools(settings, box)
    schemas = SchemaCache(settings, box)

    def on_reload(old, new):
        pools.retire_unused(new.connections.values())
        schemas.warm(new.connections.values())

    holder = CatalogHolder(connect, on_reload=on_reload)
    holder.reload()
    sync = sync or _make_sync(settings)
    history = HistoryWriter(connect, f"{os.uname().nodename}:{os.getpid()}", settings.history_batch,
                            settings.history_flush_ms, settings.history_queue_max,
                            settings.history_retention_days)
    store_pool = psycopg2.pool.ThreadedConnectionPool(1, 4, settings.database_url,
                                                      connect_timeout=settings.connect_timeout_s,
                                                      application_name="gateway-fleet-admin")
    admission = _make_admission(settings, sync)
    metrics = Metrics({"queue_depth": history.depth, "dropped": lambda: history.dropped,
                       "generation": lambda: holder.catalog.generation, "reloads": lambda: holder.reloads,
                       "pool_sessions": pools.open_sessions, "fallbacks": lambda: getattr(admission, "fallbacks", 0),
                       "bus_connected": lambda: getattr(sync, "connected", True)})
    history.add_observer(metrics)
    if settings.access_log:
        history.add_observer(AccessLog(settings.access_log_sample))
    events = _make_events(settings)
    if events is not None:
        history.add_observer(events)
    manage = Management(settings, sync, box, store_pool, schemas)
    if events is not None:
        manage.on_change = events.change

    app = GatewayApp(media_type=falcon.MEDIA_JSON, middleware=[RequestId()])
    app.req_options.strip_url_path_trailing_slash = True
    app.add_error_handler(Exception, _on_unexpected)
    app.add_error_handler(falcon.HTTPError, _on_http_error)
    app.add_error_handler(GatewayError, _on_gateway_error)

    admin = AdminCheck(settings.admin_key)
    app.add_route("/q/{name}", QueryResource(holder, pools, history, settings, admission))
    app.add_route("/execute_sql", AdHoc(holder, pools, history, settings, admission, schemas))
    app.add_route("/api/v1/usage/quotas", management.QuotaUsage(admission, holder, admin))
    for path, resource in management.ROUTES:
        app.add_route(path, resource(manage, admin, settings))
    app.add_route("/health", Health())
    app.add_route("/metrics", MetricsResource(metrics, settings.metrics_token))
    app.add_route("/events", Events(events, admin))
    ready = Ready(lambda: _store_reachable(store_pool), sync)
    app.add_route("/ready", ready)

    sync.start(holder)
    history.start()
    app.parts = Parts(settings, holder, pools, history, sync, store_pool, manage, admission, log_listener)
    app.parts.ready = ready
    app.parts.events = events
    return app


def _store_reachable(store_pool) -> bool:
    try:
        conn = store_pool.getconn()
    except (psycopg2.Error, psycopg2.pool.PoolError):
        return False
    broken = False
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
        conn.rollback()
        return True
    except psycopg2.Error:
        broken = True
        return False
    finally:
        store_pool.putconn(conn, close=broken)
