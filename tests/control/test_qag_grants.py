"""QueryAPIGate's rules this gateway now follows (issue 15), where the side-by-side suite
(``tests/compat``) cannot show them: per-query write grants, the rotation grace period and its
end, ``expires_at`` through the day, the admin key on the data plane with the grants it skips,
driver options reaching libpq, required parameters, and a catalog that indexes a rotated key
by both prefixes and drops both when the key goes."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import falcon.testing

from gateway.ports import LocalSync
from helpers.history import wait_for_history
from helpers.util import ADMIN_KEY, unique


def test_a_queries_entry_can_grant_writes_to_that_query_alone(api, demo_connection, make_app):
    write = api.query("UPDATE customers SET plan = plan WHERE id = :id", {"id": "int"}, connection=demo_connection)
    other = api.query("UPDATE customers SET plan = plan WHERE id = :id + 0", {"id": "int"},
                      connection=demo_connection)
    name, secret = api.named_key([{"name": write, "allow_writes": True}, other], [])
    doc = api.ok("GET", f"/api-keys/{name}").json
    assert doc["queries"] == sorted([{"name": write, "allow_writes": True}, other],
                                    key=lambda e: e if isinstance(e, str) else e["name"])
    assert doc["allow_writes"] is False
    client = falcon.testing.TestClient(make_app(sync=LocalSync(), allow_writes=True))
    headers = {"X-API-Key": secret}
    got = client.simulate_post(f"/q/{write}", json={"params": {"id": 1}}, headers=headers)
    assert got.status_code == 200 and got.headers["X-Rows-Affected"] == "1", got.text
    refused = client.simulate_post(f"/q/{other}", json={"params": {"id": 1}}, headers=headers)
    assert refused.status_code == 403 and refused.json["code"] == "write_not_allowed", refused.text
    # The server's ceiling still holds for a per-query grant.
    ceiling = api.post(write, secret, {"params": {"id": 1}})
    assert ceiling.status == 403 and ceiling.json["code"] == "write_not_allowed"


def test_bad_queries_entries(api):
    for bad in ([{"name": "x", "allow_writes": "yes"}], [{"nom": "x"}], [5], ["a", "a"], "some"):
        got = api.manage("POST", "/api-keys", {"name": unique("k"), "queries": bad})
        assert got.status == 400 and got.json["code"] == "invalid_body", (bad, got)
    got = api.manage("POST", "/api-keys", {"name": unique("k"), "max_concurrent": 0})
    assert got.status == 400 and "max_concurrent" in got.json["errors"]


def test_rotation_keeps_the_previous_secret_for_its_grace(api, endpoint, superuser):
    ep = endpoint("SELECT 1 AS one")
    old = ep.secret
    rotated = api.ok("POST", f"/api-keys/{ep.key}/rotate", {}).json
    until = datetime.fromisoformat(rotated["previous_expires_at"])
    assert timedelta(minutes=59) < until - datetime.now(UTC) <= timedelta(minutes=60)
    assert api.call(ep.query, rotated["secret"]).status == 200
    assert api.call(ep.query, old).status == 200                      # in its grace period
    assert api.call(ep.query, old + "x").status == 401                # the previous prefix, a wrong secret
    # A second rotation would cut off a secret still in use: refused until the previous one is ended.
    pending = api.manage("POST", f"/api-keys/{ep.key}/rotate", {"grace_minutes": 5})
    assert pending.status == 409 and pending.json["code"] == "key_rotation_pending", pending
    assert pending.json["previous_expires_at"] == rotated["previous_expires_at"]
    ended = api.ok("DELETE", f"/api-keys/{ep.key}/previous").json
    assert ended["previous_expires_at"] is None and api.call(ep.query, old).status == 401
    gone = api.manage("DELETE", f"/api-keys/{ep.key}/previous")
    assert gone.status == 404 and gone.json["code"] == "previous_secret_not_found"
    again = api.ok("POST", f"/api-keys/{ep.key}/rotate", {"grace_minutes": 5}).json
    assert api.call(ep.query, old).status == 401
    assert api.call(ep.query, rotated["secret"]).status == 200
    assert api.call(ep.query, again["secret"]).status == 200
    # The grace's end is checked on every call (no change needed): move it into the past in the store.
    superuser("UPDATE gw_api_keys SET grants = jsonb_set(grants, '{previous,until}', to_jsonb(%s::text)) "
              "WHERE name = %s", ((datetime.now(UTC) - timedelta(seconds=1)).isoformat(), ep.key))
    api.ok("PATCH", f"/api-keys/{ep.key}", {"active": True})          # a change, so the catalog reads it
    assert api.call(ep.query, rotated["secret"]).status == 401
    assert api.ok("GET", f"/api-keys/{ep.key}").json["previous_expires_at"] is None
    # Neither digest is in the audit log.
    text = str(superuser("SELECT before, after FROM gw_audit WHERE kind = 'key' AND name = %s", (ep.key,)))
    assert "previous" not in text and "digest" not in text


def test_rotation_without_grace_and_deletion_end_every_secret(api, endpoint):
    ep = endpoint("SELECT 1 AS one")
    rotated = api.ok("POST", f"/api-keys/{ep.key}/rotate", {"grace_minutes": 0}).json
    assert rotated["previous_expires_at"] is None
    assert api.call(ep.query, ep.secret).status == 401
    second = api.ok("POST", f"/api-keys/{ep.key}/rotate", {}).json   # the first had no grace: nothing pending
    api.ok("DELETE", f"/api-keys/{ep.key}")
    for secret in (rotated["secret"], second["secret"]):
        assert api.call(ep.query, secret).status == 401              # both prefixes left the catalog
    for bad in (-1, 10_081, "60", True):
        got = api.manage("POST", f"/api-keys/{api.named_key()[0]}/rotate", {"grace_minutes": bad})
        assert got.status == 400 and got.json["code"] == "invalid_body", bad


def test_a_rotated_key_is_listed_once_in_quota_usage(api, endpoint):
    ep = endpoint("SELECT 1 AS one")
    api.ok("PATCH", f"/api-keys/{ep.key}", {"quota": {"calls": 5, "per": "day"}})
    api.ok("POST", f"/api-keys/{ep.key}/rotate", {})
    items = [i for i in api.ok("GET", "/usage/quotas").json["items"] if i.get("key", i.get("name")) == ep.key]
    assert len(items) == 1, items


def test_expires_at_a_date_is_valid_through_that_day(api, endpoint):
    ep = endpoint("SELECT 1 AS one")
    today = datetime.now(UTC).date()
    secret = api.key([ep.query], [ep.connection], expires_at=today.isoformat())
    assert api.call(ep.query, secret).status == 200
    doc = api.ok("GET", "/api-keys").json["items"]
    assert any((d["expires_at"] or "").startswith(f"{today.isoformat()}T23:59:59") and not d["expired"]
               for d in doc)
    yesterday = api.key([ep.query], [ep.connection], expires_at=(today - timedelta(days=1)).isoformat())
    assert api.call(ep.query, yesterday).json["code"] == "key_expired"


def test_the_admin_key_on_the_data_plane(api, endpoint, demo_connection, superuser):
    ep = endpoint("SELECT :n::int AS n", {"n": "int"})
    got = api.call(ep.query, ADMIN_KEY, {"n": "4"})
    assert got.status == 200 and got.json == [{"n": 4}], got
    rid = got.headers["X-Request-Id"]
    assert wait_for_history(superuser, [rid])[rid][5] == 0               # recorded as the admin (key id 0)
    listed = api.ok("GET", "/history", params={"query": ep.query}).json["items"]
    assert [(r["key"], r["status"]) for r in listed if r["request_id"] == rid] == [("admin", 200)]
    adhoc = api.adhoc(ADMIN_KEY, {"sql": "SELECT 5 AS n", "connection_name": demo_connection})
    assert adhoc.status == 200 and adhoc.json == [{"n": 5}]
    # Still governed where the server decides: writes need GATEWAY_ALLOW_WRITES (off here).
    write = api.adhoc(ADMIN_KEY, {"sql": "UPDATE customers SET plan = plan WHERE id = 1",
                                  "connection_name": demo_connection})
    assert write.status == 403 and write.json["code"] == "write_not_allowed"
    for wrong in (ADMIN_KEY + "x", ADMIN_KEY[:-1], "gw_" + ADMIN_KEY):
        assert api.call(ep.query, wrong, {"n": "4"}).status == 401, wrong


def test_a_data_key_on_the_management_api_is_admin_only(api, endpoint):
    ep = endpoint("SELECT 1 AS one")
    got = api.request("GET", "/api/v1/queries", headers={"X-API-Key": ep.secret})
    assert got.status == 403 and got.json["code"] == "admin_only", got
    api.ok("DELETE", f"/api-keys/{ep.key}")
    gone = api.request("GET", "/api/v1/queries", headers={"X-API-Key": ep.secret})
    assert gone.status == 401 and gone.json["code"] == "unauthorized"


def test_a_parameter_without_default_is_required(api, endpoint):
    ep = endpoint("SELECT :a::int AS a, :b::int AS b, :c::int AS c",
                  {"a": "integer", "b": {"type": "int", "default": 2}, "c": {"type": "int", "required": False}})
    versions = api.ok("GET", f"/queries/{ep.query}").json["versions"]
    assert versions[0]["parameters"] == {"a": {"type": "integer", "required": True},
                                         "b": {"type": "integer", "required": False, "default": 2},
                                         "c": {"type": "integer", "required": False}}
    missing = api.call(ep.query, ep.secret)
    assert missing.status == 400 and missing.json["code"] == "param_required" and missing.json["errors"] == \
        {"a": "is required"}
    assert api.call(ep.query, ep.secret, {"a": "1"}).json == [{"a": 1, "b": 2, "c": None}]


def test_driver_options_reach_libpq(api, demo_connection):
    """``sslmode`` beside the fields (QueryAPIGate's form) is kept under ``options`` and used: the
    test server has no TLS, so ``require`` cannot connect, and saving (which reads the schema) fails."""
    name = api.connection(sslmode="disable", keepalives_idle=30)
    assert api.ok("GET", f"/connections/{name}").json["options"] == {"sslmode": "disable", "keepalives_idle": 30}
    query = api.query("SELECT 1 AS one", connection=name)
    secret = api.key([query])
    assert api.call(query, secret).status == 200
    api.ok("PATCH", f"/connections/{name}", {"sslmode": "require"})
    got = api.call(query, secret)
    assert got.status == 503 and got.json["code"] == "database_unavailable", got
    bad = api.manage("POST", "/connections", {"name": unique("c"), "host": "h", "database": "d", "user": "u",
                                              "colour": "red"})
    assert bad.status == 400 and bad.json["code"] == "unknown_field"


def test_history_pages_with_next_cursor(api, endpoint, superuser):
    ep = endpoint("SELECT 1 AS one")
    rids = [api.call(ep.query, ep.secret).headers["X-Request-Id"] for _ in range(3)]
    wait_for_history(superuser, rids)
    seen, cursor = [], None
    for _ in range(3):
        params = {"query": ep.query, "limit": "1", **({"cursor": cursor} if cursor else {})}
        page = api.ok("GET", "/history", params=params).json
        assert len(page["items"]) == 1 and page["items"][0]["kind"] == "saved"
        seen.append(page["items"][0]["request_id"])
        cursor = page["next_cursor"]
        assert cursor
    assert seen == rids[::-1]                               # newest first, each once
    last = api.ok("GET", "/history", params={"query": ep.query, "limit": "5", "cursor": cursor}).json
    assert last == {"items": [], "next_cursor": None}
    for bad in ("x", "%%%", "LTE="):                         # not one this server returned
        got = api.manage("GET", "/history", params={"cursor": bad})
        assert got.status == 400 and got.json["code"] == "invalid_filter", (bad, got)
