"""Governance through the HTTP data plane: the grants a key carries decide what a saved
query returns (masks with lineage, allow-lists, row and time limits, client addresses)."""
from __future__ import annotations

import hashlib
import hmac

import pytest

from helpers.util import ADMIN_KEY, SECRET_KEY, unique


def _mask_key() -> bytes:
    # The default GATEWAY_MASK_KEY: derived from the secret key (gateway.settings).
    return hashlib.sha256(b"mask:" + SECRET_KEY.encode()).hexdigest().encode()


def test_masks_follow_lineage_through_expressions(api, endpoint, superuser):
    ep = endpoint("SELECT id, upper(email) AS shout, email || '' AS copy, name FROM customers "
                  "WHERE id = :id", {"id": {"type": "int", "required": True}})
    secret = api.key([ep.query], [ep.connection], mask=[{"column": "customers.email", "action": "null"},
                                                         {"column": "*.name", "action": "mask"}])
    raw = superuser("SELECT email, name FROM customers WHERE id = 7", db="demo")[0]
    got = api.call(ep.query, secret, {"id": "7"})
    assert got.status == 200, got
    row = got.json[0]
    assert row["shout"] is None and row["copy"] is None          # derived from email: masked
    assert row["name"] != raw[1] and row["name"].endswith(raw[1][-4:])
    assert raw[0] not in got.text and raw[0].upper() not in got.text
    # The plain key of the same query sees the values.
    assert api.call(ep.query, ep.secret, {"id": "7"}).json[0]["copy"] == raw[0]


def test_hash_mask_is_hmac_of_the_value(api, endpoint, superuser):
    ep = endpoint("SELECT email FROM customers WHERE id = 3")
    secret = api.key([ep.query], [ep.connection], mask=[{"column": "customers.email", "action": "hash"}])
    email = superuser("SELECT email FROM customers WHERE id = 3", db="demo")[0][0]
    got = api.call(ep.query, secret).json[0]["email"]
    assert got == hmac.new(_mask_key(), email.encode(), hashlib.sha256).hexdigest()


def test_drop_removes_the_column_and_whole_rows_are_refused(api, endpoint):
    ep = endpoint("SELECT id, email FROM customers ORDER BY id")
    secret = api.key([ep.query], [ep.connection], mask=[{"column": "customers.email", "action": "drop"}])
    got = api.call(ep.query, secret, {"page_size": "2"})
    assert got.status == 200 and got.json == [{"id": 1}, {"id": 2}], got
    whole = endpoint("SELECT row_to_json(c) AS r FROM customers c")
    secret = api.key([whole.query], [whole.connection], mask=[{"column": "customers.email", "action": "drop"}])
    refused = api.call(whole.query, secret)
    assert refused.status == 403 and refused.json["code"] == "mask_unresolvable", refused


def test_query_level_masks_apply_to_every_key(api, demo_connection):
    query = api.query("SELECT email FROM customers WHERE id = 1", connection=demo_connection,
                      mask=[{"column": "customers.email", "action": "null"}])
    secret = api.key([query], [demo_connection])
    assert api.call(query, secret).json == [{"email": None}]


def test_allowed_tables(api, endpoint):
    ep = endpoint("SELECT o.id FROM orders o JOIN customers c ON c.id = o.customer_id ORDER BY o.id")
    only_orders = api.key([ep.query], [ep.connection], allowed_tables=["public.orders"])
    got = api.call(ep.query, only_orders)
    assert got.status == 403 and got.json["code"] == "table_not_allowed", got
    both = api.key([ep.query], [ep.connection], allowed_tables=["public.*"])
    assert api.call(ep.query, both).status == 200


def test_max_rows_caps_pages_and_streams(api, endpoint):
    ep = endpoint("SELECT g AS n FROM generate_series(1, 50) AS g ORDER BY g")
    secret = api.key([ep.query], [ep.connection], max_rows=7)
    page = api.call(ep.query, secret, {"page_size": "20"})
    assert len(page.json) == 7 and page.headers["X-Page-Size"] == "7" and page.headers["X-Has-More"] == "true"
    streamed = api.call(ep.query, secret, {"stream": "true", "format": "ndjson"})
    assert streamed.status == 200 and len(streamed.text.splitlines()) == 7


