"""Every value exact, in every format (issue 25, part 3).

A table of built-in PostgreSQL types with their edge values is answered by a saved query
through every format (json, ndjson, csv, tsv, xml, yaml) and through streams (ndjson, csv,
tsv), read back, and compared with PostgreSQL's own rendering of the same value, computed by
the server on another session: ``to_json(v)`` (the ISO 8601 form of dates and times, numbers as
number tokens, ``NaN`` as a string) and ``v::text``. The "Values" table of docs/formats.md is
the table these tests prove.
"""
from __future__ import annotations

import base64
import csv
import http.client
import io
import json
import socket
from urllib.parse import urlsplit
from xml.etree import ElementTree

import falcon.testing
import psycopg2.extensions
import pytest
import yaml

from gateway.errors import GatewayError
from gateway.execution import values
from gateway.execution.formats import render_csv, render_xml

# (type, [literals]): each literal is cast to the type; NULL is added to every type.
CASES: list[tuple[str, list[str]]] = [
    ("numeric", ["1234567890123456789012345.678901234567890", "9007199254740993", "NaN", "Infinity", "-Infinity",
                 "-0.000", "242.80", "0.0000000000000000000000000000000000001"]),
    ("float8", ["NaN", "Infinity", "-Infinity", "-0", "1e308", "5e-324", "2.2250738585072014e-308", "0.1", "1e15",
                "123456789012345680"]),
    ("float4", ["1.1", "NaN", "-Infinity", "3.4028235e+38", "-0"]),
    ("int8", ["-9223372036854775808", "9223372036854775807"]),
    ("int2", ["-32768", "32767"]),
    ("int4", ["-2147483648"]),
    ("bool", ["true", "false"]),
    ("bytea", ["\\x00ff", "\\x", "\\xdeadbeef"]),
    ("date", ["2023-06-01", "infinity", "-infinity", "4713-01-01 BC", "0001-01-01", "10000-01-01", "5874897-12-31"]),
    ("timestamp", ["2023-06-01 02:17:00.5", "294276-12-31 23:59:59.999999", "4713-01-01 00:00 BC", "infinity",
                   "-infinity", "10000-01-01", "2023-06-01 00:00:00.000001"]),
    ("timestamptz", ["2023-06-01 02:17:00.5+00", "1850-01-01 00:00+00", "4713-01-01 00:00+00 BC", "infinity",
                     "-infinity", "10000-01-01 00:00+00", "294276-12-31 23:59:59.999999+00"]),
    ("time", ["24:00", "00:00", "23:59:59.999999", "12:34:56.5"]),
    ("timetz", ["24:00-15:59", "00:00+15:59", "12:00+05:30"]),
    ("interval", ["1 mon -2 days 03:00:00.5", "-178000000 years", "-00:00:01", "P1Y2M", "0"]),
    ("uuid", ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]),
    ("inet", ["::1", "192.168.0.1/24"]),
    ("cidr", ["10.0.0.0/8", "2001:db8::/32"]),
    ("macaddr", ["08:00:2b:01:02:03"]),
    ("macaddr8", ["08:00:2b:01:02:03:04:05"]),
    ("bit(4)", ["1010"]),
    ("varbit", ["", "101"]),
    ("money", ["-12.50", "92233720368547758.07", "-92233720368547758.08"]),
    ("json", ['{"a": 1e400, "a": 2}', "[1e308, 1.0e-400, -0, 1180591620717411303424]", '"=cmd"',
              '{"s": "\\u0000\\u0001"}', "null", "  [1,\n 2]  "]),
    ("jsonb", ['{"big": 1180591620717411303424, "tiny": 1.0e-400, "neg0": -0, "huge": 1e400, "near": 1.7e308}',
               "123.4500", '"-1 days"', "[]"]),
    ("xml", ["<a>x &amp; y</a>", "plain text"]),
    ("int4[]", ["{{1,NULL},{3,4}}", "[2:3]={1,2}", "{}"]),
    ("text[]", ['{"a,b",NULL,"=x","\\"q\\""}']),
    ("numeric[]", ["{1.50,NaN,-Infinity,9007199254740993}"]),
    ("float8[]", ["{-0,Infinity,1e308}"]),
    ("timestamptz[]", ['{infinity,"2023-06-01 00:00+00","4713-01-01 00:00+00 BC"}']),
    ("date[]", ['{"4713-01-01 BC",infinity}']),
    ("time[]", ["{24:00}"]),
    ("bytea[]", ['{"\\\\x00ff",NULL}']),
    ("jsonb[]", ['{"{\\"a\\": 1e400}","[1, 2]"}']),
    ("interval[]", ['{"1 mon","-1 days"}']),
    ("int4range", ["[1,5)", "empty"]),
    ("numrange", ["(,1.50]"]),
    ("tstzrange", ["[2023-06-01 00:00+00,infinity)"]),
    ("daterange", ["[4713-01-01 BC,2023-01-01)"]),
    ("int4multirange", ["{[1,3),[5,7)}", "{}"]),
    ("tsvector", ["a:1 b:2"]),
    ("tsquery", ["!a & b"]),
    ("point", ["(1,-2)"]),
    ("line", ["{1,2,3}"]),
    ("lseg", ["[(1,2),(3,4)]"]),
    ("box", ["(3,4),(1,2)"]),
    ("path", ["[(1,2),(3,4)]"]),
    ("polygon", ["((1,2),(3,4),(5,0))"]),
    ("circle", ["<(1,2),3>"]),
    ("text", ["\x01\x1f\x7f", "\ufffe\uffff", "a\rb\r\nc", "=1+2", "@SUM(A1)", "-2+3", "+1", "\tx", "\rx", "",
              "é 漢 😀", "<&>"]),
    ("gw_mood", ["=happy", "sad"]),          # an enum (created below)
    ("gw_exact", ["12345678901234567890.12345678901234567890", "NaN"]),   # a domain over numeric
    ("gw_pair", ["(1,\"a b\")", "(,)"]),        # a composite type
]
TEXT_TYPES = {"text", "gw_mood", "xml"}       # what the formula guard looks at
BOUNDED = {"[2:3]={1,2}"}                     # arrays with bounds other than 1: PostgreSQL's text


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _values_sql(pg_type: str, literals: list[str]) -> str:
    rows = [f"({i}, {_literal(lit)}::{pg_type})" for i, lit in enumerate(literals, 1)]
    rows.append(f"({len(literals) + 1}, NULL::{pg_type})")
    return f"SELECT n, v FROM (VALUES {', '.join(rows)}) AS t(n, v) ORDER BY n"


