"""The hostile-input corpus (``tests/corpus/hostile.jsonl``), end to end against a real
PostgreSQL holding the demo tables.

Each case is a real attempt: SQL (saved with ``:name`` placeholders, going through
``gateway.sql`` first, or ad hoc in positional ``$n`` form), a key's grants, optional
query masks and parameters, and the expected outcome:

* ``refused:<code>``: analysis or planning refuses it with that stable code (``refused:*``:
  any refusal), before anything runs;
* ``masked:<col>[,<col>...]``: it runs (parameters bound as data, in a READ ONLY
  transaction that is rolled back; a write in a rolled-back read-write one), the plan masks
  those output columns, and none of their cells contains a raw value of any masked source
  column read directly from the database. Unless the case says ``vacuous_ok``, the same
  statement run without the masks must have shown raw values, so the case is a real attempt;
* ``echo:<param>``: it runs and the first cell is exactly the parameter's value (a value is
  data, never SQL);

every case that runs with values runs twice, once as a prepared statement (the paged path)
and once with the values as checked literals (the ad-hoc and stream path), and the two must
return the same rows;
* ``dberror:<sqlstate>``: PostgreSQL rejects the bound value itself;
* ``ok``: it passes analysis and planning and runs.

The server is this module's own (a free port, ``GATEWAY_TEST_CORPUS_PG_PORT`` fixes one; a temporary home),
stopped at the end: the hostile SQL runs there as the superuser, apart from the session's servers.
"""
from __future__ import annotations

import json
import re
import uuid
from types import SimpleNamespace

import psycopg2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.ops.local.demo import create_demo_data
from gateway.errors import GatewayError
from gateway.governance import Analysis, Grants, analyze, load_schema, plan
from gateway.governance.grants import compile_masks
from gateway.sql import Template, read, read_positional
from helpers.services import port_for, start_postgres
from helpers.util import ROOT

# Its own PostgreSQL (the hostile SQL runs there).
pytestmark = pytest.mark.integration

CORPUS = ROOT / "tests" / "corpus" / "hostile.jsonl"
HASH_KEY = b"test-mask-key"

EXTRAS = r"""
CREATE VIEW customer_contacts AS SELECT id, email AS contact, country FROM customers;
CREATE MATERIALIZED VIEW customer_emails_mv AS SELECT id, email FROM customers;
CREATE SCHEMA private;
CREATE TABLE private.secrets (id integer PRIMARY KEY, secret text NOT NULL);
INSERT INTO private.secrets VALUES (1, 'top-secret-value-one'), (2, 'top-secret-value-two');
CREATE TABLE private.customers (id integer, email text);
INSERT INTO private.customers VALUES (1, 'decoy.person@private.example');
CREATE TABLE "Secret" ("Token" text, id integer);
INSERT INTO "Secret" VALUES ('tok_live_AAAA1111BBBB', 1), ('tok_live_CCCC2222DDDD', 2);
CREATE TABLE public.pg_authid (rolname text);
INSERT INTO public.pg_authid VALUES ('decoy');
CREATE TABLE vip_customers () INHERITS (customers);
INSERT INTO vip_customers (id, name, email, country, plan, created_at)
     VALUES (100001, 'Vip Person', 'vip.person@example.com', 'US', 'pro', '2024-01-01');
CREATE TABLE notes (id serial PRIMARY KEY, body text);
CREATE FUNCTION get_email(cid integer) RETURNS text LANGUAGE sql STABLE
    AS $$ SELECT email FROM customers WHERE id = cid $$;
CREATE FUNCTION leak_emails(integer, integer) RETURNS text LANGUAGE sql STABLE
    AS $$ SELECT string_agg(email, ',') FROM customers $$;
CREATE OPERATOR && (LEFTARG = integer, RIGHTARG = integer, FUNCTION = leak_emails);
CREATE OPERATOR ### (RIGHTARG = text, FUNCTION = pg_catalog.pg_read_file);
"""


def load_cases() -> list[dict]:
    return [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]


CASES = load_cases()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    server = start_postgres(tmp_path_factory.mktemp("governance-pg"), port_for("corpus_pg"))
    try:
        server.ensure_database("demo")
        url = server.url("demo")
        create_demo_data(url)
        conn = psycopg2.connect(url, options="-c search_path=public -c statement_timeout=5000")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT to_regclass('public.notes') IS NOT NULL")
            if not cur.fetchone()[0]:
                cur.execute(EXTRAS)
        schema = load_schema(conn, ("public",))
        yield SimpleNamespace(server=server, conn=conn, schema=schema, raw={})
        conn.close()
    finally:
        server.stop()


