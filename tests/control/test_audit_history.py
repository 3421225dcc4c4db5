"""The audit log of management changes and the run history, as the Management API shows
them (``gateway/control/``, ``gateway/http/management.py``): one ``gw_audit`` row per change,
written in the change's own transaction, with who, what, before and after, and never a secret;
``GET /api/v1/audit`` and ``GET /api/v1/history`` filters, and ``invalid_filter`` for a bad one.
"""
from __future__ import annotations

import hashlib
import json
import uuid

import pytest

from helpers.history import wait_for_history
from helpers.util import unique


def audit_rows(superuser, kind: str, name: str) -> list[dict]:
    rows = superuser("SELECT id, actor, client_ip, request_id, action, kind, name, before, after, generation "
                     "FROM gw_audit WHERE kind = %s AND name = %s ORDER BY id", (kind, name))
    columns = ("id", "actor", "client_ip", "request_id", "action", "kind", "name", "before", "after", "generation")
    return [dict(zip(columns, row)) for row in rows]


class Changes:
    """Each management call, checked to have written exactly one audit row."""

    def __init__(self, api, superuser):
        self.api = api
        self.superuser = superuser

    def __call__(self, kind: str, name: str, action: str, method: str, path: str, body=None,
                 expect: int = 200) -> tuple[dict, dict]:
        before = audit_rows(self.superuser, kind, name)
        reply = self.api.manage(method, path, body) if body is not None else self.api.manage(method, path)
        assert reply.status == expect, reply
        after = audit_rows(self.superuser, kind, name)
        assert len(after) == len(before) + 1, f"{action} {kind} {name}: {len(after) - len(before)} audit rows"
        row = after[-1]
        assert (row["action"], row["kind"], row["name"], row["actor"]) == (action, kind, name, "admin")
        assert row["request_id"] == reply.headers["X-Request-Id"]
        assert row["generation"] > 0
        if before:
            assert row["generation"] > before[-1]["generation"]
        return row, (reply.json if reply.content else None)


def secret_free(row: dict, *secrets: str) -> None:
    text = json.dumps([row["before"], row["after"]])
    for secret in secrets:
        assert secret not in text, f"a secret is in the audit row {row['action']} {row['kind']}"
    for doc in (row["before"], row["after"]):
        if doc is not None:
            assert not {"password", "secret_hash", "secret"} & set(doc), sorted(doc)


