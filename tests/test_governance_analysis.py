"""Save-time analysis (gateway.governance.analysis): statement kinds, tables, lineage,
whole-row references, functions, name resolution, and the fail-closed refusals. Pure: a
schema given as a dict, no database (the corpus test runs the same against PostgreSQL)."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import GatewayError
from gateway.governance import (DEFAULT_DENIED, Analysis, Grants, Schema, analyze, plan, qname,
                                split_qname)
from gateway.errors import CODES
from gateway.governance.codes import CODES as GOVERNANCE_CODES

SCHEMA = Schema({
    "public.customers": ("id", "name", "email", "country", "plan", "created_at"),
    "public.orders": ("id", "customer_id", "amount", "status", "ordered_at"),
    "public.notes": ("id", "body", "data"),
    "public.customer_contacts": ("id", "contact", "country"),
    "public.vip_customers": ("id", "name", "email", "country", "plan", "created_at"),
    'public."Secret"': ("Token", "id"),
    "public.pg_authid": ("rolname",),
    "private.secrets": ("id", "secret"),
    "private.customers": ("id", "email"),
    "pg_catalog.pg_authid": ("oid", "rolname", "rolpassword"),
    "pg_catalog.pg_class": ("oid", "relname"),
}, views=["public.customer_contacts"], parents={"public.vip_customers": ["public.customers"]},
    functions=["get_email"])


def refused(sql, code, schema=SCHEMA, **kw):
    with pytest.raises(GatewayError) as info:
        analyze(sql, schema, **kw)
    assert info.value.code == code, (info.value.code, info.value.message)
    assert info.value.status == 400
    return info.value


def sources(analysis, position=0):
    return {s.split(".", 1)[1] for s in analysis.columns[position].sources}


# --- kinds ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("sql, kind, op", [
    ("SELECT 1", "read", None),
    ("VALUES (1), (2)", "read", None),
    ("(SELECT id FROM customers) UNION (SELECT id FROM orders)", "read", None),
    ("WITH x AS (SELECT id FROM customers) SELECT * FROM x", "read", None),
    ("TABLE customers", "read", None),
    ("INSERT INTO notes (body) VALUES ($1)", "write", "insert"),
    ("UPDATE orders SET status = $1 WHERE id = $2", "write", "update"),
    ("DELETE FROM notes WHERE id = $1", "write", "delete"),
    ("MERGE INTO notes n USING customers c ON n.id = c.id WHEN MATCHED THEN DELETE", "write", "merge"),
    ("WITH x AS (SELECT id FROM customers) DELETE FROM orders WHERE customer_id IN (SELECT id FROM x)",
     "write", "delete"),
])
def test_kinds(sql, kind, op):
    analysis = analyze(sql, SCHEMA)
    assert (analysis.kind, analysis.write_op) == (kind, op)


@pytest.mark.parametrize("sql", [
    "CREATE TABLE x (a int)", "DROP TABLE customers", "COPY customers TO STDOUT", "SET search_path = private",
    "RESET ALL", "DO $$BEGIN END$$", "CALL p()", "BEGIN", "COMMIT", "ROLLBACK", "LOCK TABLE customers",
    "LISTEN x", "NOTIFY x", "EXPLAIN SELECT 1", "EXPLAIN ANALYZE DELETE FROM orders", "SHOW search_path",
    "DISCARD ALL", "TRUNCATE orders", "VACUUM", "ANALYZE customers", "SELECT email INTO t FROM customers",
    "SELECT * FROM customers FOR UPDATE", "SELECT * FROM customers FOR SHARE",
    "WITH d AS (DELETE FROM orders RETURNING *) SELECT * FROM d",
    "WITH u AS (UPDATE notes SET body = 'x' RETURNING id) SELECT 1",
    "WITH d AS (DELETE FROM orders RETURNING id) INSERT INTO notes (id) SELECT id FROM d",
    "SELECT (SELECT 1 FROM customers FOR UPDATE)",
])
def test_refused_statement_kinds(sql):
    refused(sql, "sql_not_allowed")


@pytest.mark.parametrize("sql", ["SELECT 1; SELECT 2", "SELECT 1;DROP TABLE customers", "SELECT 1; ;SELECT 2",
                                 "SELECT $$;$$; SELECT 1", "SELECT 1 /* ; */ ; SELECT 2"])
def test_more_than_one_statement(sql):
    refused(sql, "multiple_statements")


@pytest.mark.parametrize("sql", ["SELECT 1;", "SELECT 1 ; -- trailing", "SELECT ';' AS s", "SELECT 1 /* ; */",
                                 "SELECT $a$;$a$ AS s", 'SELECT 1 AS ";"'])
def test_one_statement(sql):
    assert analyze(sql, SCHEMA).kind == "read"


# --- tables ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("sql, tables", [
    ("SELECT * FROM customers", {"public.customers"}),
    ('SELECT * FROM "customers"', {"public.customers"}),
    ("SELECT * FROM PUBLIC.Customers", {"public.customers"}),
    ('SELECT * FROM "Secret"', {'public.Secret'}),
    ("SELECT * FROM private.secrets", {"private.secrets"}),
    ("SELECT * FROM pg_authid", {"pg_catalog.pg_authid"}),
    ("SELECT * FROM public.pg_authid", {"public.pg_authid"}),
    ("SELECT * FROM orders WHERE customer_id IN (SELECT id FROM customers)", {"public.orders", "public.customers"}),
    ("SELECT (SELECT max(secret) FROM private.secrets)", {"private.secrets"}),
    ("WITH customers AS (SELECT 1 AS id) SELECT * FROM customers", set()),
    ("WITH customers AS (SELECT * FROM customers) SELECT * FROM customers", {"public.customers"}),
    ("WITH x AS (SELECT 1 AS id) SELECT * FROM public.x JOIN orders USING (id)", None),  # public.x unknown
    ("SELECT * FROM unnest(ARRAY(SELECT secret FROM private.secrets))", {"private.secrets"}),
    ("SELECT * FROM generate_series(1, 3)", set()),
    ("INSERT INTO notes (body) SELECT name FROM customers", {"public.notes", "public.customers"}),
    ("UPDATE orders o SET status = 'x' FROM customers c WHERE c.id = o.customer_id",
     {"public.orders", "public.customers"}),
    ("DELETE FROM orders USING private.secrets s WHERE s.id = orders.id", {"public.orders", "private.secrets"}),
    ("SELECT id FROM customers UNION SELECT id FROM private.customers", {"public.customers", "private.customers"}),
    ("SELECT * FROM customer_contacts", {"public.customer_contacts"}),
    ("SELECT 1 WHERE EXISTS (SELECT 1 FROM private.secrets)", {"private.secrets"}),
    ("SELECT * FROM customers c, LATERAL (SELECT * FROM orders o WHERE o.customer_id = c.id) x",
     {"public.customers", "public.orders"}),
])
def test_tables(sql, tables):
    if tables is None:
        refused(sql, "unknown_table")
        return
    assert set(analyze(sql, SCHEMA).tables) == tables


def test_search_path_and_implicit_pg_catalog():
    assert analyze("SELECT * FROM customers", SCHEMA, ("private", "public")).tables == ("private.customers",)
    assert analyze("SELECT * FROM orders", SCHEMA, ("private", "public")).tables == ("public.orders",)
    # pg_catalog is searched first unless the path names it
    assert analyze("SELECT * FROM pg_authid", SCHEMA).tables == ("pg_catalog.pg_authid",)
    assert analyze("SELECT * FROM pg_authid", SCHEMA, ("public", "pg_catalog")).tables == ("public.pg_authid",)
    refused("SELECT * FROM secrets", "unknown_table")


@pytest.mark.parametrize("sql, code", [
    ("SELECT * FROM nosuch", "unknown_table"),
    ("SELECT * FROM private.nosuch", "unknown_table"),
    ('SELECT * FROM "Customers"', "unknown_table"),
    ("SELECT * FROM secret", "unknown_table"),
    ("SELECT nosuch FROM customers", "unknown_column"),
    ("SELECT c.nosuch FROM customers c", "unknown_column"),
    ("SELECT x.email FROM customers c", "unknown_column"),
    ("SELECT customers.email FROM customers c", "unknown_column"),
    ('SELECT "EMAIL" FROM customers', "unknown_column"),
    ("SELECT id FROM customers c JOIN orders o ON true", "analysis_failed"),  # ambiguous
    ("SELECT * FROM demo.public.customers", "analysis_failed"),
    ("SELECT x FROM my_function() f", "analysis_failed"),
    ("SELECT * FROM my_function()", "analysis_failed"),
    ("SELECT 1 UNION SELECT 1, 2", "analysis_failed"),
    ("SELECT '\\' AS s", "analysis_failed"),
    ("SELECT U&'\\0041' AS s", "analysis_failed"),
    ('SELECT U&"\\0061" FROM customers', "analysis_failed"),
    ("SELECT 1 /* unterminated", "analysis_failed"),
    ("SELECT 'unterminated", "analysis_failed"),
    ("SELECT $a$ unterminated", "analysis_failed"),
    ("SELECT * FROM", "analysis_failed"),
    ("", "analysis_failed"),
    ("SELECT 1\x00", "analysis_failed"),
    ("WITH RECURSIVE a AS (SELECT * FROM b), b AS (SELECT email FROM customers) SELECT * FROM a",
     "analysis_failed"),
    ("SELECT " + "(" * 3000 + "1" + ")" * 3000, "analysis_failed"),
])
def test_fails_closed(sql, code):
    refused(sql, code)


# --- lineage --------------------------------------------------------------------------------------
@pytest.mark.parametrize("sql, expected", [
    ("SELECT email AS e FROM customers", {"customers.email"}),
    ("SELECT c.email || c.name AS e FROM customers c", {"customers.email", "customers.name"}),
    ("SELECT CASE WHEN email LIKE 'a%' THEN 'x' END AS e FROM customers", {"customers.email"}),
    ("SELECT upper(email)::varchar AS e FROM customers", {"customers.email"}),
    ("SELECT string_agg(email, ',') FROM customers", {"customers.email"}),
    ("SELECT count(*) FROM customers", set()),
    ("SELECT count(email) FROM customers", {"customers.email"}),
    ("SELECT rank() OVER (PARTITION BY email ORDER BY id) FROM customers", {"customers.email", "customers.id"}),
    ("SELECT (SELECT email FROM customers c2 WHERE c2.id = o.customer_id) FROM orders o", {"customers.email"}),
    ("SELECT x FROM (SELECT email AS x FROM customers) s", {"customers.email"}),
    ("SELECT x FROM (SELECT email FROM customers) s(x)", {"customers.email"}),
    ("WITH s(x) AS (SELECT email FROM customers) SELECT x FROM s", {"customers.email"}),
    ("SELECT e FROM customers AS c(i, n, e)", {"customers.email"}),
    ("SELECT status FROM orders UNION SELECT email FROM customers", {"orders.status", "customers.email"}),
    ("SELECT u FROM customers c, LATERAL unnest(ARRAY[c.email]) u", {"customers.email"}),
    ("SELECT x FROM customers c, LATERAL (SELECT c.email AS x) l", {"customers.email"}),
    ("SELECT email FROM vip_customers", {"vip_customers.email", "customers.email"}),
    ("SELECT contact FROM customer_contacts", {"customer_contacts.contact"}),
    ('SELECT "Token" FROM "Secret"', {"Secret.Token"}),
    ("SELECT 'x' AS e", set()),
    ("SELECT $1::text AS e", set()),
    ("WITH RECURSIVE r(x, n) AS (SELECT 'a'::text, 0 UNION ALL SELECT (SELECT email FROM customers LIMIT 1), n + 1 "
     "FROM r WHERE n < 2) SELECT x FROM r", {"customers.email"}),
    ("INSERT INTO notes (body) VALUES ('x') RETURNING body", {"notes.body"}),
    ("UPDATE notes SET body = (SELECT email FROM customers LIMIT 1) RETURNING body",
     {"notes.body", "customers.email"}),
])
def test_lineage(sql, expected):
    assert sources(analyze(sql, SCHEMA)) == expected


def test_star_expansion_order_and_using_joins():
    analysis = analyze("SELECT * FROM customers JOIN orders USING (id)", SCHEMA)
    names = [c.name for c in analysis.columns]
    assert names == ["id", "name", "email", "country", "plan", "created_at", "customer_id", "amount", "status",
                     "ordered_at"]
    assert analysis.columns[0].sources == {"public.customers.id", "public.orders.id"}
    natural = analyze("SELECT * FROM customers NATURAL JOIN orders", SCHEMA)
    assert [c.name for c in natural.columns] == names
    plain = analyze("SELECT *, c.* FROM customers c, orders o", SCHEMA)
    assert len(plain.columns) == 6 + 5 + 6
    assert plain.columns[13].sources == {"public.customers.email"}


def test_whole_row_references():
    for sql in ("SELECT row_to_json(c) FROM customers c", "SELECT to_jsonb(c.*) FROM customers c",
                "SELECT json_agg(c) FROM customers c", "SELECT c FROM customers c", "SELECT customers FROM customers",
                "SELECT hstore(c) FROM customers c", "SELECT (c).email FROM customers c",
                "SELECT format('%s', c) FROM customers c"):
        analysis = analyze(sql, SCHEMA)
        assert analysis.whole_row == ("public.customers",), sql
        assert analysis.columns[0].whole_row == {"public.customers"}, sql
        assert "public.customers.email" in analysis.columns[0].sources, sql
    derived = analyze("SELECT row_to_json(s) FROM (SELECT id FROM customers) s", SCHEMA)
    assert derived.columns[0].sources == {"public.customers.id"}


def test_functions_and_denied_list():
    analysis = analyze("SELECT upper(name), pg_catalog.lower(name), count(*) FROM customers", SCHEMA)
    assert {"upper", "count"} <= set(analysis.functions)
    for sql in ("SELECT pg_read_file('x')", "SELECT pg_catalog.pg_read_file('x')", 'SELECT "pg_read_file"(\'x\')',
                "SELECT PG_SLEEP(1)", "SELECT * FROM pg_ls_dir('.')", "SELECT dblink_exec('x', 'y')",
                "SELECT 1 FROM customers WHERE pg_sleep(1) IS NULL", "SELECT lo_import('/etc/passwd')",
                "SELECT query_to_xml('select 1', true, true, '')", "SELECT pg_advisory_xact_lock(1)"):
        refused(sql, "function_not_allowed")
    assert analyze("SELECT current_setting('search_path')", SCHEMA).kind == "read"
    assert analyze("SELECT 'pg_read_file(1)' AS s, $x$pg_sleep(1)$x$ AS t", SCHEMA).kind == "read"
    # configurable
    assert analyze("SELECT pg_sleep(0)", SCHEMA, denied_functions={"pg_read_file"}).kind == "read"
    refused("SELECT upper('x')", "function_not_allowed", denied_functions=DEFAULT_DENIED | {"upper"})


def test_user_functions_are_flagged():
    assert analyze("SELECT get_email(1)", SCHEMA).user_functions == ("get_email",)
    assert analyze("SELECT upper('x')", SCHEMA).user_functions == ()


def test_round_trip_and_json():
    analysis = analyze("SELECT c.email, row_to_json(c) FROM customers c WHERE id = $1", SCHEMA)
    doc = json.loads(json.dumps(analysis.to_doc()))
    assert Analysis.from_doc(doc) == analysis
    with pytest.raises(ValueError):
        Analysis.from_doc(dict(doc, version=0))


def test_quoted_names_round_trip():
    assert qname("public", "odd.name", 'q"uote') == 'public."odd.name"."q""uote"'
    assert split_qname('public."odd.name"."q""uote"') == ("public", "odd.name", 'q"uote')
    schema = Schema({'public."odd.name"': ("a.b",)})
    analysis = analyze('SELECT "a.b" FROM "odd.name"', schema)
    assert analysis.tables == ('public."odd.name"',)
    assert analysis.columns[0].sources == {'public."odd.name"."a.b"'}


def test_identifier_folding_is_postgres_folding():
    schema = Schema({"public.ÉtÉ": ("x",), "public.été": ("x",)})
    # PostgreSQL folds ASCII letters only: unquoted ÉTÉ is ÉtÉ, never été
    assert analyze("SELECT x FROM ÉTÉ", schema).tables == ("public.ÉtÉ",)
    long = "t" * 70
    assert analyze(f"SELECT * FROM {long}", Schema({f"public.{'t' * 63}": ("x",)})).tables == (f"public.{'t' * 63}",)


def test_codes_are_documented():
    for code, (status, meaning) in GOVERNANCE_CODES.items():
        assert status in (400, 403) and meaning
        assert code not in CODES or CODES[code][0] == status


# --- property: whatever is wrapped around a masked column stays masked ----------------------------------
_WRAPS = [
    "({})", "{}::text", "CAST({} AS varchar)", "upper({})", "lower({})", "{} || ''", "'' || {}",
    "concat({}, 'a')", "coalesce({}, 'z')", "CASE WHEN c.id > 0 THEN {} ELSE 'n' END",
    "CASE WHEN {} IS NULL THEN 'a' ELSE 'b' END", "format('%s', {})", "substr({}, 1)", "nullif({}, '')",
    "max({})", "string_agg({}, ',')", "(SELECT {})", "array_to_string(ARRAY[{}], ',')",
    "first_value({}) OVER (ORDER BY c.id)", "md5({})", "replace({}, '@', '')", "json_build_array({})",
    "(ARRAY[{}])[1]", "left({}, 3)", "({} COLLATE \"C\")",
]
_QUERIES = [
    "SELECT {} FROM customers c",
    "SELECT v FROM (SELECT {} AS v FROM customers c) s",
    "WITH s AS (SELECT {} AS v FROM customers c) SELECT v FROM s",
    "SELECT v FROM (SELECT {} FROM customers c) AS s(v)",
    "SELECT status FROM orders UNION ALL SELECT {} FROM customers c",
    "SELECT l.v FROM customers c, LATERAL (SELECT {} AS v) l",
    "SELECT (SELECT {} FROM customers c LIMIT 1) AS v",
    "SELECT o.id, x.v FROM orders o "
    "JOIN LATERAL (SELECT {} AS v FROM customers c WHERE c.id = o.customer_id) x ON true",
]
_GRANTS = Grants.from_doc({"mask": [{"column": "customers.email", "action": "null"}]})


def _expression(column, wraps):
    expr = column
    for wrap in wraps:
        expr = _WRAPS[wrap].format(expr)
    return expr


@settings(max_examples=300, deadline=None)
@given(wraps=st.lists(st.integers(0, len(_WRAPS) - 1), min_size=1, max_size=4),
       query=st.integers(0, len(_QUERIES) - 1))
def test_masked_column_stays_masked_whatever_wraps_it(wraps, query):
    sql = _QUERIES[query].format(_expression("c.email", wraps))
    position = 1 if query == 7 else 0
    assert plan(analyze(sql, SCHEMA), _GRANTS).actions[position] == "null", sql
    # the control: the same shape around an unmasked column is not masked
    control = _QUERIES[query].format(_expression("c.name", wraps))
    assert plan(analyze(control, SCHEMA), _GRANTS).actions[position] is None, control
