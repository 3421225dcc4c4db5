"""Save-time analysis (gateway.governance.analysis): statement kinds, tables, lineage,
whole-row references, functions, name resolution, and the fail-closed refusals. Pure: a
schema given as a dict, no database (the corpus test runs the same against PostgreSQL)."""
from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import CODES, GatewayError
from gateway.governance import DEFAULT_DENIED, Analysis, Grants, Schema, analyze, plan, qname, split_qname
from gateway.governance.codes import CODES as GOVERNANCE_CODES
from gateway.sql import Statement, read, read_positional
from gateway.sql.reader import words_of

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
    # (pg_catalog.pg_authid is lifted here: how names resolve, not whether catalogs may be read)
    assert set(analyze(sql, SCHEMA, allowed_catalog_relations=("pg_catalog.pg_authid",)).tables) == tables


def test_search_path_and_implicit_pg_catalog():
    assert analyze("SELECT * FROM customers", SCHEMA, ("private", "public")).tables == ("private.customers",)
    assert analyze("SELECT * FROM orders", SCHEMA, ("private", "public")).tables == ("public.orders",)
    # pg_catalog is searched first unless the path names it (and a catalog is refused unless lifted)
    refused("SELECT * FROM pg_authid", "catalog_not_allowed")
    lifted = ("pg_catalog.pg_authid",)
    assert analyze("SELECT * FROM pg_authid", SCHEMA, allowed_catalog_relations=lifted).tables == \
        ("pg_catalog.pg_authid",)
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


def test_a_backslash_in_a_plain_string_is_a_character():
    # Data sessions pin standard_conforming_strings on, as PostgreSQL's own parser reads the
    # text here: the backslash cannot end the string, so what follows stays in it.
    assert analyze("SELECT '\\' AS s", SCHEMA).kind == "read"
    assert analyze("SELECT '\\' || 'x' AS s", SCHEMA).columns[0].name == "s"


# --- lineage --------------------------------------------------------------------------------------
# vip_customers inherits from customers: reading customers reads its rows too, so its columns
# are sources as well (a mask naming the child covers them).
@pytest.mark.parametrize("sql, expected", [
    ("SELECT email AS e FROM customers", {"customers.email", "vip_customers.email"}),
    ("SELECT c.email || c.name AS e FROM customers c",
     {"customers.email", "vip_customers.email", "customers.name", "vip_customers.name"}),
    ("SELECT CASE WHEN email LIKE 'a%' THEN 'x' END AS e FROM customers", {"customers.email", "vip_customers.email"}),
    ("SELECT upper(email)::varchar AS e FROM customers", {"customers.email", "vip_customers.email"}),
    ("SELECT string_agg(email, ',') FROM customers", {"customers.email", "vip_customers.email"}),
    ("SELECT count(*) FROM customers", set()),
    ("SELECT count(email) FROM customers", {"customers.email", "vip_customers.email"}),
    ("SELECT rank() OVER (PARTITION BY email ORDER BY id) FROM customers",
     {"customers.email", "vip_customers.email", "customers.id", "vip_customers.id"}),
    ("SELECT (SELECT email FROM customers c2 WHERE c2.id = o.customer_id) FROM orders o", {"customers.email", "vip_customers.email"}),
    ("SELECT x FROM (SELECT email AS x FROM customers) s", {"customers.email", "vip_customers.email"}),
    ("SELECT x FROM (SELECT email FROM customers) s(x)", {"customers.email", "vip_customers.email"}),
    ("WITH s(x) AS (SELECT email FROM customers) SELECT x FROM s", {"customers.email", "vip_customers.email"}),
    ("SELECT e FROM customers AS c(i, n, e)", {"customers.email", "vip_customers.email"}),
    ("SELECT status FROM orders UNION SELECT email FROM customers",
     {"orders.status", "customers.email", "vip_customers.email"}),
    ("SELECT u FROM customers c, LATERAL unnest(ARRAY[c.email]) u", {"customers.email", "vip_customers.email"}),
    ("SELECT x FROM customers c, LATERAL (SELECT c.email AS x) l", {"customers.email", "vip_customers.email"}),
    ("SELECT email FROM vip_customers", {"vip_customers.email", "customers.email"}),
    ("SELECT contact FROM customer_contacts", {"customer_contacts.contact"}),
    ('SELECT "Token" FROM "Secret"', {"Secret.Token"}),
    ("SELECT 'x' AS e", set()),
    ("SELECT $1::text AS e", set()),
    ("WITH RECURSIVE r(x, n) AS (SELECT 'a'::text, 0 UNION ALL SELECT (SELECT email FROM customers LIMIT 1), n + 1 "
     "FROM r WHERE n < 2) SELECT x FROM r", {"customers.email", "vip_customers.email"}),
    ("INSERT INTO notes (body) VALUES ('x') RETURNING body", {"notes.body"}),
    ("UPDATE notes SET body = (SELECT email FROM customers LIMIT 1) RETURNING body",
     {"notes.body", "customers.email", "vip_customers.email"}),
])
def test_lineage(sql, expected):
    assert sources(analyze(sql, SCHEMA)) == expected


