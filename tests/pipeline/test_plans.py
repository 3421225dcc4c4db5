"""Stage 3, plan (``gateway/pipeline/plans.py``): a saved query's analysis was made under the
settings of the gateway that saved it; each call is planned under this gateway's settings.
A catalog relation no longer named by ``GATEWAY_ALLOW_CATALOG_RELATIONS``, or a function the
deny list names now (a setting changed, or a release denies more), is refused, not served
from the stored analysis."""
from __future__ import annotations

import falcon.testing

from gateway.ports import LocalSync
from helpers.util import ADMIN_KEY, unique

ADMIN = {"X-API-Key": ADMIN_KEY}


def _published(client, connection: str, sql: str) -> tuple[str, str]:
    """A query saved and published through ``client``, and a key for it: (name, secret)."""
    name = unique("q")
    saved = client.simulate_post("/api/v1/queries", headers=ADMIN, json={
        "name": name, "connection_name": connection, "publish": True, "sql": sql})
    assert saved.status_code == 201, saved.json
    key = client.simulate_post("/api/v1/api-keys", headers=ADMIN, json={
        "name": unique("key"), "queries": [name], "connections": [connection]})
    assert key.status_code == 201, key.json
    return name, key.json["secret"]


def test_a_catalog_relation_no_longer_allowed_is_refused(make_app, demo_connection):
    lifted = falcon.testing.TestClient(make_app(sync=LocalSync(), allow_catalog_relations="pg_catalog.pg_class"))
    name, secret = _published(lifted, demo_connection, "SELECT relname FROM pg_class WHERE relname = 'customers'")
    got = lifted.simulate_get(f"/q/{name}", headers={"X-API-Key": secret})
    assert got.status_code == 200 and got.json == [{"relname": "customers"}], got.json
    # The same store, a gateway whose setting no longer names pg_class.
    narrowed = falcon.testing.TestClient(make_app(sync=LocalSync()))
    got = narrowed.simulate_get(f"/q/{name}", headers={"X-API-Key": secret})
    assert got.status_code == 400 and got.json["code"] == "catalog_not_allowed", got.json
    assert "customers" not in got.text


def test_a_function_denied_since_the_save_is_refused(make_app, demo_connection):
    lifted = falcon.testing.TestClient(make_app(sync=LocalSync(), allow_functions="current_setting"))
    name, secret = _published(lifted, demo_connection, "SELECT current_setting('server_version_num') AS v")
    got = lifted.simulate_get(f"/q/{name}", headers={"X-API-Key": secret})
    assert got.status_code == 200 and got.json[0]["v"].isdigit(), got.json
    default = falcon.testing.TestClient(make_app(sync=LocalSync()))    # the default deny list names it
    got = default.simulate_get(f"/q/{name}", headers={"X-API-Key": secret})
    assert got.status_code == 400 and got.json["code"] == "function_not_allowed", got.json
    # a name GATEWAY_DENY_FUNCTIONS adds (a prefix here) after the save
    name, secret = _published(default, demo_connection, "SELECT upper('x') AS u")
    assert default.simulate_get(f"/q/{name}", headers={"X-API-Key": secret}).json == [{"u": "X"}]
    denied = falcon.testing.TestClient(make_app(sync=LocalSync(), deny_functions="upp*"))
    got = denied.simulate_get(f"/q/{name}", headers={"X-API-Key": secret})
    assert got.status_code == 400 and got.json["code"] == "function_not_allowed", got.json


def test_a_worker_whose_schema_copy_is_older_than_the_version_serves_it(make_app, api, demo_connection, superuser):
    """Another worker (``other``) read the connection's schema before a table was made; a
    version saved on that table by this one (which read the schema afresh) must not be
    refused there as naming an unknown table: a copy older than the version knows less than
    its stored analysis and is not used to analyse it again."""
    probe = api.key([], [demo_connection])
    other = falcon.testing.TestClient(make_app(sync=LocalSync()))
    got = other.simulate_post("/execute_sql", headers={"X-API-Key": probe},
                              json={"sql": "SELECT 1 AS one", "connection_name": demo_connection})
    assert got.status_code == 200, got.json        # the other worker's copy of the schema: read now
    table = unique("late").lower()
    superuser(f"CREATE TABLE {table} (v text)", db="demo")
    superuser(f"INSERT INTO {table} VALUES ('made after the copy')", db="demo")
    superuser(f"GRANT SELECT ON {table} TO PUBLIC", db="demo")
    query = api.query(f"SELECT v FROM {table}", connection=demo_connection)
    secret = api.key([query], [demo_connection])
    other.app.parts.holder.reload()                # the other worker learns of the version
    got = other.simulate_get(f"/q/{query}", headers={"X-API-Key": secret})
    assert got.status_code == 200 and got.json == [{"v": "made after the copy"}], got.json
