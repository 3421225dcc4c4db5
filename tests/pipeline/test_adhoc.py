"""``POST /execute_sql``: ad-hoc SQL, analysed and governed exactly like a saved query."""
from __future__ import annotations

import json

from helpers.util import unique


def test_read_with_bound_params_and_paging(api, demo_connection):
    secret = api.key([], [demo_connection])
    got = api.adhoc(secret, {"sql": "SELECT id, country FROM customers WHERE country = :c ORDER BY id",
                             "params": {"c": "FR"}, "connection_name": demo_connection, "page_size": 3})
    assert got.status == 200, got
    assert len(got.json) == 3 and all(r["country"] == "FR" for r in got.json)
    assert got.headers["X-Has-More"] == "true"
    # Injection through a parameter is only data.
    evil = api.adhoc(secret, {"sql": "SELECT count(*) AS n FROM customers WHERE name = :n",
                              "params": {"n": "x'; DROP TABLE customers; --"}, "connection_name": demo_connection})
    assert evil.json == [{"n": 0}]


def test_needs_the_connection_grant(api, demo_connection):
    without = api.key([], [])
    got = api.adhoc(without, {"sql": "SELECT 1 AS one", "connection_name": demo_connection})
    assert got.status == 403 and got.json["code"] == "connection_forbidden", got
    # A queries grant ("*" too) reaches saved queries, never ad-hoc SQL.
    by_name = api.key(["*"], [])
    got = api.adhoc(by_name, {"sql": "SELECT 1 AS one", "connection_name": demo_connection})
    assert got.status == 403 and got.json["code"] == "connection_forbidden", got
    assert api.adhoc(api.key([], "*"), {"sql": "SELECT 1 AS one", "connection_name": demo_connection}).json == \
        [{"one": 1}]
    for body, code in (({"sql": "SELECT 1"}, "connection_required"), ({"connection_name": demo_connection},
                                                                      "sql_required")):
        got = api.adhoc(by_name, body)   # checked before the grant, as QueryAPIGate does
        assert got.status == 400 and got.json["code"] == code, got
    unknown = api.adhoc(without, {"sql": "SELECT 1 AS one", "connection_name": "nope_conn"})
    assert unknown.status == 404 and unknown.json["code"] == "connection_not_found", unknown


def test_analysed_like_a_saved_query(api, demo_connection):
    secret = api.key([], [demo_connection], mask=[{"column": "customers.email", "action": "null"}],
                     allowed_tables=["public.customers"])
    masked = api.adhoc(secret, {"sql": "SELECT lower(email) AS e FROM customers WHERE id = 1",
                                "connection_name": demo_connection})
    assert masked.status == 200 and masked.json == [{"e": None}], masked
    for sql, code in [("SELECT 1; DROP TABLE customers", "multiple_statements"),
                      ("SELECT pg_read_file('/etc/passwd')", "function_not_allowed"),
                      ("SELECT id FROM orders", "table_not_allowed"),
                      ("SELECT row_to_json(c) FROM customers c", "mask_unresolvable"),
                      ("DELETE FROM customers", "write_not_allowed")]:
        got = api.adhoc(secret, {"sql": sql, "connection_name": demo_connection})
        assert got.json["code"] == code, (sql, got)
        again = api.adhoc(secret, {"sql": sql, "connection_name": demo_connection})  # cached refusal
        assert again.json["code"] == code


def test_missing_and_unknown_params(api, demo_connection):
    secret = api.key([], [demo_connection])
    got = api.adhoc(secret, {"sql": "SELECT :a AS a", "connection_name": demo_connection})
    assert got.status == 400 and got.json["code"] == "param_required" and "a" in got.json["errors"]
    extra = api.adhoc(secret, {"sql": "SELECT 1 AS a", "params": {"b": 1}, "connection_name": demo_connection})
    assert extra.status == 400 and extra.json["code"] == "param_invalid"
    nested = api.adhoc(secret, {"sql": "SELECT :a AS a", "params": {"a": [1]}, "connection_name": demo_connection})
    assert nested.status == 400 and nested.json["code"] == "param_invalid"