# --- running one case ----------------------------------------------------------------------------
def _positional(case) -> tuple[str, list]:
    if case["mode"] == "saved":
        params = case["params"]
        text = read(case["sql"], frozenset(params))
        return text.text, [params[name] for name in text.order]
    return case["sql"], list(case["params"])


def _execute(conn, sql: str, values: list, write: bool):
    """Bound like the gateway binds: a prepared statement, values sent as data."""
    name = "gov_" + uuid.uuid4().hex[:12]
    with conn.cursor() as cur:
        cur.execute("BEGIN" if write else "BEGIN READ ONLY")
        try:
            cur.execute(f"PREPARE {name} AS {sql}")
            if values:
                cur.execute(f"EXECUTE {name} ({', '.join(['%s'] * len(values))})", values)
            else:
                cur.execute(f"EXECUTE {name}")
            columns = [d.name for d in cur.description] if cur.description else []
            rows = cur.fetchall() if cur.description else []
            return columns, rows
        finally:
            cur.execute("ROLLBACK")
            cur.execute("DEALLOCATE ALL")


def _execute_rendered(conn, sql: str, values: list, write: bool):
    """Bound the way ad-hoc statements and streams bind: each value a literal at a position
    PostgreSQL's parser reported as a parameter, the text parsed again and checked."""
    text = Template(read_positional(sql)).render(values)
    with conn.cursor() as cur:
        cur.execute("BEGIN" if write else "BEGIN READ ONLY")
        try:
            cur.execute(text)
            return cur.fetchall() if cur.description else []
        finally:
            cur.execute("ROLLBACK")


def _raw_pattern(demo, rules):
    """A matcher for any raw value (longer than 4 characters) of any column a non-keep
    rule masks, read directly from the database."""
    values: set[str] = set()
    for (schema_name, table), columns in demo.schema.relations.items():
        if schema_name in ("pg_catalog", "information_schema"):
            continue
        for column in columns:
            if not any(r.action != "keep" and r.matches(schema_name, table, column) for r in rules):
                continue
            key = (schema_name, table, column)
            if key not in demo.raw:
                with demo.conn.cursor() as cur:
                    cur.execute(f'SELECT DISTINCT "{column}"::text FROM "{schema_name}"."{table}" '
                                f'WHERE "{column}" IS NOT NULL')
                    demo.raw[key] = {row[0] for row in cur.fetchall()}
            for value in demo.raw[key]:
                # the value, and an email's local part (what split_part or replace would show)
                values.update(v for v in (value, value.split("@")[0]) if len(v) > 4)
    assert values, "the masked columns hold no values to check against"
    return _Needles(values)


class _Needles:
    """Finds any of many strings (5 characters or more) inside a text, case-insensitively:
    candidates by their first 5 characters, then checked whole. Linear in the text."""

    def __init__(self, values):
        self.by_prefix: dict[str, list[str]] = {}
        for value in values:
            low = value.lower()
            self.by_prefix.setdefault(low[:5], []).append(low)

    def search(self, text: str) -> bool:
        low = text.lower()
        by_prefix = self.by_prefix
        for i in range(len(low) - 4):
            candidates = by_prefix.get(low[i:i + 5])
            if candidates and any(low.startswith(c, i) for c in candidates):
                return True
        return False


def _cells(value):
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _cells(item)
    elif isinstance(value, dict):
        yield from (str(k) for k in value)
        for item in value.values():
            yield from _cells(item)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        yield bytes(value).decode("utf-8", "replace")
    elif value is not None:
        yield str(value)


