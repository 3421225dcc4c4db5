"""The one reader of SQL (gateway.sql, on PostgreSQL's parser): placeholders, what is left
alone, and what is refused at save time."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from gateway.errors import GatewayError
from gateway.sql import read
from helpers.util import unique


def prepared(sql: str, *names: str):
    return read(sql, frozenset(names))


def refused(sql: str, *names: str, code: str = "invalid_sql") -> str:
    with pytest.raises(GatewayError) as info:
        prepared(sql, *names)
    assert (info.value.status, info.value.code) == (400, code)
    return info.value.message


def test_placeholders_become_positional_in_first_use_order():
    text = prepared("SELECT * FROM t WHERE b = :b AND a = :a OR b2 = :b", "a", "b")
    assert text.text == "SELECT * FROM t WHERE b = $1 AND a = $2 OR b2 = $1"
    assert text.order == ("b", "a")
    assert text.kind == "read"


@pytest.mark.parametrize("sql", [
    "SELECT ':x' AS a",
    "SELECT 'it''s :x' AS a",
    "SELECT E'\\' :x' AS a",
    "SELECT 'a\\' AS a",                     # standard strings: the backslash is a character
    'SELECT 1 AS ":x"',
    "SELECT $$ :x $$ AS a",
    "SELECT $tag$ :x ' $tag$ AS a",
    "SELECT 1 AS a -- :x",
    "SELECT 1 AS a /* :x */",
    "SELECT 1 AS a /* outer /* :x */ still comment :y */",
    "SELECT '1'::int AS a",
    "SELECT now()::date AS a",
    "SELECT (ARRAY[1,2,3])[1:2] AS a",
])
def test_text_that_only_looks_like_a_placeholder_is_left_alone(sql):
    text = prepared(sql)  # nothing declared: any placeholder found would be refused
    assert text.order == ()
    # The statement ends at its last token: a trailing comment is not part of it.
    assert text.text == ("SELECT 1 AS a" if sql.startswith("SELECT 1 AS a ") else sql)


def test_cast_after_a_placeholder():
    text = prepared("SELECT :n::text AS t", "n")
    assert text.text == "SELECT $1::text AS t"
    assert text.order == ("n",)


def test_percent_is_left_as_it_is():
    text = prepared("SELECT name FROM customers WHERE name LIKE 'Ada%' AND id < :n", "n")
    assert text.text == "SELECT name FROM customers WHERE name LIKE 'Ada%' AND id < $1"


def test_trailing_semicolon_is_fine():
    assert prepared("SELECT 1 AS a;\n").text == "SELECT 1 AS a"
    assert prepared("SELECT ';' AS a").order == ()


@pytest.mark.parametrize("sql", [
    "SELECT 1; SELECT 2",
    "SELECT 1; DROP TABLE orders",
    "SELECT 1;DELETE FROM orders;",
])
def test_stacked_statements_are_refused(sql):
    assert "one statement" in refused(sql, code="multiple_statements")


def test_undeclared_placeholder_is_refused():
    assert ":missing" in refused("SELECT :declared, :missing", "declared")


@pytest.mark.parametrize("sql", [
    "DROP TABLE orders",
    "CREATE TABLE t (a int)",
    "ALTER TABLE orders ADD COLUMN x int",
    "TRUNCATE orders",
    "GRANT SELECT ON orders TO public",
    "SET statement_timeout = 0",
    "COPY orders TO STDOUT",
    "DO $$ BEGIN END $$",
    "CALL some_procedure()",
    "EXPLAIN ANALYZE SELECT 1",
    "LOCK TABLE orders",
])
def test_statements_other_than_reads_and_writes_are_refused(sql):
    refused(sql, code="sql_not_allowed")


@pytest.mark.parametrize("sql", [
    "WITH gone AS (DELETE FROM orders RETURNING *) SELECT * FROM gone",
    "WITH moved AS (UPDATE orders SET status = 'x' RETURNING id) SELECT id FROM moved",
    "SELECT * INTO orders_copy FROM orders",
    # row locks: they block other sessions' writes (and a read-only transaction refuses them)
    "SELECT * FROM orders FOR UPDATE",
    "SELECT * FROM orders FOR NO KEY UPDATE OF orders NOWAIT",
    "SELECT * FROM orders FOR KEY SHARE SKIP LOCKED",
    "SELECT * FROM (SELECT * FROM orders FOR SHARE) s",
    "WITH l AS (SELECT id FROM orders FOR UPDATE) SELECT * FROM l",
    "SELECT id FROM orders WHERE id IN (SELECT id FROM orders FOR UPDATE)",
    "(SELECT * FROM orders) FOR UPDATE",
    "INSERT INTO notes (body) SELECT status FROM orders FOR UPDATE",
])
def test_reads_that_write_are_refused(sql):
    refused(sql, code="sql_not_allowed")


def test_writes_are_classified():
    assert prepared("INSERT INTO t (a) VALUES (:a)", "a").kind == "write"
    assert prepared("UPDATE t SET a = 1").kind == "write"
    assert prepared("DELETE FROM t WHERE a = :a", "a").kind == "write"


@pytest.mark.parametrize("sql, code", [
    ("", "invalid_body"), ("   ", "invalid_body"), (None, "invalid_body"), (5, "invalid_body"),
    ("SELECT 'unterminated", "invalid_sql"), ("SELECT $$ unterminated", "invalid_sql"),
    ("SELECT 1 /* unterminated", "invalid_sql"), ("SELECT 1\x00", "invalid_sql"),
    ("SELEC 1 FROM", "invalid_sql"), ("SELECT " + "1" * 100_001, "invalid_sql"),
])
def test_malformed_sql(sql, code):
    with pytest.raises(GatewayError) as info:
        read(sql, frozenset())
    assert info.value.code == code


_LITERAL_CHARS = st.characters(codec="utf-8", exclude_characters="\x00")


@hsettings(max_examples=100, deadline=None)
@given(st.text(_LITERAL_CHARS, max_size=40))
def test_nothing_inside_a_string_literal_is_a_placeholder(content):
    sql = "SELECT '" + content.replace("'", "''") + "' AS a"
    text = prepared(sql)
    assert text.order == () and text.text == sql and text.kind == "read"


@hsettings(max_examples=100, deadline=None)
@given(st.text(_LITERAL_CHARS, max_size=40).filter(lambda s: "$q$" not in s))
def test_nothing_inside_dollar_quotes_is_a_placeholder(content):
    sql = "SELECT $q$" + content + "$q$ AS a"
    assert prepared(sql).order == ()


# --- through the Management API and the data plane ------------------------------------------
@pytest.mark.parametrize("sql, code", [
    ("SELECT 1; SELECT 2", "multiple_statements"),
    ("SELECT :undeclared", "invalid_sql"),
    ("DROP TABLE orders", "sql_not_allowed"),
    ("WITH gone AS (DELETE FROM orders RETURNING *) SELECT * FROM gone", "sql_not_allowed"),
])
def test_refused_at_save_time_over_http(api, demo_connection, sql, code):
    name = unique("refused")
    got = api.manage("POST", "/queries", {"name": name, "connection_name": demo_connection,
                                          "sql": sql, "publish": True})
    assert got.status == 400 and got.json["code"] == code, got
    assert api.manage("GET", f"/queries/{name}").status == 404


def test_percent_and_quotes_work_end_to_end(api, endpoint):
    ep = endpoint("SELECT name, ':n' AS literal, 'x::y' AS cast_like, :n::text AS n_text FROM customers "
                  "WHERE name LIKE 'Ada%' AND id <= :n /* :n */ ORDER BY id -- :n",
                  {"n": {"type": "int", "default": 100}})
    got = api.call(ep.query, ep.secret, {"n": "100", "page_size": "1000"})
    assert got.status == 200, got
    rows = got.json
    assert rows and all(r["name"].startswith("Ada ") for r in rows)
    assert {(r["literal"], r["cast_like"], r["n_text"]) for r in rows} == {(":n", "x::y", "100")}
    # The cursor form (streaming) binds literals at the parser's parameter positions.
    streamed = api.call(ep.query, ep.secret, {"n": "100", "stream": "true", "format": "ndjson"})
    assert streamed.status == 200, streamed
    assert [line for line in streamed.text.splitlines()] == \
        [api_line for api_line in api.call(ep.query, ep.secret, {"n": "100", "format": "ndjson",
                                                                 "page_size": "1000"}).text.splitlines()]