class Token(str):
    """A JSON number as its text (read back without a float on the way)."""


def _exact_json(text: str):
    return json.loads(text, parse_float=Token, parse_int=Token)


@pytest.fixture(scope="module")
def types(superuser):
    """The enum, domain and composite of the table, in the demo database."""
    for statement in ("DROP TYPE IF EXISTS gw_mood CASCADE", "CREATE TYPE gw_mood AS ENUM ('=happy', 'sad')",
                      "DROP DOMAIN IF EXISTS gw_exact CASCADE", "CREATE DOMAIN gw_exact AS numeric",
                      "DROP TYPE IF EXISTS gw_pair CASCADE", "CREATE TYPE gw_pair AS (n int, s text)"):
        superuser(statement, db="demo")
    return True


def _expected(superuser, sql: str) -> list[dict]:
    """For each row: PostgreSQL's own renderings of v, from another session."""
    rows = superuser(f"SELECT n, v::text, to_json(v)::text, pg_typeof(v)::text, "
                     f"(SELECT typtype::text || typcategory::text FROM pg_type WHERE oid = pg_typeof(v)) "
                     f"FROM ({sql}) AS s ORDER BY n", db="demo")
    out = []
    for n, text, as_json, type_name, kind in rows:
        out.append({"n": n, "text": text, "json": as_json, "type": type_name, "composite": kind[0] == "c",
                    "array": kind[1] == "A", "jsonish": type_name in ("json", "jsonb"),
                    "domain_text": type_name})
    return out


