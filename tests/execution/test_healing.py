"""Sessions that heal: a restart of PostgreSQL, under load, costs callers no more than the
restart's own duration plus one second; nothing fails once PostgreSQL answers again (data
sessions, the management API's store connections, the catalog's), and a write is never run
twice. The restart runs on a PostgreSQL of this module's own (``private_services``), behind
a real gunicorn master with two workers; every call is counted and every body checked.
"""
from __future__ import annotations

import time

import falcon.testing
import pytest

from gateway.errors import GatewayError
from gateway.execution import runner
from gateway.execution.pool import SessionPool, session_options
from gateway.ports import LocalSync
from gateway.sql import Template, read
from helpers.api import Api
from helpers.load import Load, statuses, until_each_made
from helpers.masters import Master
from helpers.util import unique

GRACE_S = 1.0     # the bound: errors only between the stop and one second after the server is back


def test_a_postgresql_restart_costs_no_more_than_its_own_duration(private_services, tmp_path_factory):
    master = Master(private_services, tmp_path_factory.mktemp("heal-home"), workers=2)
    master.start()
    admin = Api.over_http(master.base, private_services)
    try:
        connection = admin.connection()
        query = admin.query("SELECT 1 AS v", connection=connection)
        _, secret = admin.named_key([query], [connection])
        load = Load(master.base, f"/q/{query}", secret, threads=6, keep_bodies=True)
        with load:
            until_each_made([load], 60)           # every worker's pool is warm: 8 sessions each at most
            stopping = time.monotonic()
            private_services.pg.stop()
            private_services.pg.start()
            up = time.monotonic()
            until_each_made([load], 60, since=up + GRACE_S)
            # The first management call after the restart finds only dead pooled store
            # connections: it must not fail for that.
            version = admin.manage("POST", f"/queries/{query}/versions",
                                   {"connection_name": connection, "sql": "SELECT 1 AS v", "publish": True})
            until_each_made([load], 20, since=time.monotonic())
        calls = load.calls
    finally:
        admin.close()
        master.stop()

    before = [c for c in calls if c.ended < stopping]
    after = [c for c in calls if c.started > up + GRACE_S]
    assert len(before) > 50 and len(after) > 50, (len(before), len(after))
    failed = [c for c in calls if c.status != 200]
    late = [c for c in failed if c.started > up + GRACE_S]
    print(f"restart took {up - stopping:.2f}s; {len(failed)} of {len(calls)} calls failed: {statuses(failed)}")
    assert not late, f"{len(late)} calls failed more than {GRACE_S}s after PostgreSQL was back: {statuses(late)}"
    # Stricter than the bound: a dead pooled session found after the restart is replaced and
    # the read runs again, so nothing that starts once the server is back fails at all.
    healed = [c for c in failed if c.started > up + 0.1]
    assert not healed, f"{len(healed)} calls failed on sessions that died with the restart: {statuses(healed)}"
    assert version.status == 201, version
    # What fails during the restart is typed and says when to retry; never a 500 or a lost answer.
    assert {(c.status, c.code) for c in failed} <= {(503, "database_unavailable")}, statuses(failed)
    assert all(c.headers.get("Retry-After") for c in failed)
    assert all(c.body == [{"v": 1}] for c in calls if c.status == 200)


# --- what heals and what never runs twice, one session at a time ------------------------------
def test_a_write_on_a_dead_session_is_not_run_again_and_a_read_is(api, services, superuser, make_app):
    # Every session of this app is terminated by the server between two calls (as a restart
    # would): the read runs again on a fresh session and answers; the write is refused with
    # a typed 503 and did not happen (whether a write reached the server cannot be known,
    # so it is never sent twice); the next write, on a fresh session, happens once.
    table = unique("heal").lower()
    superuser(f"CREATE TABLE {table} (v int)", db="demo")
    connection = api.connection()
    write = api.query(f"INSERT INTO {table} (v) VALUES (:v)", {"v": {"type": "int", "required": True}},
                      connection=connection)
    read = api.query(f"SELECT count(*) AS n FROM {table}", connection=connection)
    secret = api.key([write, read], [connection], allow_writes=True)
    started = superuser("SELECT now()", db="demo")[0][0]
    # No warm-up: it would open sessions for what the tests before called (in its window), and
    # the count below is of this app's two sessions.
    client = falcon.testing.TestClient(make_app(sync=LocalSync(), allow_writes=True, warm_calls=0))
    headers = {"X-API-Key": secret}

    def rows() -> int:
        return superuser(f"SELECT count(*) FROM {table}", db="demo")[0][0]
    assert client.simulate_post(f"/q/{write}", json={"params": {"v": 1}}, headers=headers).status_code == 200
    assert client.simulate_get(f"/q/{read}", headers=headers).json == [{"n": 1}]
    killed = superuser("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = 'demo' "
                       "AND application_name = 'gateway-fleet' AND backend_start >= %s", (started,), db="demo")
    assert killed[0][0] == 2     # this app's read session and its write session

    refused = client.simulate_post(f"/q/{write}", json={"params": {"v": 2}}, headers=headers)
    assert refused.status_code == 503 and refused.json["code"] == "database_unavailable", refused.text
    assert rows() == 1
    assert client.simulate_get(f"/q/{read}", headers=headers).json == [{"n": 1}]       # healed
    assert client.simulate_post(f"/q/{write}", json={"params": {"v": 3}}, headers=headers).status_code == 200
    assert rows() == 2


def test_a_session_that_reads_strings_otherwise_runs_nothing(services, superuser):
    # Checked literals are written for standard_conforming_strings = on, which every data
    # session pins; a session where it is off (nothing in the gateway can turn it off:
    # SET and set_config are refused) must run no text at all, not even a harmless one.
    table = unique("scs").lower()
    superuser(f"CREATE TABLE {table} (v text)", db="demo")
    pool = SessionPool({"host": "127.0.0.1", "port": services.pg.port, "dbname": "demo", "user": "postgres",
                        "password": services.pg.password(), "options": session_options(5000, read_only=False)},
                       size=1)
    try:
        session = pool.acquire()
        session.cursor.execute("SET standard_conforming_strings = off")
        pool.release(session)
        text = Template(read(f"INSERT INTO {table} (v) VALUES (:v)")).render(["a\\' b"])
        with pytest.raises(GatewayError) as refused:
            runner.execute_text(pool, text, None, True)
        assert (refused.value.status, refused.value.code) == (503, "database_unavailable")
        assert superuser(f"SELECT count(*) FROM {table}", db="demo")[0][0] == 0
    finally:
        pool.close()