def test_query_timeout_lowers_the_limit(api, endpoint):
    ep = endpoint("SELECT pg_sleep(1) AS slept")
    secret = api.key([ep.query], [ep.connection], query_timeout=0.1)
    got = api.call(ep.query, secret)
    assert got.status == 504 and got.json["code"] == "query_timeout", got


def test_allowed_ips(http, http_endpoint):
    # Over a real socket: the peer address is 127.0.0.1 (no X-Forwarded-For is believed).
    ep = http_endpoint("SELECT 1 AS one")
    elsewhere = http.key([ep.query], [ep.connection], allowed_ips=["10.0.0.0/8"])
    assert http.call(ep.query, elsewhere).json["code"] == "ip_not_allowed"
    forged = http.call(ep.query, elsewhere, headers={"X-Forwarded-For": "10.1.2.3"})
    assert forged.json["code"] == "ip_not_allowed"
    here = http.key([ep.query], [ep.connection], allowed_ips=["127.0.0.0/8"])
    assert http.call(ep.query, here).status == 200


def test_grants_are_checked_when_saved(api, endpoint):
    ep = endpoint("SELECT 1 AS one")
    bad = api.manage("POST", "/api-keys", {"name": "bad-mask", "queries": [ep.query],
                                           "mask": [{"column": "x.y", "action": "scramble"}]})
    assert bad.status == 400 and bad.json["code"] == "invalid_body", bad
    bad_ips = api.manage("POST", "/api-keys", {"name": "bad-ips", "allowed_ips": ["not-an-ip"]})
    assert bad_ips.status == 400 and bad_ips.json["code"] == "invalid_body", bad_ips


def test_the_deny_list_is_configurable(make_app, demo_connection):
    import falcon.testing

    from gateway.ports import LocalSync
    client = falcon.testing.TestClient(make_app(sync=LocalSync(), deny_functions="upper,md5*"))
    headers = {"X-API-Key": ADMIN_KEY}
    for sql in ("SELECT upper('x') AS u", "SELECT md5('x') AS m"):
        got = client.simulate_post("/api/v1/queries", headers=headers, json={
            "name": unique("q"), "connection_name": demo_connection, "sql": sql})
        assert got.status_code == 400 and got.json["code"] == "function_not_allowed", got.json
    fine = client.simulate_post("/api/v1/queries", headers=headers, json={
        "name": unique("q"), "connection_name": demo_connection, "sql": "SELECT lower('x') AS l"})
    assert fine.status_code == 201, fine.json
    # The configured names are added to the default list, not put in its place; and the ad-hoc
    # path takes the same lists as a saved query's analysis (gateway.governance.policy).
    kept = client.simulate_post("/api/v1/queries", headers=headers, json={
        "name": unique("q"), "connection_name": demo_connection, "sql": "SELECT pg_read_file('x') AS f"})
    assert kept.status_code == 400 and kept.json["code"] == "function_not_allowed", kept.json
    made = client.simulate_post("/api/v1/api-keys", headers=headers, json={
        "name": unique("key"), "queries": [], "connections": [demo_connection]})
    assert made.status_code == 201, made.json
    caller = {"X-API-Key": made.json["secret"]}
    for sql in ("SELECT upper('x') AS u", "SELECT pg_read_file('x') AS f"):
        adhoc = client.simulate_post("/execute_sql", headers=caller, json={"sql": sql, "connection_name": demo_connection})
        assert adhoc.status_code == 400 and adhoc.json["code"] == "function_not_allowed", adhoc.json
    adhoc = client.simulate_post("/execute_sql", headers=caller,
                                 json={"sql": "SELECT lower('x') AS l", "connection_name": demo_connection})
    assert adhoc.status_code == 200 and adhoc.json == [{"l": "x"}], adhoc.json


# --- catalogs, side effects, upserts, operators ------------------------------------------------------
def _save(api, connection, sql):
    return api.manage("POST", "/queries", {"name": unique("q"), "connection_name": connection, "sql": sql})