def test_every_change_writes_one_audit_row_without_secrets(api, superuser, demo_connection):
    change = Changes(api, superuser)
    # --- a connection with a literal password (sealed at rest) ---------------------------
    password = "pw-" + uuid.uuid4().hex
    conn = unique("conn")
    body = {"name": conn, "db": "postgres", "host": "127.0.0.1", "port": 5999, "database": "nowhere",
            "user": "nobody", "password": password}
    row, _ = change("connection", conn, "create", "POST", "/connections", body, expect=201)
    sealed = superuser("SELECT password FROM gw_connections WHERE name = %s", (conn,))[0][0]
    assert sealed.startswith("v1:") and password not in sealed
    assert row["before"] is None and row["after"]["name"] == conn and row["after"]["password_set"] is True
    secret_free(row, password, sealed)
    new_password = "pw-" + uuid.uuid4().hex
    row, _ = change("connection", conn, "update", "PATCH", f"/connections/{conn}",
                    {"port": 5998, "password": new_password})
    assert (row["before"]["port"], row["after"]["port"]) == (5999, 5998)
    new_sealed = superuser("SELECT password FROM gw_connections WHERE name = %s", (conn,))[0][0]
    secret_free(row, password, sealed, new_password, new_sealed)
    row, _ = change("connection", conn, "delete", "DELETE", f"/connections/{conn}", expect=204)
    assert row["before"]["port"] == 5998 and row["after"] is None
    secret_free(row, new_password, new_sealed)

    # --- a saved query, its versions, publish and unpublish -------------------------------
    query = unique("q")
    row, _ = change("query", query, "create", "POST", "/queries",
                    {"name": query, "connection_name": demo_connection, "sql": "SELECT 1 AS one"}, expect=201)
    assert row["before"] is None and row["after"]["published_version"] is None
    assert [v["version"] for v in row["after"]["versions"]] == [1]
    row, _ = change("query", query, "add_version", "POST", f"/queries/{query}/versions",
                    {"connection_name": demo_connection, "sql": "SELECT 2 AS two"}, expect=201)
    assert len(row["before"]["versions"]) == 1 and len(row["after"]["versions"]) == 2
    row, _ = change("query", query, "publish", "POST", f"/queries/{query}/publish", {"version": 2})
    assert (row["before"]["published_version"], row["after"]["published_version"]) == (None, 2)
    row, _ = change("query", query, "publish", "POST", f"/queries/{query}/publish", {"version": 1})
    assert (row["before"]["published_version"], row["after"]["published_version"]) == (2, 1)
    row, _ = change("query", query, "unpublish", "POST", f"/queries/{query}/unpublish", {})
    assert (row["before"]["published_version"], row["after"]["published_version"]) == (1, None)

    # --- an API key: create, update, rotate, delete ------------------------------------------
    key = unique("key")
    row, created = change("key", key, "create", "POST", "/api-keys",
                          {"name": key, "queries": [query], "connections": [demo_connection]}, expect=201)
    first = created["secret"]
    assert row["before"] is None and row["after"]["grants"]["queries"] == [query]
    secret_free(row, first, hashlib.sha256(first.encode()).hexdigest(), first.split("_", 2)[2])
    row, _ = change("key", key, "update", "PATCH", f"/api-keys/{key}", {"active": False})
    assert row["before"]["grants"].get("active", True) is True and row["after"]["grants"]["active"] is False
    secret_free(row, first, hashlib.sha256(first.encode()).hexdigest())
    row, rotated = change("key", key, "rotate", "POST", f"/api-keys/{key}/rotate", {})
    second = rotated["secret"]
    assert second != first and row["before"]["rotated_at"] is None and row["after"]["rotated_at"]
    assert row["before"]["prefix"] != row["after"]["prefix"]   # the public part changes too
    for secret in (first, second):
        secret_free(row, secret, hashlib.sha256(secret.encode()).hexdigest(), secret.split("_", 2)[2])
    row, _ = change("key", key, "delete", "DELETE", f"/api-keys/{key}", expect=204)
    assert row["after"] is None
    secret_free(row, second, hashlib.sha256(second.encode()).hexdigest())

    row, _ = change("query", query, "delete", "DELETE", f"/queries/{query}", expect=204)
    assert row["after"] is None and len(row["before"]["versions"]) == 2

    # The audit API shows the same rows, newest first, and never a secret either.
    listed = api.manage("GET", "/audit", params={"kind": "key", "name": key})
    assert listed.status == 200
    assert [r["action"] for r in listed.json["items"]] == ["delete", "rotate", "update", "create"]
    assert first not in listed.text and second not in listed.text and "secret_hash" not in listed.text
    connection_rows = api.manage("GET", "/audit", params={"kind": "connection", "name": conn}).text
    assert password not in connection_rows and new_password not in connection_rows and sealed not in connection_rows


def test_audit_over_http_records_the_client(http, superuser):
    key = unique("key")
    reply = http.manage("POST", "/api-keys", {"name": key})
    assert reply.status == 201
    (row,) = audit_rows(superuser, "key", key)
    assert (row["actor"], row["client_ip"], row["request_id"]) == ("admin", "127.0.0.1", reply.headers["X-Request-Id"])
    secret_free(row, reply.json["secret"])


def test_a_refused_change_writes_no_audit_row(api, superuser):
    name = unique("none")
    assert api.manage("PATCH", f"/connections/{name}", {"port": 5432}).status == 404
    assert api.manage("DELETE", f"/api-keys/{name}").status == 404
    assert api.manage("POST", f"/queries/{name}/publish", {"version": 1}).status == 404
    assert not superuser("SELECT 1 FROM gw_audit WHERE name = %s", (name,))
    key = unique("key")
    api.key(name=key)
    assert api.manage("POST", "/api-keys", {"name": key}).status == 409
    assert [r["action"] for r in audit_rows(superuser, "key", key)] == ["create"]