def test_star_expansion_order_and_using_joins():
    analysis = analyze("SELECT * FROM customers JOIN orders USING (id)", SCHEMA)
    names = [c.name for c in analysis.columns]
    assert names == ["id", "name", "email", "country", "plan", "created_at", "customer_id", "amount", "status",
                     "ordered_at"]
    assert analysis.columns[0].sources == {"public.customers.id", "public.vip_customers.id", "public.orders.id"}
    natural = analyze("SELECT * FROM customers NATURAL JOIN orders", SCHEMA)
    assert [c.name for c in natural.columns] == names
    plain = analyze("SELECT *, c.* FROM customers c, orders o", SCHEMA)
    assert len(plain.columns) == 6 + 5 + 6
    assert plain.columns[13].sources == {"public.customers.email", "public.vip_customers.email"}


def test_whole_row_references():
    for sql in ("SELECT row_to_json(c) FROM customers c", "SELECT to_jsonb(c.*) FROM customers c",
                "SELECT json_agg(c) FROM customers c", "SELECT c FROM customers c", "SELECT customers FROM customers",
                "SELECT hstore(c) FROM customers c", "SELECT (c).email FROM customers c",
                "SELECT format('%s', c) FROM customers c"):
        analysis = analyze(sql, SCHEMA)
        assert analysis.whole_row == ("public.customers", "public.vip_customers"), sql
        assert analysis.columns[0].whole_row == {"public.customers", "public.vip_customers"}, sql
        assert "public.customers.email" in analysis.columns[0].sources, sql
    derived = analyze("SELECT row_to_json(s) FROM (SELECT id FROM customers) s", SCHEMA)
    assert derived.columns[0].sources == {"public.customers.id", "public.vip_customers.id"}


def test_functions_and_denied_list():
    analysis = analyze("SELECT upper(name), pg_catalog.lower(name), count(*) FROM customers", SCHEMA)
    assert {"upper", "count"} <= set(analysis.functions)
    for sql in ("SELECT pg_read_file('x')", "SELECT pg_catalog.pg_read_file('x')", 'SELECT "pg_read_file"(\'x\')',
                "SELECT PG_SLEEP(1)", "SELECT * FROM pg_ls_dir('.')", "SELECT dblink_exec('x', 'y')",
                "SELECT 1 FROM customers WHERE pg_sleep(1) IS NULL", "SELECT lo_import('/etc/passwd')",
                "SELECT query_to_xml('select 1', true, true, '')", "SELECT pg_advisory_xact_lock(1)"):
        refused(sql, "function_not_allowed")
    # current_setting reads pg_settings' rows (refused as a relation), custom secrets included
    refused("SELECT current_setting('search_path')", "function_not_allowed")
    assert analyze("SELECT current_setting('search_path')", SCHEMA,
                   allowed_functions=("current_setting",)).kind == "read"
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


# --- direct or derived: what a hash or a partial mask may be applied to -------------------------------
DIRECT = [
    "SELECT email FROM customers",
    "SELECT email AS e FROM customers",
    "SELECT (email) AS e FROM customers",
    "SELECT c.email FROM customers c",
    "SELECT * FROM customers",
    "SELECT c.* FROM customers c",
    "SELECT e FROM customers AS c(i, n, e)",
    "SELECT x FROM (SELECT email AS x FROM customers) s",
    "SELECT * FROM (SELECT email FROM customers) s",
    "SELECT x FROM (SELECT email FROM customers) s(x)",
    "WITH s(x) AS (SELECT email FROM customers) SELECT x FROM s",
    "WITH s AS (SELECT email FROM customers), t AS (SELECT email AS e FROM s) SELECT e FROM t",
    "SELECT email FROM customers UNION SELECT name FROM customers",
    "SELECT email FROM customers UNION ALL SELECT email FROM vip_customers",
    "(SELECT email FROM customers) EXCEPT (SELECT email FROM vip_customers)",
    "SELECT x FROM customers c, LATERAL (SELECT c.email AS x) l",
    "SELECT e FROM customers c, LATERAL (VALUES (c.email)) v(e)",
    "SELECT DISTINCT email FROM customers",
    "SELECT email FROM customers GROUP BY email ORDER BY email",
    "SELECT email FROM customers c JOIN orders o ON o.customer_id = c.id WHERE substr(email, 1, 1) = 'a'",
    "WITH RECURSIVE r(x, n) AS (SELECT email, 0 FROM customers UNION ALL SELECT x, n + 1 FROM r WHERE n < 2) "
    "SELECT x FROM r",
]