def test_catalogs_are_refused_for_every_key(api, demo_connection):
    for sql in ("SELECT * FROM pg_stats", "SELECT most_common_vals::text FROM pg_stats WHERE tablename = 'customers'",
                "SELECT query FROM pg_stat_activity", "SELECT rolname, rolpassword FROM pg_authid",
                "SELECT * FROM pg_catalog.pg_hba_file_rules", "SELECT table_name FROM information_schema.tables",
                "SELECT id FROM customers WHERE email IN (SELECT query FROM pg_stat_activity)"):
        got = _save(api, demo_connection, sql)
        assert got.status == 400 and got.json["code"] == "catalog_not_allowed", (sql, got)
    # ad hoc, for a key with no restriction at all
    secret = api.key([], [demo_connection])
    got = api.request("POST", "/execute_sql", json_body={"sql": "SELECT query FROM pg_stat_activity",
                                                         "connection_name": demo_connection},
                      headers={"X-API-Key": secret})
    assert got.status == 400 and got.json["code"] == "catalog_not_allowed", got


def test_the_server_can_lift_a_named_catalog_relation(make_app, demo_connection):
    import falcon.testing

    from gateway.ports import LocalSync
    client = falcon.testing.TestClient(make_app(sync=LocalSync(), allow_catalog_relations="pg_catalog.pg_class"))
    admin = {"X-API-Key": ADMIN_KEY}
    name = unique("q")
    saved = client.simulate_post("/api/v1/queries", headers=admin, json={
        "name": name, "connection_name": demo_connection, "publish": True,
        "sql": "SELECT relname FROM pg_class WHERE relname = 'customers'"})
    assert saved.status_code == 201, saved.json
    key = client.simulate_post("/api/v1/api-keys", headers=admin, json={
        "name": unique("key"), "queries": [name], "connections": [demo_connection]})
    assert key.status_code == 201, key.json
    got = client.simulate_get(f"/q/{name}", headers={"X-API-Key": key.json["secret"]})
    assert got.status_code == 200 and got.json == [{"relname": "customers"}], got.json
    # only the named relation
    other = client.simulate_post("/api/v1/queries", headers=admin, json={
        "name": unique("q"), "connection_name": demo_connection, "sql": "SELECT * FROM pg_stats"})
    assert other.status_code == 400 and other.json["code"] == "catalog_not_allowed", other.json


def test_side_effects_in_a_read_are_refused(api, endpoint, superuser, demo_connection):
    sequence = unique("seq").lower()
    superuser(f"CREATE SEQUENCE {sequence}", db="demo")
    for sql, function in ((f"SELECT nextval('{sequence}') AS n", "nextval()"),
                          (f"SELECT currval('{sequence}') AS n", "currval()"),
                          ("SELECT txid_current() AS x", "txid_current()"),
                          ("SELECT pg_current_xact_id()::text AS x", "pg_current_xact_id()")):
        ep = endpoint(sql)
        got = api.call(ep.query, ep.secret)
        assert got.status == 403 and got.json["code"] == "write_not_allowed" and function in got.json["error"], got
    assert superuser(f"SELECT last_value, is_called FROM {sequence}", db="demo") == [(1, False)]  # never moved
    for sql in ("SELECT pg_advisory_lock(1)", "SELECT pg_try_advisory_xact_lock(1)", "SELECT pg_notify('c', 'x')"):
        got = _save(api, demo_connection, sql)
        assert got.status == 400 and got.json["code"] == "function_not_allowed", (sql, got)


def test_upsert_needs_insert_and_update(api, endpoint, superuser, make_app):
    import falcon.testing

    from gateway.ports import LocalSync
    table = unique("kv").lower()
    superuser(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)", db="demo")
    superuser(f"INSERT INTO {table} VALUES (1, 'old')", db="demo")
    ep = endpoint(f"INSERT INTO {table} (id, v) VALUES (1, 'new') ON CONFLICT (id) DO UPDATE SET v = excluded.v")
    insert_only = api.key([ep.query], [ep.connection], allow_writes=True, allowed_write_ops=["insert"])
    both = api.key([ep.query], [ep.connection], allow_writes=True, allowed_write_ops=["insert", "update"])
    client = falcon.testing.TestClient(make_app(sync=LocalSync(), allow_writes=True))
    got = client.simulate_post(f"/q/{ep.query}", json={}, headers={"X-API-Key": insert_only})
    assert got.status_code == 403 and got.json["code"] == "write_op_not_allowed", got.json
    assert superuser(f"SELECT v FROM {table}", db="demo") == [("old",)]
    got = client.simulate_post(f"/q/{ep.query}", json={}, headers={"X-API-Key": both})
    assert got.status_code == 200, got.text
    assert superuser(f"SELECT v FROM {table}", db="demo") == [("new",)]