def _json_expectation(e: dict):
    """What the JSON answer holds for a value: PostgreSQL's to_json, except a composite and an
    array with bounds, which are their text (to_json makes an object of one and drops the
    bounds of the other)."""
    if e["text"] is None:
        return None
    if e["composite"] or e["text"] in BOUNDED:
        return e["text"]
    return _exact_json(e["json"])


def _cell_expectation(e: dict, guard: bool, true_word: str = "true", false_word: str = "false"):
    """A CSV/TSV/XML cell: the value's text as to_json writes a scalar (dates and times in ISO
    8601), a document or composite as its text; arrays are checked as JSON (None here)."""
    if e["text"] is None:
        return ""
    if e["array"] and e["text"] not in BOUNDED:
        return None
    if e["jsonish"] or e["composite"] or e["text"] in BOUNDED:
        text = e["text"]
    else:
        scalar = _exact_json(e["json"])
        text = true_word if scalar is True else false_word if scalar is False else str(scalar)
    if guard and e["type"] in TEXT_TYPES and text[:1] in ("=", "+", "-", "@", "\t", "\r"):
        text = "'" + text
    return text


def _rows_of_csv(text: str, delimiter: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline=""), delimiter=delimiter))


def _xml_cells(body: bytes) -> list[dict]:
    root = ElementTree.fromstring(body)   # a real XML parser: it refuses what is not well-formed
    rows = []
    for item in root:
        row = {}
        for cell in item:
            if cell.get("null") == "true":
                row[cell.tag] = None
            elif cell.get("encoding") == "base64":
                row[cell.tag] = base64.b64decode(cell.text or "").decode("utf-8", "surrogatepass")
            else:
                row[cell.tag] = cell.text or ""
        rows.append(row)
    return rows


def _yaml_text(value):
    """An expectation as yaml.BaseLoader reads the answer back (every scalar its text)."""
    if isinstance(value, dict):
        return {k: _yaml_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_yaml_text(v) for v in value]
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    return str(value)


def _yaml_expectation(e: dict):
    """YAML: as JSON, except a json document with a key twice (a YAML mapping cannot hold it),
    which is its text."""
    if e["type"] == "json" and e["text"] is not None:
        try:
            json.loads(e["text"], object_pairs_hook=_unique_keys)
        except ValueError:
            return e["text"]
    return _yaml_text(_json_expectation(e))


def _unique_keys(pairs):
    if len({k for k, _ in pairs}) != len(pairs):
        raise ValueError("a key twice")
    return dict(pairs)


def _check_json_array(cell: str, e: dict) -> None:
    assert _exact_json(cell) == _exact_json(e["json"]), (cell, e)