DERIVED = [
    "SELECT substr(email, 2, 1) FROM customers",
    "SELECT substring(email FROM 2 FOR 1) AS e FROM customers",
    "SELECT 'xxxx' || substr(email, 5, 4) AS e FROM customers",
    "SELECT email || '' AS e FROM customers",
    "SELECT left(email, 3) AS e FROM customers",
    "SELECT CASE WHEN email LIKE 'a%' THEN 'a' ELSE 'b' END AS e FROM customers",
    "SELECT email::text AS e FROM customers",
    "SELECT CAST(email AS varchar(200)) FROM customers",
    "SELECT (email)::bytea AS e FROM customers",
    "SELECT email COLLATE \"C\" AS e FROM customers",
    "SELECT max(email) AS e FROM customers",
    "SELECT min(email) FROM customers",
    "SELECT string_agg(email, ',') AS e FROM customers",
    "SELECT array_agg(email) AS e FROM customers",
    "SELECT (array_agg(email))[1] AS e FROM customers",
    "SELECT json_build_object('e', email) AS e FROM customers",
    "SELECT to_jsonb(email) AS e FROM customers",
    "SELECT ARRAY[email] AS e FROM customers",
    "SELECT ROW(email) AS e FROM customers",
    "SELECT lag(email) OVER (ORDER BY id) AS e FROM customers",
    "SELECT first_value(email) OVER (PARTITION BY country) AS e FROM customers",
    "SELECT coalesce(email, 'x') AS e FROM customers",
    "SELECT nullif(email, '') AS e FROM customers",
    "SELECT md5(email) AS e FROM customers",
    "SELECT length(email) AS e FROM customers",
    "SELECT (SELECT substr(email, 1, 1) FROM customers c2 WHERE c2.id = o.customer_id) AS e FROM orders o",
    "SELECT (SELECT email FROM customers c2 WHERE c2.id = o.customer_id) AS e FROM orders o",
    "SELECT x FROM (SELECT substr(email, 1, 1) AS x FROM customers) s",
    "WITH s AS (SELECT upper(email) AS x FROM customers) SELECT x FROM s",
    "SELECT * FROM (SELECT left(email, 2) FROM customers) s",
    "SELECT email FROM customers UNION ALL SELECT substr(email, 1, 1) FROM customers",
    "SELECT substr(email, 1, 1) FROM customers UNION ALL SELECT email FROM customers",
    "SELECT u FROM customers c, LATERAL unnest(ARRAY[c.email]) u",
    "SELECT v.e FROM customers c, LATERAL (VALUES (substr(c.email, 1, 1))) v(e)",
    "SELECT c FROM customers c",
    "UPDATE notes SET body = (SELECT email FROM customers LIMIT 1) RETURNING body",
    "SELECT email FROM customers UNION ALL SELECT 'guess@example.com'",
    "SELECT email FROM customers UNION SELECT $1",
    "SELECT e FROM customers c, LATERAL (VALUES (c.email), ('guess@example.com')) v(e)",
    "SELECT * FROM customers c FULL JOIN (SELECT $1::text AS email) x USING (email)",
    "SELECT email FROM (SELECT email FROM customers UNION ALL SELECT NULL) s",
    "INSERT INTO customers (email) VALUES ($1) RETURNING email",
    "UPDATE customers SET email = $1 RETURNING email",
]


@pytest.mark.parametrize("sql", DIRECT)
def test_plain_columns_reach_the_output_directly(sql):
    analysis = analyze(sql, SCHEMA)
    email = [c for c in analysis.columns if "public.customers.email" in c.sources]
    assert email, analysis.columns
    for column in email:
        assert column.derived == frozenset(), (sql, column)


@pytest.mark.parametrize("sql", DERIVED)
def test_any_expression_of_a_column_is_derived(sql):
    analysis = analyze(sql, SCHEMA)
    column = analysis.columns[0]
    assert "public.customers.email" in column.sources
    assert "public.customers.email" in column.derived, (sql, column)
    assert column.derived <= column.sources


def test_derived_is_per_source():
    analysis = analyze("SELECT email, substr(name, 1, 1) AS n, email || name AS both FROM customers", SCHEMA)
    assert analysis.columns[0].derived == frozenset()
    assert analysis.columns[1].derived == {"public.customers.name", "public.vip_customers.name"}
    assert analysis.columns[2].derived == analysis.columns[2].sources
    # a set operation is direct only when every branch is a bare column: one computed branch
    # (or a literal, hashed alongside: a hashing oracle) makes every source derived
    union = analyze("SELECT email FROM customers UNION SELECT upper(status) FROM orders", SCHEMA)
    assert union.columns[0].derived == union.columns[0].sources
    # RETURNING: what an UPDATE sets is computed, what it leaves is stored as it was
    update = analyze("UPDATE customers SET name = $1 RETURNING name, email", SCHEMA)
    assert update.columns[0].derived == update.columns[0].sources and update.columns[1].derived == frozenset()
    assert analyze("DELETE FROM customers RETURNING email", SCHEMA).columns[0].derived == frozenset()


