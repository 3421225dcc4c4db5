"""Values never become SQL: the attacks of the governance issue, replayed, and a property
test that no value can change a statement whatever quoting surrounds its placeholders.

Every test here failed on the hand-written scanner (``gateway/sqltext.py``) that this
reader replaced: it read a dollar quote with a non-ASCII tag, or a word ending in ``e``
before a quote, differently from PostgreSQL, and pasted client-quoted values into the text.
"""
from __future__ import annotations

import json

import psycopg2
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from gateway.errors import GatewayError
from gateway.execution.pool import session_options
from gateway.sql import Template, paged, read
from helpers.util import unique

MARKER = "gw-secret-marker"


@pytest.fixture(scope="module")
def hidden_table(superuser):
    """A table no test key is granted, holding a marker that must never come back."""
    name = unique("hidden").lower()
    superuser(f"CREATE TABLE {name} (secret text)", db="demo")
    superuser(f"INSERT INTO {name} VALUES ('{MARKER}')", db="demo")
    return name


# --- the reported attacks, over HTTP ----------------------------------------------------------
def _payloads(hidden: str) -> list[str]:
    escape = f"(SELECT secret FROM {hidden})"
    return [
        f"' $é$, {escape} AS leak, $é$",
        f"$é$ || {escape} || $é$",
        f"x' || {escape} || '",
        f"\\' || {escape} || '",
        f"x'; COMMIT; BEGIN READ WRITE; INSERT INTO {hidden} VALUES ('pwned'); --",
        f"*/ || {escape} || /*",
        f"\n|| {escape} --",
    ]


@pytest.mark.parametrize("sql", [
    "SELECT $é$ :p $é$ AS b",                    # a dollar tag with a non-ASCII letter
    "SELECT $Ω$ :p $Ω$ AS b",
    "SELECT somee' :p ' AS b",                    # a word ending in e before a quote: not E''
    "SELECT 1 AS somee, ' :p ' AS b",
    "SELECT e' \\' :p ' AS b",                     # a real E'' string: the \\' does not end it
    "SELECT /* /* :p */ */ 1 AS b",               # nested comments
    "SELECT U&' :p ' AS b",
])
def test_a_value_is_never_sql_in_adhoc_statements(api, demo_connection, hidden_table, superuser, sql):
    secret = api.key([], [demo_connection], allowed_tables=["public.customers"], allow_writes=True)
    for payload in _payloads(hidden_table):
        got = api.adhoc(secret, {"sql": sql, "params": {"p": payload}, "connection_name": demo_connection})
        assert got.status in (200, 400), got
        assert MARKER not in got.text and "pwned" not in got.text, (sql, payload, got)
        if got.status == 400:
            assert got.json["code"] in ("param_invalid", "analysis_failed", "invalid_sql"), got
    assert superuser(f"SELECT count(*) FROM {hidden_table}", db="demo")[0][0] == 1


def test_a_placeholder_inside_a_string_is_text_and_its_value_is_refused(api, demo_connection):
    secret = api.key([], [demo_connection])
    got = api.adhoc(secret, {"sql": "SELECT $é$ :p $é$ AS b", "connection_name": demo_connection})
    assert got.status == 200 and got.json == [{"b": " :p "}], got
    got = api.adhoc(secret, {"sql": "SELECT $é$ :p $é$ AS b", "params": {"p": "x"},
                             "connection_name": demo_connection})
    assert got.status == 400 and got.json["code"] == "param_invalid", got


@pytest.mark.parametrize("sql", [
    "SELECT $é$ :p $é$ AS b, :p AS v",
    "SELECT 1 AS somee, ' :p ' AS b, :p AS v",
    "SELECT name AS b, :p AS v FROM customers WHERE id = 1",
])
def test_a_value_is_never_sql_when_streamed(api, endpoint, hidden_table, sql):
    ep = endpoint(sql, {"p": {"type": "str", "required": True}})
    for payload in _payloads(hidden_table):
        got = api.call(ep.query, ep.secret, {"p": payload, "stream": "true", "format": "ndjson"})
        assert got.status == 200, got
        assert MARKER not in got.text, (sql, payload, got.text)
        lines = [json.loads(line) for line in got.text.splitlines()]
        assert len(lines) == 1 and lines[0]["v"] == payload, lines