@pytest.mark.parametrize("pg_type, literals", CASES, ids=[c[0] for c in CASES])
def test_every_value_is_exact_in_every_format(api, endpoint, superuser, types, pg_type, literals):
    sql = _values_sql(pg_type, literals)
    expected = _expected(superuser, sql)
    ep = endpoint(sql)
    page = {"page_size": "1000"}

    got = api.call(ep.query, ep.secret, page)
    assert got.status == 200, got
    rows = _exact_json(got.text)
    assert [r["v"] for r in rows] == [_json_expectation(e) for e in expected], got.text

    ndjson = api.call(ep.query, ep.secret, {**page, "format": "ndjson"})
    assert ndjson.status == 200 and [_exact_json(line)["v"] for line in ndjson.text.splitlines()] == \
        [r["v"] for r in rows]

    for fmt, delimiter in (("csv", ","), ("tsv", "\t")):
        reply = api.call(ep.query, ep.secret, {**page, "format": fmt})
        assert reply.status == 200, reply
        cells = [r[1] for r in _rows_of_csv(reply.text, delimiter)[1:]]
        assert len(cells) == len(expected)
        for cell, e in zip(cells, expected, strict=True):
            want = _cell_expectation(e, guard=True)
            if want is None:
                _check_json_array(cell, e)
            else:
                assert cell == want, (fmt, e)

    xml = api.call(ep.query, ep.secret, {**page, "format": "xml"})
    assert xml.status == 200, xml
    for cell, e in zip([r["v"] for r in _xml_cells(xml.content)], expected, strict=True):
        if e["text"] is None:
            assert cell is None
            continue
        want = _cell_expectation(e, guard=False, true_word="True", false_word="False")
        if want is None:
            _check_json_array(cell, e)
        else:
            assert cell == want, ("xml", e)

    reply = api.call(ep.query, ep.secret, {**page, "format": "yaml"})
    assert reply.status == 200, reply
    as_text = yaml.load(reply.text, Loader=yaml.BaseLoader)   # noqa: S506  (BaseLoader builds only str/list/dict)
    assert [r["v"] for r in as_text] == [_yaml_expectation(e) for e in expected], reply.text
    typed = yaml.safe_load(reply.text)
    assert [r["v"] is None for r in typed] == [e["text"] is None or (e["jsonish"] and e["text"] == "null")
                                               for e in expected]

    # Streams: the same bytes as the page.
    for fmt in ("ndjson", "csv", "tsv"):
        streamed = api.call(ep.query, ep.secret, {"format": fmt, "stream": "true"})
        whole = api.call(ep.query, ep.secret, {**page, "format": fmt})
        assert streamed.status == 200 and streamed.content == whole.content, (fmt, streamed, whole)


# --- the reproductions of the issue (each failed before: a 500, or a value changed) ----------------
def _one(api, endpoint, sql: str, fmt: str = "json"):
    ep = endpoint(sql)
    got = api.call(ep.query, ep.secret, {"format": fmt})
    assert got.status == 200, got
    return got


def test_numeric_is_not_a_float(api, endpoint):
    assert _one(api, endpoint, "SELECT 9007199254740993::numeric AS v").text == '[{"v":9007199254740993}]'
    assert _one(api, endpoint, "SELECT 1234567890123456789012345.678901234567890::numeric AS v").text == \
        '[{"v":1234567890123456789012345.678901234567890}]'


def test_numeric_nan_is_not_null(api, endpoint):
    assert _one(api, endpoint, "SELECT 'NaN'::numeric AS v, NULL::numeric AS w").json == [{"v": "NaN", "w": None}]
    assert _one(api, endpoint, "SELECT 'Infinity'::float8 AS v, '-Infinity'::numeric AS w").json == \
        [{"v": "Infinity", "w": "-Infinity"}]


def test_bytea_is_hex(api, endpoint):
    assert _one(api, endpoint, "SELECT '\\x00ff'::bytea AS v").json == [{"v": "\\x00ff"}]


def test_infinity_is_the_word(api, endpoint):
    assert _one(api, endpoint, "SELECT 'infinity'::date AS d, 'infinity'::timestamp AS t, "
                               "'-infinity'::timestamptz AS z").json == \
        [{"d": "infinity", "t": "infinity", "z": "-infinity"}]


def test_midnight_at_the_end_of_the_day(api, endpoint):
    assert _one(api, endpoint, "SELECT '24:00'::time AS v").json == [{"v": "24:00:00"}]