@pytest.mark.parametrize("sql, names, exact", [
    ("SELECT email, email AS e, (email), email::text, c.email FROM customers c",
     ["email", "e", "email", "email", "email"], [True] * 5),
    ("SELECT substr(email, 1, 1), upper(email), 1, count(*) FROM customers",
     None, [False] * 4),
    ("SELECT * FROM (SELECT substr(email, 1, 1), email FROM customers) s", None, [False, True]),
    ("SELECT * FROM (SELECT substr(email, 1, 1) FROM customers) s(x)", ["x"], [True]),
    ("SELECT * FROM customers JOIN orders USING (id)", None, [True] * 10),
    ("VALUES (1, 2)", ["column1", "column2"], [True, True]),
    ("SELECT g FROM generate_series(1, 2) g", ["g"], [True]),
])
def test_output_names_are_marked_when_they_are_postgres_names(sql, names, exact):
    analysis = analyze(sql, SCHEMA)
    if names is not None:
        assert [c.name for c in analysis.columns] == names
    assert [c.exact_name for c in analysis.columns] == exact


def test_version_2_round_trip_and_older_versions():
    analysis = analyze("SELECT email, substr(email, 1, 1) FROM customers", SCHEMA)
    doc = json.loads(json.dumps(analysis.to_doc()))
    assert doc["version"] == 2
    assert doc["columns"][1]["derived"] == ["public.customers.email", "public.vip_customers.email"]
    assert doc["columns"][1]["exact_name"] is False
    assert Analysis.from_doc(doc) == analysis
    # a version 1 document has no "derived": it is analysed again, never read as all-direct
    with pytest.raises(ValueError):
        Analysis.from_doc(dict(doc, version=1))


_HASH = Grants.from_doc({"mask": [{"column": "customers.email", "action": "hash"}]})


@settings(max_examples=300, deadline=None)
@given(wraps=st.lists(st.integers(0, len(_WRAPS) - 1), min_size=1, max_size=4),
       query=st.integers(0, len(_QUERIES) - 1))
def test_hash_of_anything_wrapped_around_a_masked_column_is_refused(wraps, query):
    sql = _QUERIES[query].format(_expression("c.email", wraps))
    position = 1 if query == 7 else 0
    # Parentheses alone pass the column through (a scalar subquery does not): hashed as it is.
    if all(_WRAPS[w] == "({})" for w in wraps) and not _QUERIES[query].startswith("SELECT (SELECT {}"):
        assert plan(analyze(sql, SCHEMA), _HASH, hash_key=b"k").actions[position] == "hash", sql
        return
    with pytest.raises(GatewayError) as info:
        plan(analyze(sql, SCHEMA), _HASH, hash_key=b"k")
    assert info.value.code == "mask_unresolvable", (sql, info.value.message)


INHERITANCE = Schema({
    "public.orders": ("id", "email", "total"),
    "public.orders_2024": ("id", "email", "total"),
    "public.orders_2024_q1": ("id", "email", "total"),
    "public.events": ("id", "email"),
    "public.events_archive": ("id", "email", "archived_at"),
    "public.other": ("id", "email"),
}, parents={"public.orders_2024": ["public.orders"],
            "public.orders_2024_q1": ["public.orders_2024", "public.orders"],
            "public.events_archive": ["public.events"]})


def test_reading_a_parent_reads_its_children():
    # partitions, two levels down: a parent's column names every descendant's
    assert analyze("SELECT email FROM orders", INHERITANCE).columns[0].sources == \
        {"public.orders.email", "public.orders_2024.email", "public.orders_2024_q1.email"}
    # a middle partition: its ancestors and its descendants, not its siblings
    assert analyze("SELECT email FROM orders_2024", INHERITANCE).columns[0].sources == \
        {"public.orders.email", "public.orders_2024.email", "public.orders_2024_q1.email"}
    # classic inheritance: a column only the child has is no source of the parent's
    events = analyze("SELECT * FROM events", INHERITANCE)
    assert [c.name for c in events.columns] == ["id", "email"]
    assert events.columns[1].sources == {"public.events.email", "public.events_archive.email"}
    assert events.tables == ("public.events",)
    assert analyze("SELECT email FROM other", INHERITANCE).columns[0].sources == {"public.other.email"}
    # a whole row of the parent holds whole rows of its children
    assert set(analyze("SELECT row_to_json(e) FROM events e", INHERITANCE).whole_row) == \
        {"public.events", "public.events_archive"}