def test_a_user_defined_operator_is_a_call_of_its_function(api, endpoint, superuser):
    function = unique("leak").lower()
    superuser("DROP OPERATOR IF EXISTS && (integer, integer)", db="demo")
    superuser(f"CREATE FUNCTION {function}(integer, integer) RETURNS text LANGUAGE sql STABLE "
              "AS $$ SELECT string_agg(email, ',') FROM customers $$", db="demo")
    superuser(f"CREATE OPERATOR && (LEFTARG = integer, RIGHTARG = integer, FUNCTION = {function})", db="demo")
    try:
        ep = endpoint("SELECT 1 && 0 AS leak")
        # What the operator does: every customer's email, through a query that names no table.
        emails = api.call(ep.query, ep.secret)
        assert emails.status == 200 and "@" in emails.json[0]["leak"], emails
        orders_only = api.key([ep.query], [ep.connection], allowed_tables=["public.orders"])
        got = api.call(ep.query, orders_only)
        assert got.status == 403 and got.json["code"] == "function_opaque" and function in got.json["error"], got
        masked = api.key([ep.query], [ep.connection], mask=[{"column": "customers.email", "action": "null"}])
        got = api.call(ep.query, masked)
        assert got.status == 403 and got.json["code"] == "function_opaque", got
    finally:
        superuser("DROP OPERATOR IF EXISTS && (integer, integer)", db="demo")
        superuser(f"DROP FUNCTION IF EXISTS {function}(integer, integer)", db="demo")


# --- masks that cannot be undone ------------------------------------------------------------------------
def test_a_hash_of_a_piece_of_a_masked_column_is_refused(api, endpoint, superuser):
    # The attack: hash(substr(email, k, 1)) for k = 1, 2, ... is a lookup table away from the
    # address, one character at a time; 'xxxx' || substr(email, k, 4) shows any window of it.
    email = superuser("SELECT email FROM customers WHERE id = 3", db="demo")[0][0]
    k = {"k": {"type": "int", "required": True}}
    piece = endpoint("SELECT substr(email, CAST(:k AS int), 1) AS c FROM customers WHERE id = 3", k)
    hashed = api.key([piece.query], [piece.connection], mask=[{"column": "customers.email", "action": "hash"}])
    for position in ("1", "2", "3"):
        got = api.call(piece.query, hashed, {"k": position})
        assert got.status == 403 and got.json["code"] == "mask_unresolvable", got
    window = endpoint("SELECT 'xxxx' || substr(email, CAST(:k AS int), 4) AS c FROM customers WHERE id = 3", k)
    partial = api.key([window.query], [window.connection], mask=[{"column": "customers.email", "action": "mask"}])
    got = api.call(window.query, partial, {"k": "1"})
    assert got.status == 403 and got.json["code"] == "mask_unresolvable", got
    assert email[:4] not in got.text
    # the same through a subquery, an aggregate and a cast
    for sql in ("SELECT c FROM (SELECT substr(email, 1, 3) AS c FROM customers) s",
                "SELECT max(email) AS c FROM customers", "SELECT email::text AS c FROM customers WHERE id = 3"):
        ep = endpoint(sql)
        secret = api.key([ep.query], [ep.connection], mask=[{"column": "*.email", "action": "hash"}])
        got = api.call(ep.query, secret)
        assert got.status == 403 and got.json["code"] == "mask_unresolvable", (sql, got)
    # null hides whatever it is applied to; the column itself is still served hashed
    nulled = api.key([piece.query], [piece.connection], mask=[{"column": "customers.email", "action": "null"}])
    assert api.call(piece.query, nulled, {"k": "1"}).json == [{"c": None}]
    plain = endpoint("SELECT email AS c FROM (SELECT email FROM customers WHERE id = 3) s")
    secret = api.key([plain.query], [plain.connection], mask=[{"column": "customers.email", "action": "hash"}])
    assert api.call(plain.query, secret).json == [{"c": hmac.new(_mask_key(), email.encode(),
                                                                 hashlib.sha256).hexdigest()}]