def test_streamed_values_keep_their_types(api, endpoint):
    ep = endpoint("SELECT :i AS i, :f AS f, :b AS b, :d AS d, :t AS t, - :i AS neg",
                  {"i": {"type": "int"}, "f": {"type": "float"}, "b": {"type": "bool"},
                   "d": {"type": "date"}, "t": {"type": "str"}})
    got = api.call(ep.query, ep.secret, {"i": "-7", "f": "2.5", "b": "true", "d": "2024-02-29",
                                         "t": "it's", "stream": "true", "format": "csv"})
    assert got.status == 200, got
    assert got.text.splitlines() == ["i,f,b,d,t,neg", "-7,2.5,true,2024-02-29,it's,7"]


# --- the session reads literals as the reader writes them ------------------------------------
def test_sessions_pin_standard_conforming_strings(services, superuser):
    database = unique("nonstd").lower()
    superuser(f"CREATE DATABASE {database}", db="postgres")
    superuser(f"ALTER DATABASE {database} SET standard_conforming_strings = off", db="postgres")
    conn = psycopg2.connect(host="127.0.0.1", port=services.pg.port, dbname=database, user="postgres",
                            password=services.pg.password(), options=session_options(5000, True))
    try:
        conn.autocommit = True
        assert conn.info.parameter_status("standard_conforming_strings") == "on"
        statement = read("SELECT :p AS v")
        text = Template(statement).render(["\\' || current_user || '"])
        with conn.cursor() as cur:
            cur.execute(text)
            assert cur.fetchall() == [("\\' || current_user || '",)]
    finally:
        conn.close()


# --- the property: no value changes a statement ---------------------------------------------
_CHARS = st.characters(codec="utf-8", exclude_characters="\x00")
_TAG = st.one_of(st.just(""), st.from_regex(r"[A-Za-z_\u00e9\u03a9][A-Za-z0-9_\u00e9]{0,3}", fullmatch=True))
_TRICKY = st.sampled_from(["'", "''", "\\", "\\'", "$", "$$", "$é$", "--", "/*", "*/", ":p", ";", "\n", "e'", "E'",
                           "U&'", "\"", "x"])
_CONTENT = st.lists(st.one_of(_TRICKY, st.text(_CHARS, max_size=4)), max_size=6).map("".join)


@st.composite
def _construct(draw) -> tuple[str, str]:
    """(kind, a piece of SQL text that quotes or comments something, as PostgreSQL writes it)."""
    content = draw(_CONTENT)
    kind = draw(st.sampled_from(["string", "escape", "dollar", "block", "nested", "line", "ident", "word_e",
                                 "unicode"]))
    if kind == "string":   # backslashes and all: a standard string ends only at a lone quote
        return kind, "'" + content.replace("'", "''") + "'"
    if kind == "escape":
        return kind, "E'" + content.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if kind == "dollar":
        tag = draw(_TAG)
        return kind, f"${tag}$" + content.replace(f"${tag}$", "") + f"${tag}$"
    if kind == "block":
        return kind, "/* " + content.replace("*/", "").replace("/*", "") + " */ 1"
    if kind == "nested":   # PostgreSQL's block comments nest
        inner = content.replace("*/", "").replace("/*", "")
        return kind, "/* a /* " + inner + " */ :p /* " + inner + " */ b */ 1"
    if kind == "line":
        return kind, "-- " + content.replace("\n", " ").replace("\r", " ") + "\n 1"
    if kind == "ident":
        return kind, '1 AS "' + (content.replace('"', '""') or "x") + '"'
    if kind == "unicode":   # U&'...', with or without UESCAPE: refused outright by the reader
        escape = draw(st.sampled_from(["\\", "!", "#"]))
        text = "U&'" + content.replace("'", "''").replace(escape, escape * 2) + "'"
        return kind, text + (f" UESCAPE '{escape}'" if escape != "\\" or draw(st.booleans()) else "")
    return kind, "1 AS somee"