# --- catalogs, side effects, write operations, operators ------------------------------------------
CATALOGS = Schema({
    "public.customers": ("id", "name", "email"),
    "public.notes": ("id", "body"),
    "public.pg_authid": ("rolname",),
    "pg_catalog.pg_authid": ("oid", "rolname", "rolpassword"),
    "pg_catalog.pg_class": ("oid", "relname"),
    "pg_catalog.pg_stats": ("tablename", "attname", "most_common_vals", "histogram_bounds"),
    "pg_catalog.pg_statistic": ("starelid", "stavalues1"),
    "pg_catalog.pg_stat_activity": ("pid", "query"),
    "pg_catalog.pg_settings": ("name", "setting"),
    "information_schema.columns": ("table_name", "column_name"),
}, functions=["leak_and", "get_email"],
    operators={"&&": ["leak_and"], "~~": ["leak_and"], "=": ["texteq"], "===": ["pg_read_file"],
               "<->": ["nextval"]})


@pytest.mark.parametrize("sql", [
    "SELECT * FROM pg_stats",
    "SELECT most_common_vals::text FROM pg_catalog.pg_stats WHERE tablename = 'customers'",
    "SELECT query FROM pg_stat_activity",
    "SELECT stavalues1::text FROM pg_statistic",
    "SELECT rolpassword FROM pg_authid",
    "SELECT * FROM pg_catalog.pg_class",
    "SELECT setting FROM pg_settings",
    "SELECT table_name FROM information_schema.columns",
    "SELECT id FROM customers WHERE email IN (SELECT query FROM pg_stat_activity)",
    "SELECT c.id FROM customers c JOIN pg_stats s ON s.attname = c.name",
    "WITH s AS (SELECT * FROM pg_stats) SELECT count(*) FROM s",
    "SELECT (SELECT max(relname) FROM pg_class)",
    "UPDATE notes SET body = c.relname FROM pg_class c WHERE c.oid = notes.id",
    "INSERT INTO notes (body) SELECT query FROM pg_stat_activity",
])
def test_catalog_relations_are_refused_for_everyone(sql):
    error = refused(sql, "catalog_not_allowed", CATALOGS)
    assert CODES["catalog_not_allowed"][0] == 400 and "catalog" in error.message


def test_named_catalog_relations_can_be_lifted():
    lifted = ("pg_catalog.pg_class", "information_schema.columns")
    assert analyze("SELECT relname FROM pg_class", CATALOGS, allowed_catalog_relations=lifted).tables == \
        ("pg_catalog.pg_class",)
    assert analyze("SELECT table_name FROM information_schema.columns", CATALOGS,
                   allowed_catalog_relations=lifted).tables == ("information_schema.columns",)
    # only the named ones
    refused("SELECT * FROM pg_stats", "catalog_not_allowed", CATALOGS, allowed_catalog_relations=lifted)
    refused("SELECT r.relname, s.query FROM pg_class r, pg_stat_activity s", "catalog_not_allowed", CATALOGS,
            allowed_catalog_relations=lifted)
    # a user table that shares a catalog's name is a user table
    assert analyze("SELECT * FROM public.pg_authid", CATALOGS).tables == ("public.pg_authid",)
    with pytest.raises(ValueError):
        analyze("SELECT 1", CATALOGS, allowed_catalog_relations=("pg_class",))   # schema-qualified only


@pytest.mark.parametrize("sql", [
    "SELECT * FROM pg_stat_get_activity(NULL)", "SELECT pg_stat_get_backend_client_addr(1)",
    "SELECT pg_stat_get_live_tuples('customers'::regclass)", "SELECT * FROM pg_show_all_settings()",
    "SELECT * FROM pg_get_backend_memory_contexts()", "SELECT * FROM pg_lock_status()",
    "SELECT * FROM pg_prepared_statement()", "SELECT * FROM pg_ls_waldir()", "SELECT * FROM pg_config()",
    "SELECT * FROM pg_control_system()", "SELECT * FROM pg_catalog.pg_stat_get_wal_receiver()",
])
def test_functions_reading_other_sessions_and_the_server_are_denied(sql):
    refused(sql, "function_not_allowed", CATALOGS)


@pytest.mark.parametrize("sql", [
    "SELECT current_setting('app.jwt_secret', true)", "SELECT pg_catalog.current_setting('data_directory')",
    "SELECT pg_get_functiondef('get_email'::regproc)", "SELECT pg_get_viewdef('v'::regclass, true)",
    "SELECT pg_get_ruledef(1)", "SELECT pg_get_triggerdef(1)", "SELECT pg_get_indexdef(1)",
    "SELECT pg_get_constraintdef(1)", "SELECT pg_get_expr(NULL::pg_node_tree, 0)", "SELECT pg_get_partkeydef(1)",
    "SELECT pg_get_statisticsobjdef_columns(1)", "SELECT obj_description(1, 'pg_class')",
    "SELECT col_description(1, 1)", "SELECT shobj_description(1, 'pg_database')",
    "SELECT pg_sequence_last_value('s')", "SELECT * FROM pg_sequence_parameters(1)",
    "SELECT id FROM customers WHERE name = current_setting('x')",
    # newer servers' functions, refused by name before a server has them
    "SELECT pg_sync_replication_slots()", "SELECT pg_restore_relation_stats('relation', 'customers'::regclass)",
    "SELECT pg_restore_attribute_stats('relation', 'customers'::regclass)",
    "SELECT pg_clear_relation_stats('public', 'customers')",
    "SELECT pg_clear_attribute_stats('public', 'customers', 'email', false)",
])
def test_catalog_contents_through_functions_are_denied(sql):
    # What the catalogs refused as relations hold, read through a function instead: settings
    # (pg_settings), definitions (pg_proc, pg_rewrite, pg_trigger ...), comments
    # (pg_description), a sequence's counter; and statistics written through a function.
    refused(sql, "function_not_allowed", CATALOGS)