def test_adhoc_sql_cannot_take_a_hashed_column_apart(api, demo_connection):
    secret = api.key([], [demo_connection], mask=[{"column": "customers.email", "action": "hash"}])
    got = api.request("POST", "/execute_sql", headers={"X-API-Key": secret}, json_body={
        "sql": "SELECT substr(email, :k, 1) AS c FROM customers", "params": {"k": 1},
        "connection_name": demo_connection})
    assert got.status == 403 and got.json["code"] == "mask_unresolvable", got


# --- masks follow names ------------------------------------------------------------------------------
def _drifting_table(superuser, unique):
    table = unique("drift")
    superuser(f"CREATE TABLE {table} (a text, b text); INSERT INTO {table} VALUES "
              "('plain-a-1', 'secret-b-value-1'), ('plain-a-2', 'secret-b-value-2')", db="demo")
    return table


def test_schema_drift_never_moves_a_mask(api, endpoint, superuser):
    table = _drifting_table(superuser, unique)
    try:
        ep = endpoint(f"SELECT * FROM {table} ORDER BY 1")
        secret = api.key([ep.query], [ep.connection], mask=[{"column": f"{table}.b", "action": "hash"}])
        before = api.call(ep.query, secret)
        assert before.status == 200 and [sorted(r) for r in before.json] == [["a", "b"]] * 2, before
        assert "secret-b-value" not in before.text
        streamed = api.call(ep.query, secret, {"stream": "true", "format": "ndjson"})
        assert streamed.status == 200 and "secret-b-value" not in streamed.text, streamed
        # The table changes shape: same width, same names, b now comes first.
        superuser(f"ALTER TABLE {table} DROP COLUMN a; ALTER TABLE {table} ADD COLUMN a text; "
                  f"UPDATE {table} SET a = 'new-a'", db="demo")
        for params in ({}, {"format": "csv"}, {"stream": "true", "format": "ndjson"}, {"stream": "true"}):
            got = api.call(ep.query, secret, params)
            assert "secret-b-value" not in got.text, (params, got.text[:300])
            assert got.status in (400, 403), (params, got)   # refused, or PostgreSQL's own "cached plan" error
        refused = api.call(ep.query, secret, {"stream": "true", "format": "ndjson"})
        assert refused.status == 403 and refused.json["code"] == "mask_unresolvable", refused
        assert "save the query again" in refused.json["error"]
        # Saved again, it is analysed against the new shape and masks b where it now is.
        again = api.manage("POST", f"/queries/{ep.query}/versions", {
            "sql": f"SELECT * FROM {table} ORDER BY 1", "connection_name": ep.connection, "publish": True})
        assert again.status == 201, again
        for params in ({}, {"stream": "true", "format": "ndjson"}):
            got = api.call(ep.query, secret, params)
            assert got.status == 200 and "secret-b-value" not in got.text and "new-a" in got.text, (params, got)
    finally:
        superuser(f"DROP TABLE IF EXISTS {table}", db="demo")