def _connect(services, database: str, options: str | None):
    conn = psycopg2.connect(host="127.0.0.1", port=services.pg.port, dbname=database, user="postgres",
                            password=services.pg.password(), options=options)
    conn.autocommit = True
    return conn


@pytest.fixture(scope="module")
def data_sessions(services, superuser):
    """Data sessions as the gateway opens them, on the demo database and on one whose
    database and role defaults are standard_conforming_strings = off (pinned on by the
    session's options); and a session of the latter left at off, for EXECUTE's arguments,
    which the driver quotes for the session's setting."""
    database = unique("nonstd_prop").lower()
    superuser(f"CREATE DATABASE {database}", db="postgres")
    superuser(f"ALTER DATABASE {database} SET standard_conforming_strings = off", db="postgres")
    superuser(f"ALTER ROLE postgres IN DATABASE {database} SET standard_conforming_strings = off", db="postgres")
    pinned = [_connect(services, "demo", session_options(5000, True)),
              _connect(services, database, session_options(5000, True))]
    off = _connect(services, database, None)
    assert [c.info.parameter_status("standard_conforming_strings") for c in pinned + [off]] == ["on", "on", "off"]
    yield pinned, off
    for conn in pinned + [off]:
        conn.close()


def _run(conn, text: str, value=None, prepared: bool = False):
    with conn.cursor() as cur:
        if prepared:
            cur.execute("DEALLOCATE ALL")
            cur.execute(f"PREPARE gw_prop AS {text}")
            cur.execute("EXECUTE gw_prop(%s)", (value,))
        else:
            cur.execute(text)
        return [d.name for d in cur.description], cur.fetchall()


@hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                      HealthCheck.too_slow])
@given(before=_construct(), after=_construct(), value=_CONTENT)
def test_no_value_changes_the_statement(data_sessions, before, after, value):
    """Quoting constructs (standard and E'' strings with backslashes, dollar quotes with any
    tag, nested comments, quoted identifiers, U&'' with and without UESCAPE) around a
    placeholder: the reader finds :p only where PostgreSQL reads code, and no value changes
    the statement, on sessions whose defaults are standard_conforming_strings on or off."""
    sql = f"SELECT {before[1]}, :p AS v, {after[1]}"
    try:
        statement = read(sql)
    except GatewayError as error:
        assert error.status == 400
        return
    assert "unicode" not in (before[0], after[0]), "a U&'' string was read"
    # The reader found :p where PostgreSQL reads code, and only there.
    assert statement.order == ("p",)
    rendered = Template(paged(statement)).render([value, 1000, 0])
    pinned, off = data_sessions
    answers = []
    for conn in pinned:
        names, rows = _run(conn, rendered)
        assert len(rows) == 1 and names.count("v") == 1
        assert rows[0][names.index("v")] == value
        answers.append(rows)
        # And the same statement, prepared with the value sent as a parameter, agrees.
        assert _run(conn, statement.text, value, prepared=True)[1] == rows
    assert answers[0] == answers[1]
    # The prepared path's arguments (EXECUTE's, quoted by the driver) are data on a session
    # left at off, too. (Statement text is not: it is read as written only with the setting
    # on, which is why every data session pins it.)
    assert _run(off, "SELECT $1::text AS v", value, prepared=True)[1] == [(value,)]


@pytest.mark.parametrize("text", ["U&'d\\0061t\\+000061'", "U&'d!0061t!+000061' UESCAPE '!'",
                                  "u&'\\0027' || current_user", 'U&"d\\0061t"', "U&'x' UESCAPE '#'"])
