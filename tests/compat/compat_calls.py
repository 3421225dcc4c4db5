"""The calls the differential suite sends to QueryAPIGate 0.43.0 and to this gateway, in order
(later calls use what earlier ones made). Taken first from QueryAPIGate's README and the
examples of its API reference (``loadtests/PEER.md`` quotes them), then from the situations
issue 15 lists.

``~`` in a path, a body or a key name stands for the run's suffix, so the objects never clash
with those of other tests sharing this gateway's store. ``key``: ``"admin"`` (each server's
admin key), ``None`` (no key), ``"bad"`` (an unknown key) or the name of a key made by an
earlier call (``name@old``: its secret before the last rotation). ``schema``: the component of
QueryAPIGate's own ``/openapi.json`` whose required fields the answer must carry.
``differs``: the name of a documented difference (``compat_differences.py``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from helpers.util import PASSWORD_ENV

ACCOUNT_SQL = "SELECT aid, bid, abalance FROM pgbench_accounts WHERE aid = :aid"
FILM_SQL = "SELECT id, name, country FROM customers WHERE id = :id"   # the README's film_by_id, on our demo data
RANGE_SQL = "SELECT aid, abalance FROM pgbench_accounts WHERE aid BETWEEN :lo AND :hi ORDER BY aid"


@dataclass(frozen=True)
class Call:
    id: str
    method: str
    path: str
    body: object = None
    key: str | None = "admin"
    qs: dict | None = None
    schema: str | None = None
    differs: str | None = None
    headers: tuple = field(default=())      # response headers that must be equal


def connection_body(name: str, port: int, database: str, **extra) -> dict:
    return {"name": name, "db": "postgres", "host": "127.0.0.1", "port": port, "database": database,
            "user": "postgres", "password": f"${{{PASSWORD_ENV}}}", **extra}


def calls(port: int, database: str) -> list[Call]:
    today = datetime.now(UTC).date().isoformat()
    yesterday = (datetime.now(UTC) - timedelta(days=2)).date().isoformat()
    c = []

    def add(*args, **kw):
        c.append(Call(*args, **kw))

    # --- connections -------------------------------------------------------------------
    add("conn.create", "POST", "/api/v1/connections", connection_body("demo~", port, database),
        schema="ConnectionDetail")
    add("conn.create.sslmode", "POST", "/api/v1/connections",
        connection_body("opts~", port, database, sslmode="disable"), schema="ConnectionDetail")
    add("conn.create.exists", "POST", "/api/v1/connections", connection_body("demo~", port, database))
    add("conn.get", "GET", "/api/v1/connections/demo~", schema="ConnectionDetail")
    add("conn.get.missing", "GET", "/api/v1/connections/nope~")
    add("conn.list", "GET", "/api/v1/connections", schema="ConnectionList")
    add("conn.create.inactive", "POST", "/api/v1/connections",
        connection_body("idle~", port, database, active=False), schema="ConnectionDetail")

    # --- queries (PEER.md's "account", the README's "film_by_id") ------------------------
    add("query.create.peer_md", "POST", "/api/v1/queries",
        {"name": "account~", "description": "One account by primary key", "sql": ACCOUNT_SQL,
         "connection_name": "demo~", "parameters": {"aid": "int"}, "publish": True}, schema="Query")
    add("query.create.readme", "POST", "/api/v1/queries",
        {"name": "film_by_id~", "sql": FILM_SQL,
         "parameters": {"id": {"type": "int", "min": 1, "max": 60, "description": "Film id"}},
         "connection_name": "demo~", "author": "me", "description": "Look up a film", "publish": True},
        schema="Query")
    add("query.create.json_types", "POST", "/api/v1/queries",
        {"name": "range~", "description": "Accounts in a range", "sql": RANGE_SQL, "connection_name": "demo~",
         "parameters": {"lo": {"type": "integer", "default": 1}, "hi": "integer"}, "publish": True,
         "cache_ttl": 0, "columns": {}, "tags": ["accounts~"]}, schema="Query")
    add("query.create.on_idle", "POST", "/api/v1/queries",
        {"name": "idle_q~", "description": "On an inactive connection", "sql": ACCOUNT_SQL,
         "connection_name": "idle~", "parameters": {"aid": "int"}, "publish": True}, schema="Query")
    add("query.create.exists", "POST", "/api/v1/queries",
        {"name": "account~", "description": "again", "sql": ACCOUNT_SQL, "connection_name": "demo~",
         "parameters": {"aid": "int"}})
    add("query.create.unknown_field", "POST", "/api/v1/queries",
        {"name": "bad_field~", "description": "x", "sql": ACCOUNT_SQL, "connection_name": "demo~",
         "parameters": {"aid": "int"}, "colour": "blue"})
    add("query.create.unknown_type", "POST", "/api/v1/queries",
        {"name": "bad_type~", "description": "x", "sql": ACCOUNT_SQL, "connection_name": "demo~",
         "parameters": {"aid": "uuid"}})
    add("query.create.no_description", "POST", "/api/v1/queries",
        {"name": "nodesc~", "sql": ACCOUNT_SQL, "connection_name": "demo~", "parameters": {"aid": "int"}},
        differs="description_optional")
    add("query.create.draft", "POST", "/api/v1/queries",
        {"name": "draft~", "description": "A draft", "sql": ACCOUNT_SQL, "connection_name": "demo~",
         "parameters": {"aid": "int"}}, schema="Query")
    add("query.version.add", "POST", "/api/v1/queries/draft~/versions",
        {"description": "v2", "sql": "SELECT aid, bid FROM pgbench_accounts WHERE aid = :aid",
         "connection_name": "demo~", "parameters": {"aid": "int"}}, schema="Query")
    add("query.create.vdel", "POST", "/api/v1/queries",
        {"name": "vdel~", "description": "Two versions", "sql": ACCOUNT_SQL, "connection_name": "demo~",
         "parameters": {"aid": "int"}, "publish": True}, schema="Query")
    add("query.version.add.vdel", "POST", "/api/v1/queries/vdel~/versions",
        {"description": "v2", "sql": ACCOUNT_SQL, "connection_name": "demo~", "parameters": {"aid": "int"}},
        schema="Query")
    add("query.version.delete", "DELETE", "/api/v1/queries/vdel~/versions/2", differs="versions_kept")
    add("query.get", "GET", "/api/v1/queries/account~", schema="Query")
    add("query.get.missing", "GET", "/api/v1/queries/nope~")
    add("query.list", "GET", "/api/v1/queries", schema="QueryList")
    add("query.list.search", "GET", "/api/v1/queries", qs={"search": "account~"}, schema="QueryList")
    add("query.list.search_tag", "GET", "/api/v1/queries", qs={"search": "ACCOUNTS~"}, schema="QueryList")
    add("query.list.published", "GET", "/api/v1/queries", qs={"search": "~", "status": "published"},
        schema="QueryList")
    add("query.list.draft", "GET", "/api/v1/queries", qs={"search": "draft~", "status": "draft"},
        schema="QueryList")
    add("query.list.connection", "GET", "/api/v1/queries", qs={"connection": "idle~"}, schema="QueryList")
    add("query.list.bad_status", "GET", "/api/v1/queries", qs={"status": "sometimes"})
    add("query.list.unknown_filter", "GET", "/api/v1/queries", qs={"stauts": "draft"},
        differs="unknown_filter_refused")

    # --- keys --------------------------------------------------------------------------
    add("key.create.both", "POST", "/api/v1/api-keys",
        {"name": "reader~", "queries": ["account~", "film_by_id~", "range~"], "connections": ["demo~"]},
        schema="ApiKeyCreated")
    add("key.create.queries_only", "POST", "/api/v1/api-keys",
        {"name": "qonly~", "queries": ["account~"], "connections": []}, schema="ApiKeyCreated")
    add("key.create.connection_only", "POST", "/api/v1/api-keys",
        {"name": "conly~", "connections": ["demo~"]}, schema="ApiKeyCreated")
    add("key.create.all_connections", "POST", "/api/v1/api-keys",
        {"name": "star~", "connections": "*"}, schema="ApiKeyCreated")
    add("key.create.all_queries", "POST", "/api/v1/api-keys",
        {"name": "qstar~", "queries": "*", "connections": []}, schema="ApiKeyCreated")
    add("key.create.object_entries", "POST", "/api/v1/api-keys",
        {"name": "objq~", "queries": [{"name": "account~"}, "range~"], "connections": [], "max_concurrent": 4},
        schema="ApiKeyCreated")
    add("key.create.default_connections", "POST", "/api/v1/api-keys",
        {"name": "deflt~", "queries": ["account~"]}, differs="no_connections_means_none")
    add("key.create.idle", "POST", "/api/v1/api-keys",
        {"name": "idlek~", "queries": ["idle_q~"], "connections": ["idle~"]}, schema="ApiKeyCreated")
    add("key.create.expires_today", "POST", "/api/v1/api-keys",
        {"name": "today~", "connections": ["demo~"], "expires_at": today}, schema="ApiKeyCreated")
    add("key.create.expired", "POST", "/api/v1/api-keys",
        {"name": "old~", "connections": ["demo~"], "expires_at": yesterday}, schema="ApiKeyCreated")
    add("key.create.quota", "POST", "/api/v1/api-keys",
        {"name": "quota~", "queries": ["account~"], "connections": [], "quota": {"calls": 100, "per": "day"}},
        schema="ApiKeyCreated")
    add("key.create.unknown_field", "POST", "/api/v1/api-keys", {"name": "badk~", "colour": "blue"})
    add("key.create.exists", "POST", "/api/v1/api-keys", {"name": "reader~", "connections": ["demo~"]})
    add("key.get", "GET", "/api/v1/api-keys/reader~", schema="ApiKey")
    add("key.get.missing", "GET", "/api/v1/api-keys/nope~")
    add("key.list", "GET", "/api/v1/api-keys", schema="ApiKeyList")

    # --- the data plane: the README's examples --------------------------------------------
    add("q.readme.yaml", "GET", "/q/film_by_id~", key="admin", qs={"id": "7", "format": "yaml"})
    add("q.readme.min", "GET", "/q/film_by_id~", key="admin", qs={"id": "0"})
    add("q.peer_md", "GET", "/q/account~", key="reader~", qs={"aid": "42"}, headers=("X-Page", "X-Page-Size",
                                                                                  "X-Row-Count", "X-Has-More"))
    add("q.post.params", "POST", "/q/account~", {"params": {"aid": 42}}, key="reader~")
    add("q.post.bare", "POST", "/q/account~", {"aid": 42}, key="reader~", differs="unknown_body_field_refused")
    add("q.admin", "GET", "/q/account~", key="admin", qs={"aid": "1"})
    add("q.quota", "GET", "/q/account~", key="quota~", qs={"aid": "1"})
    add("q.no_key", "GET", "/q/account~", key=None, qs={"aid": "1"})
    add("q.bad_key", "GET", "/q/account~", key="bad", qs={"aid": "1"})
    add("q.missing_param", "GET", "/q/account~", key="reader~")
    add("q.bad_param", "GET", "/q/account~", key="reader~", qs={"aid": "x"})
    add("q.unknown_param", "GET", "/q/account~", key="reader~", qs={"aid": "1", "colour": "blue"},
        differs="unknown_parameter_refused")
    add("q.no_rows", "GET", "/q/account~", key="reader~", qs={"aid": "-5"}, differs="empty_result_is_a_list")
    add("q.missing", "GET", "/q/nope~", key="reader~")
    add("q.default_param", "GET", "/q/range~", key="reader~", qs={"hi": "3"})
    add("q.required_param", "GET", "/q/range~", key="reader~", qs={"lo": "3"})
    add("q.page2", "GET", "/q/range~", key="reader~", qs={"lo": "1", "hi": "9", "page": "2", "page_size": "3"},
        headers=("X-Page", "X-Page-Size", "X-Row-Count", "X-Has-More"))
    add("q.default_page_size", "GET", "/q/range~", key="reader~", qs={"lo": "1", "hi": "30"},
        headers=("X-Page", "X-Page-Size", "X-Row-Count", "X-Has-More"))
    add("q.csv", "GET", "/q/range~", key="reader~", qs={"lo": "1", "hi": "4", "format": "csv"})
    add("q.tsv", "GET", "/q/range~", key="reader~", qs={"lo": "1", "hi": "4", "format": "tsv"})
    add("q.ndjson", "GET", "/q/range~", key="reader~", qs={"lo": "1", "hi": "4", "format": "ndjson"})
    add("q.xml", "GET", "/q/range~", key="reader~", qs={"lo": "1", "hi": "4", "format": "xml"})
    add("q.xml.names", "GET", "/q/film_by_id~", key="reader~", qs={"id": "9", "format": "xml"})
    add("q.xlsx", "GET", "/q/range~", key="reader~", qs={"lo": "1", "hi": "4", "format": "xlsx"},
        differs="formats_subset")
    add("q.bad_format", "GET", "/q/range~", key="reader~", qs={"hi": "4", "format": "bogus"})
    add("q.page0", "GET", "/q/range~", key="reader~", qs={"hi": "4", "page": "0"})
    add("q.page_size_big", "GET", "/q/range~", key="reader~", qs={"hi": "4", "page_size": "5000"})
    add("q.version_missing", "GET", "/q/account~", key="reader~", qs={"aid": "1", "version": "9"})
    add("q.version_1", "GET", "/q/account~", key="reader~", qs={"aid": "1", "version": "1"})
    add("q.bad_timeout", "GET", "/q/account~", key="reader~", qs={"aid": "1", "timeout": "x"})
    add("q.stream_ndjson", "GET", "/q/range~", key="reader~", qs={"lo": "1", "hi": "5", "stream": "true",
                                                                   "format": "ndjson"})
    add("q.stream_csv", "GET", "/q/range~", key="reader~", qs={"lo": "1", "hi": "5", "stream": "true",
                                                                "format": "csv"})
    add("q.stream_bad", "GET", "/q/account~", key="reader~", qs={"aid": "1", "stream": "maybe"},
        differs="stream_value_checked")
    add("q.connection_name", "GET", "/q/account~", key="reader~", qs={"aid": "2", "connection_name": "demo~"})
    add("q.connection_name.other", "GET", "/q/account~", key="star~", qs={"aid": "2", "connection_name": "opts~"},
        differs="other_connection_refused")

    # --- grants: additive, "*", object entries ---------------------------------------------
    add("grant.queries_only.granted", "GET", "/q/account~", key="qonly~", qs={"aid": "3"})
    add("grant.queries_only.other", "GET", "/q/film_by_id~", key="qonly~", qs={"id": "3"})
    add("grant.queries_only.adhoc", "POST", "/execute_sql", {"sql": "SELECT 1 AS x", "connection_name": "demo~"},
        key="qonly~")
    add("grant.connection_only.query", "GET", "/q/film_by_id~", key="conly~", qs={"id": "3"})
    add("grant.connection_only.adhoc", "POST", "/execute_sql", {"sql": "SELECT 1 AS x", "connection_name": "demo~"},
        key="conly~")
    add("grant.star.query", "GET", "/q/account~", key="star~", qs={"aid": "4"})
    add("grant.star.adhoc", "POST", "/execute_sql", {"sql": "SELECT 2 AS x", "connection_name": "demo~"},
        key="star~")
    add("grant.qstar.query", "GET", "/q/film_by_id~", key="qstar~", qs={"id": "4"})
    add("grant.qstar.adhoc", "POST", "/execute_sql", {"sql": "SELECT 1 AS x", "connection_name": "demo~"},
        key="qstar~")
    add("grant.object_entries.query", "GET", "/q/account~", key="objq~", qs={"aid": "5"})
    add("grant.object_entries.string", "GET", "/q/range~", key="objq~", qs={"hi": "2"})
    add("grant.object_entries.other", "GET", "/q/film_by_id~", key="objq~", qs={"id": "5"})
    add("grant.default.granted", "GET", "/q/account~", key="deflt~", qs={"aid": "6"})
    add("grant.default.other", "GET", "/q/film_by_id~", key="deflt~", qs={"id": "6"},
        differs="no_connections_means_none")
    add("describe.openapi", "GET", "/openapi.json", key="qonly~", differs="openapi_31")
    add("describe.openapi.objects", "GET", "/openapi.json", key="objq~", differs="openapi_31")
    add("describe.catalog", "GET", "/catalog", key="qonly~")
    add("describe.catalog.connection", "GET", "/catalog", key="idlek~")
    add("describe.catalog.no_key", "GET", "/catalog", key=None)
    add("grant.scoped_on_management", "GET", "/api/v1/queries", key="reader~")
    add("grant.scoped_on_keys", "POST", "/api/v1/api-keys", {"name": "sneaky~"}, key="reader~")
    add("grant.inactive_connection", "GET", "/q/idle_q~", key="idlek~", qs={"aid": "1"})

    # --- /execute_sql ------------------------------------------------------------------
    add("sql.readme", "POST", "/execute_sql",
        {"sql": "SELECT aid, abalance FROM pgbench_accounts WHERE aid > :min ORDER BY aid", "params": {"min": 10},
         "connection_name": "demo~"}, key="admin", qs={"page_size": "3"},
        headers=("X-Page", "X-Page-Size", "X-Row-Count", "X-Has-More"))
    add("sql.page2", "POST", "/execute_sql",
        {"sql": "SELECT aid FROM pgbench_accounts ORDER BY aid", "connection_name": "demo~"}, key="conly~",
        qs={"page": "2", "page_size": "2"}, headers=("X-Page", "X-Page-Size", "X-Row-Count", "X-Has-More"))
    add("sql.csv", "POST", "/execute_sql",
        {"sql": "SELECT aid FROM pgbench_accounts ORDER BY aid", "connection_name": "demo~"}, key="conly~",
        qs={"page_size": "2", "format": "csv"})
    add("sql.stream", "POST", "/execute_sql",
        {"sql": "SELECT aid FROM pgbench_accounts WHERE aid <= 3 ORDER BY aid", "connection_name": "demo~"},
        key="conly~", qs={"stream": "true", "format": "ndjson"})
    add("sql.body_args", "POST", "/execute_sql",
        {"sql": "SELECT aid FROM pgbench_accounts ORDER BY aid", "connection_name": "demo~", "page_size": 2,
         "format": "csv"}, key="conly~", differs="body_paging")
    add("sql.no_connection", "POST", "/execute_sql", {"sql": "SELECT 1"}, key="conly~")
    add("sql.no_sql", "POST", "/execute_sql", {"connection_name": "demo~"}, key="conly~")
    add("sql.unknown_connection.admin", "POST", "/execute_sql", {"sql": "SELECT 1", "connection_name": "nope~"},
        key="admin")
    add("sql.unknown_connection", "POST", "/execute_sql", {"sql": "SELECT 1", "connection_name": "nope~"},
        key="conly~", differs="unknown_connection_404")
    add("sql.db_error", "POST", "/execute_sql", {"sql": "SELECT 1/0 AS x", "connection_name": "demo~"},
        key="conly~", differs="database_error_is_400")
    add("sql.write", "POST", "/execute_sql",
        {"sql": "UPDATE pgbench_accounts SET abalance = 0 WHERE aid = 1", "connection_name": "demo~"},
        key="conly~", differs="write_code")
    add("sql.unknown_field", "POST", "/execute_sql",
        {"sql": "SELECT 1 AS x", "connection_name": "demo~", "colour": "blue"}, key="conly~",
        differs="unknown_body_field_refused")
    add("sql.no_key", "POST", "/execute_sql", {"sql": "SELECT 1 AS x", "connection_name": "demo~"}, key=None)

    # --- keys over time: expiry, rotation with grace, revocation ----------------------------
    add("key.expires_today.works", "GET", "/q/account~", key="today~", qs={"aid": "7"})
    add("key.expired.refused", "GET", "/q/account~", key="old~", qs={"aid": "7"}, differs="expired_key_code")
    add("key.rotate", "POST", "/api/v1/api-keys/conly~/rotate", {}, schema="ApiKeyCreated")
    add("key.rotate.new_secret", "GET", "/q/account~", key="conly~", qs={"aid": "8"})
    add("key.rotate.old_secret_in_grace", "GET", "/q/account~", key="conly~@old", qs={"aid": "8"})
    add("key.rotate.pending", "POST", "/api/v1/api-keys/conly~/rotate", {})
    add("key.previous.end", "DELETE", "/api/v1/api-keys/conly~/previous", schema="ApiKey")
    add("key.previous.ended", "GET", "/q/account~", key="conly~@old", qs={"aid": "8"})
    add("key.previous.none", "DELETE", "/api/v1/api-keys/conly~/previous")
    add("key.rotate.no_grace", "POST", "/api/v1/api-keys/star~/rotate", {"grace_minutes": 0},
        schema="ApiKeyCreated")
    add("key.rotate.no_grace.old_secret", "GET", "/q/account~", key="star~@old", qs={"aid": "8"})
    add("key.deactivate", "PATCH", "/api/v1/api-keys/objq~", {"active": False}, schema="ApiKey")
    add("key.deactivated.refused", "GET", "/q/account~", key="objq~", qs={"aid": "9"})
    add("key.delete", "DELETE", "/api/v1/api-keys/qstar~")
    add("key.deleted.refused", "GET", "/q/film_by_id~", key="qstar~", qs={"id": "9"})

    # --- versions and publishing ---------------------------------------------------------
    add("q.draft.unpublished", "GET", "/q/draft~", key="conly~", qs={"aid": "1"})
    add("query.publish", "POST", "/api/v1/queries/draft~/publish", {"version": 2}, schema="Query")
    add("q.published.v2", "GET", "/q/draft~", key="conly~", qs={"aid": "1"})
    add("query.publish.missing_version", "POST", "/api/v1/queries/draft~/publish", {"version": 7})
    add("query.unpublish", "POST", "/api/v1/queries/draft~/unpublish", {}, schema="Query")
    add("q.after_unpublish", "GET", "/q/draft~", key="conly~", qs={"aid": "1"})
    add("query.delete", "DELETE", "/api/v1/queries/draft~")
    add("query.delete.missing", "DELETE", "/api/v1/queries/draft~")
    add("q.deleted", "GET", "/q/draft~", key="conly~", qs={"aid": "1"})

    # --- history, audit, quota usage, health ---------------------------------------------
    add("history", "GET", "/api/v1/history", qs={"limit": "5"}, schema="HistoryPage")
    add("history.status", "GET", "/api/v1/history", qs={"limit": "1"}, differs="history_status")
    add("audit", "GET", "/api/v1/audit", schema="AuditLog")
    add("usage.quotas", "GET", "/api/v1/usage/quotas", schema="QuotaCounterList")
    add("health", "GET", "/health", key=None)
    return c