def test_a_refusal_lasts_only_until_the_schema_is_read_again(api, demo_connection, superuser):
    # An ad-hoc statement naming a table that does not exist yet is refused, and the refusal
    # is kept; once the worker reads the connection's schema again (here: saving a query on
    # it reads it afresh), the statement is analysed anew.
    secret = api.key([], [demo_connection])
    table = unique("later").lower()
    body = {"sql": f"SELECT id FROM {table}", "connection_name": demo_connection}
    assert api.adhoc(secret, body).json["code"] == "unknown_table"
    superuser(f"CREATE TABLE {table} (id int)", db="demo")
    superuser(f"GRANT SELECT ON {table} TO PUBLIC", db="demo")
    assert api.adhoc(secret, body).json["code"] == "unknown_table"      # still the kept refusal
    api.query("SELECT 1 AS one", connection=demo_connection)             # reads the schema afresh
    got = api.adhoc(secret, body)
    assert got.status == 200 and got.json == [], got


def test_a_plan_lasts_only_until_the_schema_is_read_again(api, demo_connection, superuser):
    # The key's plan for an ad-hoc text is memoised; once the worker reads the connection's
    # schema again and the text means something else there (a table now inherits from the one
    # read, and the mask on the child applies through the parent), the plan is made anew:
    # never the one planned from the old analysis.
    parent, child = unique("people").lower(), unique("vip").lower()
    superuser(f"CREATE TABLE {parent} (id int, email text)", db="demo")
    superuser(f"CREATE TABLE {child} (id int, email text)", db="demo")
    superuser(f"INSERT INTO {child} VALUES (1, 'vip.secret@example.com')", db="demo")
    superuser(f"GRANT SELECT ON {parent}, {child} TO PUBLIC", db="demo")
    secret = api.key([], [demo_connection], allowed_tables=[f"public.{parent}"],
                     mask=[{"column": f"{child}.email", "action": "null"}])
    body = {"sql": f"SELECT email FROM {parent}", "connection_name": demo_connection}
    api.query("SELECT 1 AS one", connection=demo_connection)             # the worker reads the schema
    first = api.adhoc(secret, body)
    assert first.status == 200 and first.json == [], first                # planned: nothing to mask
    superuser(f"ALTER TABLE {child} INHERIT {parent}", db="demo")
    api.query("SELECT 1 AS one", connection=demo_connection)             # reads the schema afresh
    got = api.adhoc(secret, body)
    assert got.status == 200 and got.json == [{"email": None}], got       # the child's mask applies
    assert "vip.secret" not in got.text


def test_reserved_arguments_come_from_the_query_string_too(api, demo_connection):
    # The same reserved arguments as /q/<name>, from the query string or the body (the body
    # wins); a stream of an ad-hoc read binds its values as checked literals as well.
    secret = api.key([], [demo_connection])
    body = {"sql": "SELECT id FROM customers WHERE country = :c ORDER BY id", "params": {"c": "FR"},
            "connection_name": demo_connection}
    headers = {"X-API-Key": secret}
    paged = api.request("POST", "/execute_sql", json_body=body, headers=headers,
                        params={"page_size": "2", "page": "2", "format": "csv"})
    assert paged.status == 200 and paged.headers["X-Page"] == "2", paged
    assert len(paged.text.splitlines()) == 3 and paged.text.splitlines()[0] == "id"
    overridden = api.request("POST", "/execute_sql", json_body=dict(body, page_size=3), headers=headers,
                             params={"page_size": "2"})
    assert len(overridden.json) == 3
    streamed = api.request("POST", "/execute_sql", json_body=body, headers=headers,
                           params={"stream": "true", "format": "ndjson"})
    assert streamed.status == 200 and streamed.headers["X-Stream"] == "true", streamed
    everything = api.adhoc(secret, dict(body, page_size=1000)).json
    assert [json.loads(line) for line in streamed.text.splitlines()] == everything
    ignored = api.request("POST", "/execute_sql", json_body=body, headers=headers, params={"version": "1"})
    assert ignored.status == 200    # `version` means nothing here: it is not one of this route's arguments


def test_the_key_is_charged_before_its_statement_is_analysed(api, demo_connection):
    """Reading and analysing a new ad-hoc text costs CPU the caller chooses (seconds for a
    100,000-character statement), so the key's rate limit is charged before it: a key at its
    limit gets 429 without its statements being read, refused ones count too."""
    secret = api.key([], [demo_connection], rate_limit="3/minute", allowed_tables=["public.customers"])
    refused = [api.adhoc(secret, {"sql": f"SELECT {i} AS n FROM orders", "connection_name": demo_connection})
               for i in range(3)]
    assert [r.json["code"] for r in refused] == ["table_not_allowed"] * 3, refused
    got = api.adhoc(secret, {"sql": "SELECT " + "+".join(["1"] * 20000) + " AS x",
                             "connection_name": demo_connection})
    assert got.status == 429 and got.json["code"] == "rate_limited", got