def test_values_that_answered_500(api, endpoint):
    got = _one(api, endpoint, "SELECT '1e308'::jsonb AS a, '1180591620717411303424'::jsonb AS b, "
                              "'12:00+05:30'::timetz AS c, '0044-03-15 BC'::date AS d, '10000-01-01'::date AS e, "
                              "'[2:3]={1,2}'::int[] AS f")
    doc = _exact_json(got.text)[0]
    assert doc["a"] == "1" + "0" * 308 and doc["b"] == "1180591620717411303424"
    assert (doc["c"], doc["d"], doc["e"], doc["f"]) == ("12:00:00+05:30", "0044-03-15 BC", "10000-01-01", "[2:3]={1,2}")


def test_one_odd_row_no_longer_breaks_a_page_or_a_stream(api, endpoint):
    """3,001 rows, one of them out of the range Python's dates have: the page answers, and
    the stream carries every line."""
    ep = endpoint("SELECT g, CASE WHEN g = 2500 THEN '0044-03-15 BC'::date ELSE '2023-06-01'::date END AS d "
                  "FROM generate_series(1, 3001) g ORDER BY g")
    page = api.call(ep.query, ep.secret, {"page": "3", "page_size": "1000"})
    assert page.status == 200 and page.json[499] == {"g": 2500, "d": "0044-03-15 BC"}
    streamed = api.call(ep.query, ep.secret, {"format": "ndjson", "stream": "true"})
    assert streamed.status == 200 and len(streamed.text.splitlines()) == 3001


def test_xml_is_well_formed_whatever_the_text(api, endpoint):
    got = _one(api, endpoint, "SELECT E'a\\x01b' AS c, E'\\uFFFE' AS f, E'x\\ry' AS r, '' AS e, NULL::text AS n",
               fmt="xml")
    assert _xml_cells(got.content) == [{"c": "a\x01b", "f": "\ufffe", "r": "x\ry", "e": "", "n": None}]


def test_xml_escapes_what_xml_1_0_cannot_carry():
    body = render_xml(("v",), [("\x00",), ("\ud800",), ("\x08",), ("ok & <fine>",)])
    assert [r["v"] for r in _xml_cells(body)] == ["\x00", "\ud800", "\x08", "ok & <fine>"]


@pytest.mark.parametrize("fmt, delimiter", [("csv", ","), ("tsv", "\t")])
def test_csv_formulas_are_neutralised_but_not_numbers(api, endpoint, fmt, delimiter):
    got = _one(api, endpoint, "SELECT '=HYPERLINK(\"http://x\")' AS a, '+1' AS b, '-2+3' AS c, '@SUM(A1)' AS d, "
                              "-5 AS e, (-5.5)::numeric AS f, '-infinity'::date AS g, '-1 days'::interval AS h, "
                              "(-1)::money AS i, 'plain' AS j", fmt=fmt)
    assert _rows_of_csv(got.text, delimiter)[1] == [
        "'=HYPERLINK(\"http://x\")", "'+1", "'-2+3", "'@SUM(A1)", "-5", "-5.5", "-infinity", "-1 days", "-$1.00",
        "plain"]


def test_the_formula_guard_is_a_setting(make_app, endpoint, services):
    from helpers.api import Api
    ep = endpoint("SELECT '=1+2' AS a")
    client = falcon.testing.TestClient(make_app(csv_formula_guard=False))
    got = Api.in_process(client, services).call(ep.query, ep.secret, {"format": "csv"})
    assert got.text == "a\n=1+2\n"
    assert render_csv(("=x",), [("=y",)]).decode() == "'=x\n'=y\n"


# --- what cannot be rendered anyway --------------------------------------------------------------
@pytest.fixture
def unrenderable(monkeypatch):
    """Data sessions whose int4 values are objects no format renders (no PostgreSQL value is
    any more: this stands for a gap in the rendering table)."""
    bad = psycopg2.extensions.new_type((23,), "GW_TEST_UNRENDERABLE",
                                       lambda text, cur: None if text is None else object())
    monkeypatch.setattr(values, "CASTERS", (*values.CASTERS, bad))