def run_case(demo, case) -> None:
    expects = case["expect"] if isinstance(case["expect"], list) else [case["expect"]]
    refused = [e.split(":", 1)[1] for e in expects if e.startswith("refused:")]
    grants_doc = case.get("grants") or {}
    try:
        sql, values = _positional(case)
        analysis = analyze(sql, demo.schema, ("public",))
        # The stored form is what the gateway plans from.
        analysis = Analysis.from_doc(json.loads(json.dumps(analysis.to_doc())))
        grants = Grants.from_doc(grants_doc)
        call_plan = plan(analysis, grants, case.get("query_masks"), hash_key=HASH_KEY)
    except GatewayError as error:
        assert refused, f"{case['id']}: refused with {error.code} ({error.message}), expected {expects}"
        assert refused[0] in ("*", error.code), \
            f"{case['id']}: refused with {error.code} ({error.message}), expected {refused[0]}"
        return
    assert not refused, f"{case['id']}: not refused, expected {refused[0]}"
    write = analysis.kind == "write"
    dberror = [e.split(":", 1)[1] for e in expects if e.startswith("dberror:")]
    try:
        columns, rows = _execute(demo.conn, sql, values, write)
    except psycopg2.Error as error:
        assert dberror and error.pgcode == dberror[0], f"{case['id']}: database error {error.pgcode}: {error}"
        return
    assert not dberror, f"{case['id']}: expected database error {dberror[0]}"
    if values:
        rendered = _execute_rendered(demo.conn, sql, values, write)
        # (a write's RETURNING may show a sequence that moved on between the two runs)
        assert (len(rendered) == len(rows)) if write else (rendered == rows), \
            f"{case['id']}: the literal binding and the prepared statement disagree"
    assert len(columns) == len(analysis.columns), f"{case['id']}: {columns} vs {analysis.columns}"
    out_columns, out_rows = call_plan.apply(columns, rows)
    for expect in expects:
        kind, _, arg = expect.partition(":")
        if kind == "echo":
            assert out_rows and out_rows[0][0] == case["params"][arg], f"{case['id']}: {out_rows[:1]!r}"
        elif kind == "masked":
            rules = list(grants.masks) + list(compile_masks(case.get("query_masks")))
            pattern = _raw_pattern(demo, rules)
            for name in arg.split(","):
                positions = [i for i, c in enumerate(columns) if c == name]
                assert positions, f"{case['id']}: no output column {name!r} in {columns}"
                for position in positions:
                    assert call_plan.actions[position] not in (None, "keep"), \
                        f"{case['id']}: column {name!r} is not masked ({call_plan.actions})"
                kept = [i for i, c in enumerate(out_columns) if c == name]
                for row in out_rows:
                    for i in kept:
                        for cell in _cells(row[i]):
                            assert not pattern.search(cell), f"{case['id']}: raw value leaked in {name}: {cell[:80]!r}"
                if not case.get("vacuous_ok"):
                    leaked = any(pattern.search(cell) for row in rows for p in positions for cell in _cells(row[p]))
                    assert leaked, f"{case['id']}: unmasked, column {name!r} would show no raw value (not an attempt)"
        elif kind != "ok":
            raise AssertionError(f"{case['id']}: unknown expectation {expect!r}")


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_corpus_case(demo, case):
    run_case(demo, case)


def test_corpus_size_and_categories():
    assert len(CASES) >= 100
    ids = [c["id"] for c in CASES]
    assert len(ids) == len(set(ids))
    categories = {c["category"] for c in CASES}
    assert {"param-injection", "stacked-statements", "comment-quoting", "statement-kind", "dangerous-functions",
            "allow-list", "masking", "masking-whole-row", "masking-views", "writes"} <= categories


# --- the schema as read from the server ---------------------------------------------------------------
def test_load_schema_reads_tables_views_parents_and_functions(demo):
    schema = demo.schema
    assert schema.relations[("public", "customers")][:3] == ("id", "name", "email")
    assert ("public", "customer_contacts") in schema.views
    assert ("public", "customer_emails_mv") in schema.views
    assert ("public", "customers") not in schema.views
    assert ("public", "Secret") in schema.relations
    assert ("pg_catalog", "pg_authid") in schema.relations
    assert ("information_schema", "columns") in schema.relations
    assert schema.parents[("public", "vip_customers")] == (("public", "customers"),)
    assert "get_email" in schema.functions
    assert schema.operators["&&"] == ("leak_emails",) and schema.operators["###"] == ("pg_read_file",)
    assert "+" not in schema.operators and "=" not in schema.operators    # built-in ones are not listed
    assert schema.search_path == ("public",)
    round_trip = type(schema).from_doc(json.loads(json.dumps(schema.to_doc())))
    assert round_trip.relations == schema.relations and round_trip.views == schema.views


def test_search_path_is_read_from_the_session(demo):
    with psycopg2.connect(demo.server.url("demo"), options="-c search_path=private,public") as conn:
        schema = load_schema(conn)
    assert schema.search_path == ("private", "public")
    analysis = analyze("SELECT email FROM customers", schema, schema.search_path)
    assert analysis.tables == ("private.customers",)


