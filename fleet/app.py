"""The composition root and WSGI entry point: ``fleet.app:create_app()``.

    gunicorn -c fleet/server/gunicorn_conf.py 'fleet.app:create_app()'

It picks the implementations of the gateway's ports (``gateway.ports``) from the settings:
with ``GATEWAY_REDIS_URL``, the fleet's (``RedisBus``, ``LeasedAdmission`` unless
``GATEWAY_ADMISSION=off``, ``RedisEvents`` unless ``GATEWAY_EVENTS=off``); without it, the
in-process ones. This is the one place that knows both sides.
"""
from __future__ import annotations

import time

import psycopg2

from gateway.app import GatewayApp, Ports, build_app, store_connector, worker_name
from gateway.cache.entry import mac_key
from gateway.ports import AdmitAll, LocalSync, Sync
from gateway.settings import Settings
from gateway.store.history import AdmittedUsage

from .shared.bus import RedisBus
from .shared.cache import RedisCacheSync, RedisSharedTier
from .shared.events import RedisEvents
from .shared.leases import LeasedAdmission


def ports_for(settings: Settings, sync: Sync | None = None) -> Ports:
    if not settings.redis_url:
        return Ports(sync=sync or LocalSync())
    sync = sync or RedisBus(settings.redis_url, settings.freshness_lease_ms, settings.bus_ping_ms,
                            settings.sync_timeout_ms)
    # A quota bucket Redis does not hold (a new period, or Redis lost its data) starts from
    # what the run history says the key was admitted this period.
    admission = AdmitAll() if settings.admission == "off" else \
        LeasedAdmission(settings.redis_url, settings, workers_hint=lambda: sync.live_workers,
                        history=AdmittedUsage(store_connector(settings)))
    if isinstance(admission, LeasedAdmission) and isinstance(sync, RedisBus):
        sync.redis_lost_data = admission.redis_lost_data
    events = RedisEvents(settings.redis_url, settings.events_maxlen, settings.events_max_streams,
                         worker_name()) if settings.events else None
    # The response cache's purge bus, and its shared tier when GATEWAY_CACHE_SHARED=on.
    cache_shared = RedisSharedTier(settings.redis_url, mac_key(settings.secret_key)) \
        if settings.cache_shared == "on" else None
    cache_sync = RedisCacheSync(settings.redis_url, settings.freshness_lease_ms, settings.bus_ping_ms,
                                settings.sync_timeout_ms, cache_shared)
    return Ports(sync=sync, admission=admission, events=events, cache_sync=cache_sync, cache_shared=cache_shared)


# Under gunicorn's worker timeout (60 s, fleet/server/gunicorn_conf.py): a booting worker sends no heartbeat.
STORE_WAIT_S = 45.0


def wait_for_store(settings: Settings, wait_s: float = STORE_WAIT_S) -> psycopg2.extensions.connection | None:
    """The worker's first store session, waited for: a worker that starts while the store is
    restarting waits for it instead of failing to boot (gunicorn stops the whole master when
    a worker fails to boot, so one worker (re)started during a PostgreSQL restart took its
    instance down: both instances at once under load, in tests/fleet/test_balancer.py). Past
    ``wait_s``: None, and build_app meets the error and reports it. The session is kept for
    the start (``build_app``'s ``store``): each store session costs both sides about 4 ms of
    CPU to open (SCRAM), at every worker boot, next to the workers that serve."""
    if not settings.database_url:
        return None
    connect = store_connector(settings)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return connect()
        except psycopg2.OperationalError:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.25)


def create_app(settings: Settings | None = None, sync: Sync | None = None) -> GatewayApp:
    """The gateway with the fleet's ports (``sync``: a test may bring its own)."""
    settings = settings or Settings.from_env()
    return build_app(settings, ports_for(settings, sync), store=wait_for_store(settings))