@pytest.mark.parametrize("change", [
    "ALTER TABLE {t} RENAME COLUMN a TO c; ALTER TABLE {t} RENAME COLUMN b TO a; ALTER TABLE {t} RENAME COLUMN c TO b",
    "ALTER TABLE {t} DROP COLUMN a",
    "ALTER TABLE {t} ADD COLUMN z text DEFAULT 'new-z'",
    "DROP TABLE {t}; CREATE TABLE {t} (b text, a text); INSERT INTO {t} VALUES ('secret-b-value-1', 'plain-a-1')",
])
def test_schema_drift_of_every_kind_never_shows_the_masked_column(api, endpoint, superuser, change):
    """RENAME (a and b swap names: the mask follows the name b, onto the values now called b),
    DROP COLUMN, ADD COLUMN, and the table dropped and made again with its columns swapped,
    after the query was saved: paged, streamed and through a derived expression, the values
    of the column called b never come out unmasked."""
    table = _drifting_table(superuser, unique)
    try:
        star = endpoint(f"SELECT * FROM {table}")
        named = endpoint(f"SELECT a, b FROM {table}")
        keys = {ep.query: api.key([ep.query], [ep.connection], mask=[{"column": f"{table}.b", "action": "hash"}])
                for ep in (star, named)}
        for ep in (star, named):
            assert api.call(ep.query, keys[ep.query]).status == 200
        superuser(change.format(t=table), db="demo")
        b_values = {r[0] for r in superuser(f"SELECT b::text FROM {table}", db="demo")} \
            if "DROP COLUMN b" not in change else set()
        for ep in (star, named):
            for params in ({}, {"format": "csv"}, {"stream": "true", "format": "ndjson"}):
                got = api.call(ep.query, keys[ep.query], params)
                assert not any(v in got.text for v in b_values), (change, ep.query, params, got.text[:300])
                assert got.status in (200, 400, 403), got
    finally:
        superuser(f"DROP TABLE IF EXISTS {table}", db="demo")


def test_schema_drift_on_a_freshly_prepared_session(api, endpoint, superuser):
    table = _drifting_table(superuser, unique)
    try:
        ep = endpoint(f"SELECT * FROM {table}", connection=api.connection())
        secret = api.key([ep.query], [ep.connection], mask=[{"column": f"{table}.b", "action": "hash"}])
        assert api.call(ep.query, secret).status == 200
        superuser(f"ALTER TABLE {table} DROP COLUMN a; ALTER TABLE {table} ADD COLUMN a text", db="demo")
        # The session that prepared the statement is lost (a restart, a network blip): the next
        # one prepares it again, against the new shape.
        query_id = superuser("SELECT id FROM gw_queries WHERE name = %s", (ep.query,))[0][0]
        superuser("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'demo' "
                  "AND query LIKE %s", (f"%gw\\_q{query_id}\\_v1%",), db="demo")
        for _ in range(3):
            got = api.call(ep.query, secret)
            assert "secret-b-value" not in got.text, got.text[:300]
    finally:
        superuser(f"DROP TABLE IF EXISTS {table}", db="demo")


def test_an_added_column_a_rule_masks_does_not_slip_out_through_star(api, endpoint, superuser):
    table = _drifting_table(superuser, unique)
    try:
        ep = endpoint(f"SELECT * FROM {table}")
        # the rule names a column the table does not have yet
        secret = api.key([ep.query], [ep.connection], mask=[{"column": f"{table}.token", "action": "drop"}])
        assert api.call(ep.query, secret).status == 200
        superuser(f"ALTER TABLE {table} ADD COLUMN token text DEFAULT 'tok_live_SECRET'", db="demo")
        for params in ({}, {"stream": "true", "format": "ndjson"}):
            got = api.call(ep.query, secret, params)
            assert "tok_live_SECRET" not in got.text, (params, got.text[:300])
            assert got.status in (400, 403), (params, got)
    finally:
        superuser(f"DROP TABLE IF EXISTS {table}", db="demo")