# --- output columns line up with PostgreSQL's, position by position ------------------------------------
@pytest.mark.parametrize("sql", [
    "SELECT * FROM customers",
    "SELECT * FROM customers c JOIN orders o ON o.customer_id = c.id",
    "SELECT * FROM customers JOIN orders USING (id)",
    "SELECT * FROM orders JOIN customers USING (id)",
    "SELECT * FROM customers NATURAL JOIN orders",
    "SELECT * FROM customers c, orders o, notes n",
    "SELECT * FROM customers JOIN orders USING (id) JOIN notes USING (id)",
    "SELECT * FROM notes n, customers JOIN orders USING (id)",
    "SELECT * FROM customers c JOIN (orders o JOIN notes n USING (id)) ON c.id = o.customer_id",
    "SELECT o.*, c.*, 1 AS one FROM customers c JOIN orders o USING (id)",
    "SELECT * FROM customers AS c(a, b)",
    "SELECT * FROM (SELECT email AS id, id AS email FROM customers) s",
    "SELECT * FROM customers c, LATERAL (SELECT c.email AS e) l",
    "SELECT * FROM generate_series(1, 2) g, unnest(ARRAY['a']) WITH ORDINALITY AS u(x, n)",
    "SELECT * FROM json_each('{\"a\": 1}') j, customers c LIMIT 1",
    "SELECT * FROM jsonb_array_elements('[1]') e, jsonb_object_keys('{\"a\": 1}') k, regexp_matches('ab', 'a')",
    "SELECT * FROM vip_customers",
    "SELECT * FROM customer_contacts",
    'SELECT * FROM "Secret"',
    "WITH x(a) AS (SELECT email, name FROM customers) SELECT * FROM x",
    "SELECT * FROM customers LEFT JOIN orders USING (id) FULL JOIN notes USING (id)",
])
def test_star_expansion_matches_postgres(demo, sql):
    analysis = analyze(sql, demo.schema)
    columns, _ = _execute(demo.conn, sql + ("" if "LIMIT" in sql else " LIMIT 1"), [], False)
    assert [c.name for c in analysis.columns] == columns


# --- a differential fuzz against PostgreSQL's own parser ---------------------------------------------
# Random quoting/comment fragments around a payload that reads private.secrets. Whenever the
# analysis accepts the text for a key allowed only public.orders, PostgreSQL's own plan for it
# (EXPLAIN, nothing runs) must not scan private.secrets.
_FRAGMENTS = ["'", "''", "\\", "E'", "$$", "$a$", "$A$", '"', "/*", "*/", "--", "\n", " ", ";", "(", ")", ",",
              "x", "1", "AS", "||", "U&", "e'\\''", "::text"]
_PAYLOAD = "(SELECT count(*) FROM private.secrets)"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=st.lists(st.sampled_from(_FRAGMENTS), max_size=6),
       after=st.lists(st.sampled_from(_FRAGMENTS), max_size=6))
def test_fuzz_hidden_payload_never_reaches_postgres(demo, before, after):
    sql = "SELECT 1 AS a, " + "".join(before) + _PAYLOAD + "".join(after)
    try:
        analysis = analyze(sql, demo.schema)
        plan(analysis, Grants.from_doc({"allowed_tables": ["public.orders"]}))
    except GatewayError:
        return
    with demo.conn.cursor() as cur:
        try:
            cur.execute("BEGIN READ ONLY")
            cur.execute("EXPLAIN (VERBOSE, COSTS OFF) " + sql.replace("%", "%%"))
            text = "\n".join(row[0] for row in cur.fetchall())
        except psycopg2.Error:
            return
        finally:
            cur.execute("ROLLBACK")
    assert not re.search(r"\bon private\.secrets\b", text), (sql, text)


# --- the names the plan checks results against are PostgreSQL's ------------------------------------------
@pytest.mark.parametrize("sql", [
    "SELECT email, email AS e, (email), email::text, CAST(email AS varchar), c.email, (c.email)::bytea "
    "FROM customers c",
    'SELECT "Token", "Token" AS "Odd Name", id AS "ID" FROM "Secret"',
    "SELECT substr(email, 1, 1), upper(email), count(*) OVER (), 1, 'x'::text, now(), CURRENT_DATE, "
    "user, current_user, CASE WHEN true THEN 1 END, ARRAY[1], ROW(1), coalesce(email, ''), email || '' "
    "FROM customers",
    "SELECT * FROM (SELECT substr(email, 1, 1), email, max(id) FROM customers GROUP BY email) s",
    "SELECT * FROM (SELECT substr(email, 1, 1) FROM customers) s(x)",
    "SELECT id, id, c.id FROM customers c",
    "WITH w AS (SELECT email AS mail, length(email) FROM customers) SELECT * FROM w",
    "SELECT email FROM customers UNION ALL SELECT substr(email, 1, 1) FROM customers",
    "SELECT substr(email, 1, 1) FROM customers UNION ALL SELECT email FROM customers",
    "SELECT * FROM substr('abc', 1, 1), generate_series(1, 2), upper('x') AS u, unnest(ARRAY[1, 2])",
    "VALUES (1, 'a')",
    "SELECT * FROM vip_customers",
    "SELECT " + "x" * 70 + " FROM (SELECT 1 AS " + "x" * 70 + ") s",
])
def test_names_marked_exact_are_postgres_names(demo, sql):
    analysis = analyze(sql, demo.schema)
    columns, _ = _execute(demo.conn, sql + ("" if sql.startswith("VALUES") else " LIMIT 1"), [], False)
    assert len(columns) == len(analysis.columns)
    for column, name in zip(analysis.columns, columns):
        if column.exact_name:
            assert column.name == name, (sql, column.name, name)