def test_unicode_escapes_are_refused_around_a_placeholder(text):
    with pytest.raises(GatewayError) as info:
        read(f"SELECT {text}, :p AS v")
    assert info.value.code == "analysis_failed", info.value


@pytest.mark.parametrize("value", ["'", "\\", "$é$", "*/", "--", "'); DROP TABLE x; --", "\\'' OR 1=1 --"])
def test_a_value_that_would_break_out_is_still_only_data(value):
    statement = read("SELECT $é$ x $é$ AS a, :p AS v")
    text = Template(statement).render([value])
    assert text.endswith("'" + value.replace("'", "''") + "' AS v")


def test_a_tampered_rendering_is_refused():
    statement = read("SELECT :p AS v, :q AS w")
    template = Template(statement)
    template._pieces = ("SELECT ", " AS v, 1 AS w -- ", " AS w")   # as if quoting had gone wrong
    with pytest.raises(GatewayError) as info:
        template.render(["a", "b"])
    assert info.value.code == "param_invalid"


# --- hostile shapes answer 4xx ---------------------------------------------------------------
@pytest.mark.parametrize("sql", [
    "SELECT " + "(" * 500 + "1" + ")" * 500 + " AS x",
    "SELECT " + "ARRAY[" * 200 + "1" + "]" * 200 + " AS x",
    "SELECT " + "+".join(["1"] * 30000) + " AS x",
    "SELECT " + " ".join(["NOT"] * 20000) + " true AS x",
    "SELECT " + "CASE WHEN true THEN " * 3000 + "1" + " END" * 3000 + " AS x",
])
def test_deep_statements_are_refused_not_crashed(api, demo_connection, caplog, sql):
    secret = api.key([], [demo_connection])
    got = api.adhoc(secret, {"sql": sql, "connection_name": demo_connection})
    assert got.status == 400 and got.json["code"] in ("analysis_failed", "invalid_sql"), got
    saved = api.manage("POST", "/queries", {"name": unique("deep"), "connection_name": demo_connection,
                                            "sql": sql, "publish": True})
    assert saved.status == 400 and saved.json["code"] in ("analysis_failed", "invalid_sql"), saved
    assert all(len(record.getMessage()) < 8000 for record in caplog.records)


# --- every shape PostgreSQL's parser reads stays servable -------------------------------------
@pytest.mark.parametrize("sql, params, rows", [
    ("SELECT id FROM customers WHERE id IN (1, 2) ORDER BY id", {}, [{"id": 1}, {"id": 2}]),
    ("SELECT id FROM customers WHERE id IN (:a, :b) ORDER BY id", {"a": 2, "b": 3}, [{"id": 2}, {"id": 3}]),
    ("SELECT ARRAY[:a, 2] AS a, :t = ANY (ARRAY['x', 'it''s']) AS b", {"a": 1, "t": "it's"}, [{"a": [1, 2], "b": True}]),
])
def test_lists_and_arrays_are_served_on_every_path(api, demo_connection, sql, params, rows):
    """PostgreSQL 18's parser records where an IN list and an ARRAY[...] start and end: those
    positions move with the literals bound before them and with the paging wrapper, and are
    no part of the statement's shape (every such statement was refused as "not whole")."""
    secret = api.key([], [demo_connection])
    got = api.adhoc(secret, {"sql": sql, "params": params, "connection_name": demo_connection})
    assert got.status == 200 and got.json == rows, got
    got = api.adhoc(secret, {"sql": sql, "params": params, "connection_name": demo_connection,
                             "stream": True, "format": "ndjson"})
    assert got.status == 200 and [json.loads(line) for line in got.text.splitlines()] == rows, got
    declared = {name: {"type": "int" if isinstance(value, int) else "str"} for name, value in params.items()}
    name = unique("lists")
    saved = api.manage("POST", "/queries", {"name": name, "connection_name": demo_connection, "sql": sql,
                                            "parameters": declared, "publish": True})
    assert saved.status == 201, saved
    key = api.key([name], [])
    got = api.post(name, key, {"params": params})
    assert got.status == 200 and got.json == rows, got
    got = api.call(name, key, {**{k: str(v) for k, v in params.items()}, "stream": "true", "format": "ndjson"})
    assert got.status == 200 and [json.loads(line) for line in got.text.splitlines()] == rows, got