# --- masks on child tables ---------------------------------------------------------------------------
def test_a_mask_on_a_child_table_applies_when_the_parent_is_read(api, endpoint, superuser):
    parted, classic = unique("parted"), unique("classic")
    superuser(f"""
        CREATE TABLE {parted} (id int, email text) PARTITION BY RANGE (id);
        CREATE TABLE {parted}_2024 PARTITION OF {parted} FOR VALUES FROM (0) TO (1000);
        CREATE TABLE {parted}_2025 PARTITION OF {parted} FOR VALUES FROM (1000) TO (2000);
        INSERT INTO {parted} VALUES (1, 'partition-2024@example.com'), (1001, 'partition-2025@example.com');
        CREATE TABLE {classic} (id int, email text);
        CREATE TABLE {classic}_archive (archived_at date) INHERITS ({classic});
        INSERT INTO {classic} VALUES (1, 'parent-row@example.com');
        INSERT INTO {classic}_archive VALUES (2, 'archived-row@example.com', '2024-01-01');
    """, db="demo")
    try:
        cases = [(parted, f"public.{parted}_2024.email", "partition-2024@example.com"),
                 (classic, f"{classic}_archive.email", "archived-row@example.com")]
        for parent, rule, secret_value in cases:
            ep = endpoint(f"SELECT id, email FROM {parent} ORDER BY id")
            assert secret_value in api.call(ep.query, ep.secret).text   # the plain key sees it
            for action in ("hash", "null", "drop"):
                secret = api.key([ep.query], [ep.connection], mask=[{"column": rule, "action": action}])
                got = api.call(ep.query, secret)
                assert got.status == 200 and secret_value not in got.text, (parent, action, got)
                if action == "drop":
                    assert all(set(r) == {"id"} for r in got.json)
            pieces = endpoint(f"SELECT substr(email, 1, 1) AS c FROM {parent}")
            secret = api.key([pieces.query], [pieces.connection], mask=[{"column": rule, "action": "hash"}])
            got = api.call(pieces.query, secret)
            assert got.status == 403 and got.json["code"] == "mask_unresolvable", got
    finally:
        superuser(f"DROP TABLE IF EXISTS {parted}, {classic} CASCADE", db="demo")


def test_a_partition_or_child_added_after_the_query_was_saved_is_masked_through_its_tree(api, endpoint, superuser):
    """The analysis stored with a query knows the children its tables had when it was saved.
    A partition attached since, an inheriting child created since, or a table that joined a
    tree since must still be masked by a rule that names it (or its new parent): the plan
    matches rules through the trees as the worker last read them (before, all three leaked)."""
    parted, classic, joiner = unique("lparted"), unique("lclassic"), unique("ljoiner")
    superuser(f"""
        CREATE TABLE {parted} (id int, email text) PARTITION BY RANGE (id);
        CREATE TABLE {parted}_old PARTITION OF {parted} FOR VALUES FROM (0) TO (1000);
        INSERT INTO {parted} VALUES (1, 'old-partition@example.com');
        CREATE TABLE {classic} (id int, email text);
        INSERT INTO {classic} VALUES (1, 'classic-parent@example.com');
        CREATE TABLE {joiner} (id int, email text);
        INSERT INTO {joiner} VALUES (3, 'joins-a-tree-later@example.com');
    """, db="demo")
    try:
        by_parent = endpoint(f"SELECT id, email FROM {parted} ORDER BY id")
        by_classic = endpoint(f"SELECT id, email FROM {classic} ORDER BY id")
        by_joiner = endpoint(f"SELECT id, email FROM {joiner} ORDER BY id")
        superuser(f"""
            CREATE TABLE {parted}_new PARTITION OF {parted} FOR VALUES FROM (1000) TO (2000);
            INSERT INTO {parted} VALUES (1001, 'late-partition-secret@example.com');
            CREATE TABLE {classic}_late () INHERITS ({classic});
            INSERT INTO {classic}_late VALUES (2, 'late-child-secret@example.com');
            ALTER TABLE {joiner} INHERIT {classic};
        """, db="demo")
        # The worker reads the schema again (here at once: saving reads it afresh; otherwise
        # within the copy's age, 30 s).
        api.query("SELECT 1 AS one", connection=by_parent.connection)
        cases = [(by_parent, f"{parted}_new.email", "late-partition-secret@example.com"),
                 (by_classic, f"public.{classic}_late.email", "late-child-secret@example.com"),
                 (by_joiner, f"{classic}.email", "joins-a-tree-later@example.com")]
        for ep, rule, secret_value in cases:
            assert secret_value in api.call(ep.query, ep.secret).text   # the plain key sees it
            for action in ("hash", "null", "drop", "mask"):
                secret = api.key([ep.query], [ep.connection], mask=[{"column": rule, "action": action}])
                for params in ({}, {"stream": "true", "format": "ndjson"}):
                    got = api.call(ep.query, secret, params)
                    assert got.status == 200 and secret_value not in got.text, (rule, action, params, got.text)
    finally:
        superuser(f"DROP TABLE IF EXISTS {parted}, {classic}, {joiner} CASCADE", db="demo")