def test_statistics_writers_lifted_are_still_side_effects():
    lifted = analyze("SELECT pg_clear_relation_stats('public', 'customers')", CATALOGS,
                     allowed_functions=("pg_clear_relation_stats",))
    assert lifted.side_effects == ("pg_clear_relation_stats",)


@pytest.mark.parametrize("sql, effects", [
    ("SELECT nextval('orders_id_seq')", ("nextval",)),
    ("SELECT pg_catalog.nextval('orders_id_seq') AS n", ("nextval",)),
    ('SELECT "nextval"(\'orders_id_seq\')', ("nextval",)),
    ("SELECT currval('orders_id_seq'), lastval()", ("currval", "lastval")),
    ("SELECT txid_current()", ("txid_current",)),
    ("SELECT pg_current_xact_id()", ("pg_current_xact_id",)),
    ("SELECT setseed(0.5)", ("setseed",)),
    ("SELECT brin_summarize_new_values('i'::regclass)", ("brin_summarize_new_values",)),
    ("SELECT gin_clean_pending_list('i'::regclass)", ("gin_clean_pending_list",)),
    ("SELECT id FROM customers WHERE id = nextval('s')", ("nextval",)),
    ("SELECT pg_export_snapshot()", ("pg_export_snapshot",)),
    ("SELECT upper(name) FROM customers", ()),
])
def test_side_effects_are_recorded(sql, effects):
    analysis = analyze(sql, CATALOGS)
    assert analysis.side_effects == effects
    assert Analysis.from_doc(json.loads(json.dumps(analysis.to_doc()))).side_effects == effects


def test_side_effects_on_the_deny_list_stay_denied():
    for sql in ("SELECT pg_advisory_lock(1)", "SELECT pg_try_advisory_xact_lock(1)", "SELECT pg_notify('c', 'x')",
                "SELECT setval('s', 1)", "SELECT set_config('search_path', 'private', false)",
                "SELECT lo_create(0)", "SELECT pg_stat_reset()", "SELECT pg_replication_origin_create('x')"):
        refused(sql, "function_not_allowed", CATALOGS)
    # lifted from the deny list, a side effect is still one
    lifted = analyze("SELECT pg_advisory_lock(1)", CATALOGS, allowed_functions=("pg_advisory_lock",))
    assert lifted.side_effects == ("pg_advisory_lock",)


@pytest.mark.parametrize("sql, ops", [
    ("INSERT INTO notes (id, body) VALUES (1, 'x')", ("insert",)),
    ("INSERT INTO notes (id, body) VALUES (1, 'x') ON CONFLICT (id) DO NOTHING", ("insert",)),
    ("INSERT INTO notes (id, body) VALUES (1, 'x') ON CONFLICT (id) DO UPDATE SET body = excluded.body",
     ("insert", "update")),
    ("INSERT INTO notes AS n (id, body) VALUES ($1, $2) ON CONFLICT ON CONSTRAINT notes_pkey "
     "DO UPDATE SET body = n.body || excluded.body WHERE n.id > 0", ("insert", "update")),
    ("MERGE INTO notes n USING customers c ON n.id = c.id WHEN MATCHED THEN DELETE", ("merge", "delete")),
    ("MERGE INTO notes n USING customers c ON n.id = c.id WHEN MATCHED THEN UPDATE SET body = c.name "
     "WHEN NOT MATCHED THEN INSERT (id, body) VALUES (c.id, c.name)", ("merge", "insert", "update")),
    ("MERGE INTO notes n USING customers c ON n.id = c.id WHEN MATCHED THEN DO NOTHING", ("merge",)),
    ("SELECT 1", ()),
])
def test_every_write_operation_is_recorded(sql, ops):
    analysis = analyze(sql, CATALOGS)
    assert analysis.write_ops == ops
    assert Analysis.from_doc(json.loads(json.dumps(analysis.to_doc()))).write_ops == ops