def test_a_page_that_cannot_be_rendered_is_a_typed_error(unrenderable, make_app, endpoint, services):
    from helpers.api import Api
    ep = endpoint("SELECT 1 AS v")
    api = Api.in_process(falcon.testing.TestClient(make_app()), services)
    for fmt in ("json", "csv", "xml", "yaml"):
        got = api.call(ep.query, ep.secret, {"format": fmt})
        assert got.status == 502 and got.json["code"] == "value_unrenderable", got


def test_a_stream_that_cannot_render_a_batch_is_cut(unrenderable, make_app, endpoint, services):
    from helpers.api import Api
    ep = endpoint("SELECT g::int8 AS g, CASE WHEN g > 2500 THEN 1 END AS v FROM generate_series(1, 3001) g")
    api = Api.in_process(falcon.testing.TestClient(make_app()), services)
    with pytest.raises(GatewayError) as cut:
        api.call(ep.query, ep.secret, {"format": "ndjson", "stream": "true"})
    assert cut.value.code == "value_unrenderable"


def _raw_get(base: str, path: str, secret: str) -> tuple[int, bytes, bool]:
    """A GET over a raw socket: (status, the chunked body as sent, whether it ended with the
    terminating zero-length chunk)."""
    url = urlsplit(base)
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nX-API-Key: {secret}\r\n\r\n".encode())
        data = b""
        while True:
            try:
                part = sock.recv(1 << 16)
            except (ConnectionResetError, TimeoutError):
                break
            if not part:
                break
            data += part
            if data.endswith(b"\r\n0\r\n\r\n"):
                break
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"transfer-encoding: chunked" in head.lower(), head
    return status, body, body.endswith(b"\r\n0\r\n\r\n") or body == b"0\r\n\r\n"


def test_a_stream_cut_midway_has_no_clean_end_on_the_wire(gunicorn, http_endpoint):
    """A stream that fails after rows went out ends without the terminating chunk: a client
    cannot take it for a whole answer. A whole one ends with it."""
    cut = http_endpoint("SELECT g, 1 / (2500 - g) AS q FROM generate_series(1, 3001) g")
    status, body, clean = _raw_get(gunicorn.base, f"/q/{cut.query}?format=ndjson&stream=true", cut.secret)
    assert status == 200 and b'"g":1,' in body and not clean
    whole = http_endpoint("SELECT g, '0044-03-15 BC'::date AS d FROM generate_series(1, 3001) g")
    status, body, clean = _raw_get(gunicorn.base, f"/q/{whole.query}?format=ndjson&stream=true", whole.secret)
    assert status == 200 and clean and body.count(b"0044-03-15 BC") == 3001
    # http.client, as a client library reads it: the cut one raises, the whole one does not.
    url = urlsplit(gunicorn.base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.request("GET", f"/q/{cut.query}?format=ndjson&stream=true", headers={"X-API-Key": cut.secret})
    with pytest.raises(http.client.IncompleteRead):
        conn.getresponse().read()
    conn.close()


def test_cached_rows_keep_their_marks():
    """The cache's Redis form reads the marked values back (its unpickler allows them)."""
    from gateway.cache.entry import decode_rows, encode_rows
    row = (values.Number("1.50"), values.Json('{"a": 1}'), values.Rendered("infinity"), "text")
    _, rows, _ = decode_rows(encode_rows(("a", "b", "c", "d"), [row], 1))
    assert [type(v) for v in rows[0]] == [values.Number, values.Json, values.Rendered, str] and rows[0] == row


def test_every_array_caster_keeps_bounds():
    """Each array type psycopg2 knows is read with the bounds rule (no 'array does not start
    with {' error)."""
    registered = {oid for caster in values.CASTERS for oid in caster.values if caster.name.endswith("_BOUNDED")}
    known = {oid for oid, c in psycopg2.extensions.string_types.items() if c.name.endswith("ARRAY")}
    assert known <= registered