def test_a_table_made_again_as_a_view_after_the_save_is_refused_like_a_view(api, endpoint, superuser):
    """Lineage stops at views, so a key with masks may read a view only if a rule names it.
    A table dropped and made again as a view over customers after the query was saved looked
    like the table to the stored analysis: the key's customers.email rule was never applied
    (before: the emails were served as they are)."""
    table = unique("becomes_view")
    superuser(f"CREATE TABLE {table} (a text, b text); INSERT INTO {table} VALUES ('x', 'y')", db="demo")
    try:
        ep = endpoint(f"SELECT a, b FROM {table}")
        secret = api.key([ep.query], [ep.connection], mask=[{"column": "customers.email", "action": "hash"}])
        assert api.call(ep.query, secret).json == [{"a": "x", "b": "y"}]
        superuser(f"DROP TABLE {table}; CREATE VIEW {table} AS SELECT name AS a, email AS b FROM customers "
                  "ORDER BY id", db="demo")
        email = superuser("SELECT email FROM customers ORDER BY id LIMIT 1", db="demo")[0][0]
        assert email in api.call(ep.query, ep.secret).text         # the plain key: what the view shows
        api.query("SELECT 1 AS one", connection=ep.connection)      # the worker reads the schema again
        for params in ({}, {"stream": "true", "format": "ndjson"}):
            got = api.call(ep.query, secret, params)
            assert got.status == 403 and got.json["code"] == "mask_unresolvable", (params, got)
            assert email not in got.text
    finally:
        superuser(f"DROP VIEW IF EXISTS {table}; DROP TABLE IF EXISTS {table}", db="demo")


def test_a_column_added_after_the_save_that_takes_over_a_name_is_masked(api, endpoint, superuser):
    """An unqualified name in a subquery resolved to an outer table when the query was saved;
    a column of that name added to the inner table takes it over (PostgreSQL resolves the
    name again when it plans the statement again). The stored analysis still said the outer
    column, so a rule on the new inner column was never applied (before: served as it is).
    Saved versions are analysed again against the schema as the worker last read it."""
    outer, inner = unique("sh_outer"), unique("sh_inner")
    superuser(f"CREATE TABLE {outer} (id int, label text); INSERT INTO {outer} VALUES (1, 'public-label');"
              f"CREATE TABLE {inner} (id int); INSERT INTO {inner} VALUES (1)", db="demo")
    try:
        ep = endpoint(f"SELECT l.x FROM {outer} o, LATERAL (SELECT label AS x FROM {inner} i WHERE i.id = o.id) l")
        secret = api.key([ep.query], [ep.connection], mask=[{"column": f"{inner}.label", "action": "hash"}])
        assert api.call(ep.query, secret).json == [{"x": "public-label"}]
        superuser(f"ALTER TABLE {inner} ADD COLUMN label text DEFAULT 'inner-secret-label'", db="demo")
        assert "inner-secret-label" in api.call(ep.query, ep.secret).text    # what PostgreSQL reads now
        api.query("SELECT 1 AS one", connection=ep.connection)               # the worker reads the schema again
        for params in ({}, {"stream": "true", "format": "ndjson"}):
            got = api.call(ep.query, secret, params)
            assert got.status == 200 and "inner-secret-label" not in got.text, (params, got)
            assert len(got.text.split('"x":"')[1].split('"')[0]) == 64, got.text    # the HMAC
        # and a rule on the outer column no longer masks what is not read from it
        outer_rule = api.key([ep.query], [ep.connection], mask=[{"column": f"{outer}.label", "action": "null"}])
        assert api.call(ep.query, outer_rule).json == [{"x": "inner-secret-label"}]
    finally:
        superuser(f"DROP TABLE IF EXISTS {outer}, {inner}", db="demo")


def test_an_extension_view_is_refused_like_a_catalog(api, demo_connection, superuser):
    if superuser("SELECT to_regclass('public.pg_stat_statements') IS NULL", db="demo")[0][0]:
        pytest.skip("pg_stat_statements is not installed in the demo database")
    got = _save(api, demo_connection, "SELECT query, calls FROM pg_stat_statements")
    assert got.status == 400 and got.json["code"] == "catalog_not_allowed", got