@pytest.mark.parametrize("sql", [
    "SELECT 1 && 0",
    "SELECT id FROM customers WHERE (id && 0) IS NOT NULL",
    "SELECT name LIKE 'a%' FROM customers",          # LIKE is the ~~ operator
    "SELECT ARRAY[1] && ARRAY[0]",   # the same symbol: which one PostgreSQL picks is not guessed
])
def test_user_defined_operators_count_as_calls_of_their_function(sql):
    analysis = analyze(sql, CATALOGS)
    assert analysis.user_functions == ("leak_and",)
    with pytest.raises(GatewayError) as info:
        plan(analysis, Grants.from_doc({"allowed_tables": ["public.customers"]}))
    assert info.value.code == "function_opaque"
    plan(analysis, Grants.from_doc({}))   # no restriction: nothing to protect


def test_a_join_using_or_natural_applies_the_equality_operator_by_name():
    # PostgreSQL builds USING and NATURAL joins' conditions with "=" looked up by name, as a
    # written a = b: a user-defined "=" (for the columns' types) is called there too.
    schema = Schema({"public.customers": ("id", "name"), "public.notes": ("id", "body")},
                    functions=["leak_eq"], operators={"=": ["leak_eq"]})
    for sql in ("SELECT name FROM customers JOIN notes USING (id)", "SELECT name FROM customers NATURAL JOIN notes",
                "SELECT name FROM customers c JOIN notes n ON c.id = n.id"):
        assert analyze(sql, schema).user_functions == ("leak_eq",), sql
    assert analyze("SELECT name FROM customers CROSS JOIN notes", schema).user_functions == ()


def test_operators_backed_by_denied_or_side_effect_functions():
    refused("SELECT 'a' === 'b'", "function_not_allowed", CATALOGS)
    refused("SELECT 'a' === 'b'", "function_not_allowed", CATALOGS.from_doc(CATALOGS.to_doc()))
    assert analyze("SELECT 1 <-> 2", CATALOGS).side_effects == ("nextval",)
    # a built-in function behind a user operator is no user function
    assert analyze("SELECT id FROM customers WHERE name = 'x'", CATALOGS).user_functions == ()
    # an operator not applied is not a call, whatever the text holds
    assert analyze("SELECT '1 && 0' AS s, 1 + 1 AS t", CATALOGS).user_functions == ()


@pytest.mark.parametrize("op", ["&&&", "===", "@@@", "!!", "##", "%%", "^^", "<<|", "~=", "?-|", "`", "|/",
                                "&/**/&", "!==", "@", "@-@", "<->>", "#-#", "+-", "-+", "*=*", "~~~"])
def test_unreadable_operators_are_refused_not_crashed(op):
    for sql in (f"SELECT 1 {op} 2", f"SELECT {op} 1", f"SELECT id FROM customers WHERE id {op} $1",
                f"SELECT 1 OPERATOR(public.{op}) 2"):
        try:
            analyze(sql, CATALOGS)
        except GatewayError as error:
            assert error.status == 400, (sql, error.code)


def test_relations_an_extension_owns_are_refused_like_catalogs():
    schema = Schema({"public.customers": ("id",), "public.pg_stat_statements": ("query", "calls")},
                    extension_relations=["public.pg_stat_statements"])
    refused("SELECT query FROM pg_stat_statements", "catalog_not_allowed", schema)
    lifted = analyze("SELECT query FROM pg_stat_statements", schema,
                     allowed_catalog_relations=("public.pg_stat_statements",))
    assert lifted.tables == ("public.pg_stat_statements",)
    assert Schema.from_doc(json.loads(json.dumps(schema.to_doc()))).extension_relations == \
        {("public", "pg_stat_statements")}



def test_every_relation_postgres_reads_is_one_the_analysis_resolved():
    # Defence in depth: a relation in PostgreSQL's parse tree that sqlglot's reading missed
    # (none is known today) is refused, whatever allow-lists it would have met.
    from gateway.governance.analysis.agree import relations_agree
    from gateway.sql import read_positional
    tree = read_positional("SELECT * FROM pg_catalog.pg_authid a, customers c, w WHERE c.id = a.oid").tree
    tree["SelectStmt"]["withClause"] = {"ctes": [{"CommonTableExpr": {"ctename": "w"}}]}
    relations_agree(tree, {("pg_catalog", "pg_authid"), ("public", "customers")})
    for tables in ({("public", "customers")}, {("pg_catalog", "pg_authid")}, {("public", "pg_authid"),
                                                                            ("public", "customers")}):
        with pytest.raises(GatewayError) as info:
            relations_agree(tree, tables)
        assert info.value.code == "analysis_failed"
    del tree["SelectStmt"]["withClause"]
    with pytest.raises(GatewayError):
        relations_agree(tree, {("pg_catalog", "pg_authid"), ("public", "customers")})   # w is no CTE now
    # what the analysis resolves, PostgreSQL reads: CTEs, write targets, catalogs named by the server
    for sql in ("WITH w AS (SELECT 1 AS x) SELECT * FROM w, customers", "UPDATE notes SET body = 'x' WHERE id = 1",
                "INSERT INTO notes (body) SELECT name FROM customers", "DELETE FROM notes USING customers c",
                "MERGE INTO notes n USING customers c ON n.id = c.id WHEN MATCHED THEN DELETE"):
        analyze(sql, CATALOGS)
    analyze("SELECT * FROM pg_class", CATALOGS, allowed_catalog_relations=("pg_catalog.pg_class",))


