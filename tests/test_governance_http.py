"""Governance through the HTTP data plane: the grants a key carries decide what a saved
query returns (masks with lineage, allow-lists, row and time limits, client addresses)."""
from __future__ import annotations

import hashlib
import hmac

from conftest import SECRET_KEY


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
    from conftest import ADMIN_KEY, unique
    from gateway.sync import LocalSync
    client = falcon.testing.TestClient(make_app(sync=LocalSync(), deny_functions="upper,md5*"))
    headers = {"X-API-Key": ADMIN_KEY}
    for sql in ("SELECT upper('x') AS u", "SELECT md5('x') AS m"):
        got = client.simulate_post("/api/v1/queries", headers=headers, json={
            "name": unique("q"), "connection_name": demo_connection, "sql": sql})
        assert got.status_code == 400 and got.json["code"] == "function_not_allowed", got.json
    fine = client.simulate_post("/api/v1/queries", headers=headers, json={
        "name": unique("q"), "connection_name": demo_connection, "sql": "SELECT lower('x') AS l"})
    assert fine.status_code == 201, fine.json
