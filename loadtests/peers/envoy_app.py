"""The gateway with envoyproxy/ratelimit's fixed windows as its admission: a WSGI factory of the benchmark harness,
so the product gains no setting for it.

    gunicorn -c fleet/server/gunicorn_conf.py 'loadtests.peers.envoy_app:create_app()'

Built as fleet/app.py's ``create_app`` builds the gateway (the same bus, events, cache sync and store), with the
fleet's ports chosen for GATEWAY_ADMISSION=off and then the admission replaced by ``FixedWindowAdmission``
(loadtests/peers/fixed_window.py): the leases are never started, and everything else is what limits-on and
limits-off run. GATEWAY_RATE_LIMIT (the client address limit) and the keys' limits are read as the gateway reads
them.
"""
from __future__ import annotations

import dataclasses

from fleet.app import ports_for, wait_for_store
from gateway.app import GatewayApp, build_app
from gateway.settings import Settings

from .fixed_window import FixedWindowAdmission


def create_app(settings: Settings | None = None) -> GatewayApp:
    settings = settings or Settings.from_env()
    if not settings.redis_url:
        raise SystemExit('loadtests.peers.envoy_app needs GATEWAY_REDIS_URL: its counters are in Redis')
    ports = ports_for(dataclasses.replace(settings, admission='off'))
    ports = dataclasses.replace(ports, admission=FixedWindowAdmission(settings.redis_url, settings))
    return build_app(settings, ports, store=wait_for_store(settings))