def test_the_servers_relations_read_are_recorded_for_the_plan():
    # An analysis records the catalog and extension relations it was allowed to read: each
    # gateway planning a call checks them against its own GATEWAY_ALLOW_CATALOG_RELATIONS.
    schema = Schema({"public.customers": ("id",), "public.pg_stat_statements": ("query",),
                     "pg_catalog.pg_class": ("relname",)}, extension_relations=["public.pg_stat_statements"])
    lifted = ("public.pg_stat_statements", "pg_catalog.pg_class")
    analysis = analyze("SELECT c.relname, s.query FROM pg_class c, pg_stat_statements s, customers",
                       schema, allowed_catalog_relations=lifted)
    assert analysis.catalogs == ("pg_catalog.pg_class", "public.pg_stat_statements")
    doc = json.loads(json.dumps(analysis.to_doc()))
    assert Analysis.from_doc(doc).catalogs == analysis.catalogs
    del doc["catalogs"]    # stored before the field: pg_catalog's and information_schema's by their schema
    assert Analysis.from_doc(doc).catalogs == ("pg_catalog.pg_class",)
    assert analyze("SELECT id FROM customers", schema).catalogs == ()


# --- the two readers agree, or nothing runs (issue 10, item 1) ---------------------------------
# PostgreSQL's reading (gateway.sql) and sqlglot's are compared word by word, parameter by
# parameter, by kind and by statement count. Real texts where they split words differently,
# and readings doctored to differ in one respect each: every disagreement is analysis_failed.
def _doctored(sql: str, **fields) -> Statement:
    return dataclasses.replace(read_positional(sql), **fields)


@pytest.mark.parametrize("sql", [
    "SELECT id FROM orders\u00a0",          # a no-break space: part of a name to PostgreSQL, a space to sqlglot
    "SELECT id AS\u00a0x FROM orders",      # PostgreSQL: the column "as\u00a0x"; sqlglot: x
    "SELECT id AS x FROM orders WHERE 1_000 > 1",   # PostgreSQL 16+: 1000; sqlglot: 1 and a name
])
def test_words_the_readers_split_differently_are_refused(sql):
    schema = Schema({"public.orders": ("id",), "public.orders\u00a0": ("id",)})
    refused(read(sql), "analysis_failed", schema)   # as the pipeline reads it: PostgreSQL's tokens, no strip()


def test_parameters_the_readers_place_differently_are_refused():
    statement = read_positional("SELECT $1::int AS a, $2::int AS b")
    assert analyze(statement, SCHEMA).kind == "read"
    refused(_doctored(statement.text, params=statement.params[:1]), "analysis_failed")
    refused(_doctored(statement.text, params=(statement.params[0], statement.params[1] + 1)), "analysis_failed")


@pytest.mark.parametrize("sql, kind", [("SELECT id FROM orders", "write"), ("DELETE FROM orders WHERE id = 1", "read")])
def test_a_kind_the_readers_disagree_on_is_refused(sql, kind):
    refused(_doctored(sql, kind=kind), "analysis_failed")


def test_a_statement_count_the_readers_disagree_on_is_refused():
    text = "SELECT 1 AS a; SELECT 2"   # nothing in the second for another check to catch
    refused(_doctored("SELECT 1 AS a", text=text, words=words_of(text)), "analysis_failed")


_WORD_AS_RANGES = r"[A-Za-z_\u0080-\U0010ffff][A-Za-z0-9_$\u0080-\U0010ffff]*\Z"


@settings(max_examples=3000, deadline=None)
@given(st.text(alphabet=st.sampled_from(
    [chr(c) for c in range(0, 0x100)] + ["\u2028", "\ufeff", "\uffff", "日", "\U0001F600", "\U0010ffff"]),
    max_size=8))
def test_the_cross_checks_word_pattern_is_the_set_it_names(text):
    """The words the ad-hoc analysis compares with PostgreSQL's reading (``_sqlglot_words``): its
    pattern is spelled with a negated ASCII class (cheap to compile at each worker's boot) and
    must match exactly what the character ranges it replaced match, boundaries (0x7f, 0x80,
    the last code point, ``$`` and digits first) included."""
    import re

    from gateway.governance.analysis.agree import WORD_FULL
    assert bool(WORD_FULL.match(text)) == bool(re.match(_WORD_AS_RANGES, text))
