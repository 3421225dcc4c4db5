"""Drafts, versions, publish and roll back."""
from __future__ import annotations

from helpers.util import unique


def statuses(api, name) -> dict[int, str]:
    got = api.manage("GET", f"/queries/{name}")
    assert got.status == 200, got
    return {v["version"]: v["status"] for v in got.json["versions"]}


def test_drafts_versions_publish_and_rollback(api, demo_connection):
    name = unique("versioned")
    secret = api.key([name], [demo_connection])
    created = api.manage("POST", "/queries", {"name": name, "connection_name": demo_connection,
                                              "sql": "SELECT 1 AS v"})
    assert created.status == 201 and created.json["published_version"] is None
    assert created.json["has_draft"] is True
    draft_only = api.call(name, secret)
    assert draft_only.status == 404 and draft_only.json["code"] == "not_published"   # a key that reaches it
    stranger = api.call(name, api.key([], []))
    assert stranger.status == 404 and stranger.json["code"] == "query_not_found"     # others learn nothing

    assert api.manage("POST", f"/queries/{name}/publish", {"version": 1}).json["published_version"] == 1
    assert api.call(name, secret).json == [{"v": 1}]

    # A new version is a draft: the published one keeps being served.
    v2 = api.manage("POST", f"/queries/{name}/versions", {"connection_name": demo_connection,
                                                          "sql": "SELECT 2 AS v, :x AS x",
                                                          "parameters": {"x": {"type": "int", "default": 0}}})
    assert v2.status == 201, v2
    assert (v2.json["published_version"], v2.json["latest_version"], v2.json["has_draft"]) == (1, 2, True)
    assert api.call(name, secret).json == [{"v": 1}]
    assert statuses(api, name) == {1: "published", 2: "draft"}
    draft = api.call(name, secret, {"version": "2"})
    assert draft.status == 404 and draft.json["code"] == "version_not_found"
    assert api.call(name, secret, {"version": "1"}).json == [{"v": 1}]
    assert api.call(name, secret, {"version": "9"}).json["code"] == "version_not_found"

    # Publish forward.
    assert api.manage("POST", f"/queries/{name}/publish", {"version": 2}).status == 200
    assert api.call(name, secret, {"x": "5"}).json == [{"v": 2, "x": 5}]
    assert statuses(api, name) == {1: "previously_published", 2: "published"}
    old = api.call(name, secret, {"version": "1"})
    assert old.status == 200 and old.json == [{"v": 1}]
    # Each version validates against its own parameters.
    assert api.call(name, secret, {"version": "1", "x": "5"}).json["code"] == "param_invalid"
    assert api.post(name, secret, {"version": 1}).json == [{"v": 1}]

    # Roll back.
    assert api.manage("POST", f"/queries/{name}/publish", {"version": 1}).json["published_version"] == 1
    assert api.call(name, secret).json == [{"v": 1}]
    assert statuses(api, name) == {1: "published", 2: "previously_published"}

    missing = api.manage("POST", f"/queries/{name}/publish", {"version": 7})
    assert missing.status == 404 and missing.json["code"] == "version_not_found"
    wrong = api.manage("POST", f"/queries/{name}/publish", {"version": "2"})
    assert wrong.status == 400 and wrong.json["code"] == "invalid_body"

    # A version created with publish: true is served at once; publish with no body takes the latest.
    v3 = api.manage("POST", f"/queries/{name}/versions", {"connection_name": demo_connection,
                                                          "sql": "SELECT 3 AS v", "publish": True})
    assert v3.json["published_version"] == 3
    assert api.call(name, secret).json == [{"v": 3}]
    api.manage("POST", f"/queries/{name}/versions", {"connection_name": demo_connection, "sql": "SELECT 4 AS v"})
    assert api.manage("POST", f"/queries/{name}/publish").json["published_version"] == 4
    assert api.call(name, secret).json == [{"v": 4}]

    # Unpublish: nothing served, versions kept.
    assert api.manage("POST", f"/queries/{name}/unpublish").json["published_version"] is None
    assert api.call(name, secret).json["code"] == "not_published"
    assert api.call(name, secret, {"version": "4"}).json["code"] == "not_published"

    # Delete.
    assert api.manage("DELETE", f"/queries/{name}").status == 204
    for method, path in (("GET", f"/queries/{name}"), ("DELETE", f"/queries/{name}"),
                         ("POST", f"/queries/{name}/publish"), ("POST", f"/queries/{name}/unpublish")):
        got = api.manage(method, path)
        assert got.status == 404 and got.json["code"] == "query_not_found", (method, path, got)
    assert api.call(name, secret).json["code"] == "query_not_found"


def test_add_version_checks(api, demo_connection):
    name = api.query("SELECT 1 AS v", connection=demo_connection)
    unknown = api.manage("POST", f"/queries/{unique('none')}/versions",
                         {"connection_name": demo_connection, "sql": "SELECT 1"})
    assert unknown.status == 404 and unknown.json["code"] == "query_not_found"
    renamed = api.manage("POST", f"/queries/{name}/versions",
                         {"name": "other", "connection_name": demo_connection, "sql": "SELECT 1"})
    assert renamed.status == 400 and renamed.json["code"] == "invalid_body"
    bad_sql = api.manage("POST", f"/queries/{name}/versions",
                         {"connection_name": demo_connection, "sql": "DELETE FROM orders; SELECT 1"})
    assert bad_sql.status == 400 and bad_sql.json["code"] == "multiple_statements"
    assert statuses(api, name) == {1: "published"}


def test_invalid_version_argument(api, endpoint):
    ep = endpoint("SELECT 1 AS v")
    for value in ("abc", "0", "-1", "1.0"):
        got = api.call(ep.query, ep.secret, {"version": value})
        assert got.status == 400 and got.json["code"] == "invalid_version", (value, got)
    assert api.post(ep.query, ep.secret, {"version": True}).json["code"] == "invalid_version"
    assert api.call(ep.query, ep.secret, query_string="version=1&version=1").json["code"] == "invalid_version"


def test_a_read_is_stored_with_its_paged_form(api, demo_connection, superuser):
    # Read and checked by PostgreSQL's parser at save time, so that loading the catalog
    # (every worker, on every change) parses nothing.
    from gateway.sql import paged, read
    sql = "SELECT id FROM customers WHERE country = :c ORDER BY id"
    name = api.query(sql, {"c": {"type": "str", "default": "FR"}}, connection=demo_connection)
    (stored,) = superuser("SELECT v.extra->'analysis' FROM gw_query_versions v JOIN gw_queries q "
                          "ON q.id = v.query_id WHERE q.name = %s", (name,))
    assert stored[0]["paged"] == paged(read(sql, frozenset({"c"}))).text
