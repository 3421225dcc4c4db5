"""A load balancer that rides it out: nginx in front of two masters (``fleet up --instances
2``) passes a typed 503 with ``Retry-After`` to the caller instead of counting it as a
failed instance, so a PostgreSQL restart under load costs callers the restart's own duration
plus at most a second, and the fleet never answers 502 while an instance can serve. On a
PostgreSQL and Redis of this module's own (``private_services``); every call counted, every
body checked.
"""
from __future__ import annotations

import os
import signal
import time

import pytest

from fleet.ops.cli import NGINX_FAIL_TIMEOUT_S
from helpers.api import Api
from helpers.fleetup import started
from helpers.load import Load, statuses, until_each_made

pytestmark = pytest.mark.slow

GRACE_S = 1.0


@pytest.fixture(scope="module")
def fleet(private_services, tmp_path_factory):
    with started(private_services, tmp_path_factory.mktemp("balancer-home")) as running_fleet:
        yield running_fleet


def test_a_postgresql_restart_through_nginx_never_answers_502(fleet, private_services):
    admin = Api.over_http(fleet.base, private_services)
    try:
        connection = admin.connection()
        query = admin.query("SELECT 1 AS v", connection=connection)
        _, secret = admin.named_key([query], [connection])
        load = Load(fleet.base, f"/q/{query}", secret, threads=8, keep_bodies=True)
        with load:
            until_each_made([load], 60)
            stopping = time.monotonic()
            private_services.pg.stop()
            private_services.pg.start()
            up = time.monotonic()
            until_each_made([load], 60, since=up + GRACE_S)
        calls = load.calls
    finally:
        admin.close()

    failed = [c for c in calls if c.status != 200]
    print(f"restart took {up - stopping:.2f}s; {len(failed)} of {len(calls)} calls failed: {statuses(failed)}")
    assert len([c for c in calls if c.ended < stopping]) > 50
    assert len([c for c in calls if c.started > up + GRACE_S]) > 50
    late = [c for c in failed if c.started > up + GRACE_S]
    assert not late, f"{len(late)} calls failed more than {GRACE_S}s after PostgreSQL was back: {statuses(late)}"
    # Only the gateway's own typed answers, passed through: no 502 from nginx, no socket error.
    # database_unavailable, or catalog_stale from a worker whose freshness lease ran out while
    # PostgreSQL was away (its bus heartbeat late on a loaded machine: it must read the catalog
    # to go on, and cannot): both typed 503s with Retry-After, both the database's outage.
    assert {(c.status, c.code) for c in failed} <= {(503, "database_unavailable"), (503, "catalog_stale")}, \
        statuses(failed)
    assert all(c.headers.get("Retry-After") for c in failed)
    assert all(c.body == [{"v": 1}] for c in calls if c.status == 200)


def test_an_instance_killed_under_load_costs_no_call(fleet, private_services):
    # Runs last in this module: it leaves one instance dead (the fixture's `fleet down` copes).
    admin = Api.over_http(fleet.base, private_services)
    try:
        connection = admin.connection()
        query = admin.query("SELECT 2 AS v", connection=connection)
        _, secret = admin.named_key([query], [connection])
        load = Load(fleet.base, f"/q/{query}", secret, threads=8, keep_bodies=True)
        victim = fleet.masters()[0]
        with load:
            until_each_made([load], 60)
            killed = time.monotonic()
            os.killpg(victim, signal.SIGKILL)     # the master and its workers: the instance is gone
            # On until nginx has tried the dead instance again after its fail_timeout, twice.
            until_each_made([load], 100, since=killed + 2 * NGINX_FAIL_TIMEOUT_S)
        calls = load.calls
    finally:
        admin.close()
    after = [c for c in calls if c.started > killed]
    print(f"{len(calls)} calls, {len(after)} after the kill: {statuses(calls)}")
    assert len(after) > 100
    # nginx tries the other instance when a connect is refused or a connection drops before
    # the answer (a GET is safe to send again): no caller sees the instance go.
    assert statuses(calls) == {(200, None): len(calls)}, statuses(calls)
    assert all(c.body == [{"v": 2}] for c in calls)