# Deep trees without brackets: PostgreSQL reads them, and every walk of the tree (the
# reader's, the binding's, sqlglot's) must answer 200 or 400, never a 500.
_DEEP = {
    "sum": lambda n: "SELECT " + "+".join(["1"] * n) + " AS x",
    "concat": lambda n: "SELECT " + " || ".join(["'a'"] * n) + " AS x",
    "casts": lambda n: "SELECT 1" + "::int" * n + " AS x",
    "collations": lambda n: "SELECT 'a'" + ' COLLATE "C"' * n + " AS x",
    "tests": lambda n: "SELECT true" + " IS NULL" * n + " AS x",
    "values": lambda n: "SELECT :p" + " || :p" * n + " AS x",
}


@pytest.mark.parametrize("size", [150, 300, 450, 1000])
@pytest.mark.parametrize("kind", sorted(_DEEP))
def test_deep_trees_answer_4xx_never_500(api, demo_connection, caplog, kind, size):
    sql = _DEEP[kind](size)
    params = {"p": "v"} if ":p" in sql else {}
    secret = api.key([], [demo_connection])
    for extra in ({}, {"stream": True, "format": "ndjson"}):
        got = api.adhoc(secret, {"sql": sql, "params": params, "connection_name": demo_connection,
                                 "page_size": 1, **extra})
        assert got.status == 200 or (got.status == 400 and got.json["code"] == "analysis_failed"), (extra, got)
    name = unique("deep")
    declared = {"p": {"type": "str"}} if params else {}
    saved = api.manage("POST", "/queries", {"name": name, "connection_name": demo_connection, "sql": sql,
                                            "parameters": declared, "publish": True})
    assert saved.status == 201 or (saved.status == 400 and saved.json["code"] == "analysis_failed"), saved
    if saved.status == 201:
        key = api.key([name], [])
        for extra in ({}, {"stream": "true", "format": "ndjson"}):
            got = api.call(name, key, {**params, "page_size": "1", **extra})
            assert got.status == 200 or (got.status == 400 and got.json["code"] == "query_failed"), (extra, got)
    assert all(len(record.getMessage()) < 8000 for record in caplog.records)


def test_a_database_in_another_encoding(api, superuser):
    """A LATIN1 database: values and statement text travel as UTF-8 (the session pins
    client_encoding), so a character the database cannot hold is the database's refusal
    (400 query_failed), never a 500 in the driver."""
    database = unique("latin").lower()
    superuser(f"CREATE DATABASE {database} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0",
              db="postgres")
    connection = api.connection(unique("latin"), database=database)
    secret = api.key([], [connection])
    for value, status in (("café", 200), ("€ Ω", 400)):
        for extra in ({}, {"stream": True, "format": "ndjson"}):
            got = api.adhoc(secret, {"sql": "SELECT :p AS v", "params": {"p": value}, "connection_name": connection,
                                     **extra})
            assert got.status == status, (value, extra, got)
            if status == 200:
                assert json.loads(got.text.splitlines()[0]) in ([{"v": value}], {"v": value}), got
            else:
                assert got.json["code"] == "query_failed" and got.json["sqlstate"] == "22P05", got
    got = api.adhoc(secret, {"sql": "SELECT 'Ω' AS v", "connection_name": connection})
    assert got.status == 400 and got.json["code"] == "query_failed", got
    ep = api.endpoint("SELECT :p AS v", {"p": {"type": "str"}}, connection=connection)
    for value, status in (("café", 200), ("€ Ω", 400)):
        for extra in ({}, {"stream": "true", "format": "ndjson"}):
            got = api.call(ep.query, ep.secret, {"p": value, **extra})
            assert got.status == status, (value, extra, got)