def test_audit_filters(api):
    key = unique("key")
    api.key(name=key)
    for body in ({"active": False}, {"active": True}, {"queries": ["a"]}):
        assert api.manage("PATCH", f"/api-keys/{key}", body).status == 200
    assert api.manage("POST", f"/api-keys/{key}/rotate", {}).status == 200

    def items(**params):
        got = api.manage("GET", "/audit", params=params)
        assert got.status == 200, got
        return got.json["items"]
    everything = items(kind="key", name=key)
    assert [r["action"] for r in everything] == ["rotate", "update", "update", "update", "create"]
    assert all(r["kind"] == "key" and r["name"] == key and r["actor"] == "admin" for r in everything)
    assert [r["id"] for r in everything] == sorted((r["id"] for r in everything), reverse=True)
    assert [r["action"] for r in items(kind="key", name=key, limit="2")] == ["rotate", "update"]
    assert [r["action"] for r in items(name=key, action="update")] == ["update"] * 3
    assert items(kind="query", name=key) == []
    # since (inclusive) and until (exclusive), as ISO 8601 with the zone.
    third = everything[2]
    later = items(name=key, since=third["at"])
    assert [r["id"] for r in later] == [r["id"] for r in everything[:3]]
    earlier = items(name=key, until=third["at"])
    assert [r["id"] for r in earlier] == [r["id"] for r in everything[3:]]
    assert len(items(limit="1")) == 1   # no filter: the newest change of the store


def test_history_filters(api, endpoint, superuser):
    ep = endpoint("SELECT :n AS n", {"n": {"type": "int", "default": 1}})
    other = unique("key")
    other_secret = api.key([ep.query], [ep.connection], name=other)
    ids = [api.call(ep.query, ep.secret).headers["X-Request-Id"] for _ in range(3)]
    ids += [api.call(ep.query, other_secret).headers["X-Request-Id"] for _ in range(2)]
    bad = api.call(ep.query, ep.secret, {"n": "x"})
    assert bad.status == 400
    ids.append(bad.headers["X-Request-Id"])
    assert len(wait_for_history(superuser, ids)) == 6

    def items(**params):
        got = api.manage("GET", "/history", params=params)
        assert got.status == 200, got
        return got.json["items"]
    mine = items(query=ep.query)
    assert sorted(r["request_id"] for r in mine) == sorted(ids)
    assert {r["key"] for r in mine} == {ep.key, other}
    assert len(items(query=ep.query, key=ep.key)) == 4
    assert len(items(key=other)) == 2 and {r["status"] for r in items(key=other)} == {200}
    (refused,) = items(query=ep.query, status="400")
    assert refused["request_id"] == bad.headers["X-Request-Id"] and refused["code"] == "param_invalid"
    assert [r["request_id"] for r in items(query=ep.query, code="param_invalid")] == [refused["request_id"]]
    assert len(items(query=ep.query, status="200", key=ep.key)) == 3
    assert len(items(query=ep.query, limit="2")) == 2
    newest = items(query=ep.query, limit="1")[0]
    assert newest["request_id"] == ids[-1]
    assert items(query=ep.query, since=newest["at"])[0]["request_id"] == ids[-1]
    assert items(query=unique("none")) == []


@pytest.mark.parametrize("path, params", [
    ("/history", {"colour": "red"}),
    ("/history", {"status": "ok"}),
    ("/history", {"status": "2OO"}),
    ("/history", {"since": "yesterday"}),
    ("/history", {"until": "2024-13-01"}),
    ("/history", {"limit": "0"}),
    ("/history", {"limit": "-1"}),
    ("/history", {"limit": "abc"}),
    ("/history", {"limit": "10001"}),
    ("/history", [("status", "200"), ("status", "400")]),
    ("/history", [("limit", "1"), ("limit", "2")]),
    ("/audit", {"query": "x"}),           # a history filter is not an audit filter
    ("/audit", {"since": "last week"}),
    ("/audit", {"limit": "1e3"}),
    ("/audit", [("kind", "key"), ("kind", "query")]),
    # digits str.isdigit() takes and int() or PostgreSQL does not ("²"), or reads as 1 ("١")
    ("/history", {"limit": "\u00b2"}),
    ("/history", {"status": "\u00b2"}),
    ("/history", {"status": "\u0662\u0660\u0660"}),
    ("/audit", {"limit": "\u00b2"}),
    ("/audit", {"limit": "\u0661"}),
    ("/audit", {"cursor": "wrI="}),       # "²", base64: not a cursor this server returned
])
def test_bad_filters_answer_invalid_filter(api, path, params):
    got = api.manage("GET", path, params=params if isinstance(params, dict) else None,
                     query_string=None if isinstance(params, dict) else "&".join(f"{k}={v}" for k, v in params))
    assert got.status == 400 and got.json["code"] == "invalid_filter", got
    assert got.json["request_id"] == got.headers["X-Request-Id"]
