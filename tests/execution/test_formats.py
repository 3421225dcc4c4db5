"""Output formats: JSON (a list of row objects), NDJSON, CSV, TSV, XML and YAML."""
from __future__ import annotations

import csv
import io
import json
from datetime import UTC, date, datetime
from xml.etree import ElementTree

import pytest
import yaml

from gateway.execution.formats import (
    render_csv,
    render_json,
    render_ndjson,
    render_tsv,
    render_xml,
    render_yaml,
    stream_chunks,
    unique_names,
)

ORDERS_SQL = ("SELECT id, amount, status, ordered_at, ordered_at::date AS day, amount > 100 AS big, "
              "NULL::text AS nothing FROM orders WHERE id <= :n ORDER BY id")
ORDERS_PARAMS = {"n": {"type": "int", "default": 3}}
# orders 1..3 of fleet.ops.local.demo: amount = round(((i * 7927) % 50000) / 100.0 + 4.99, 2),
# ordered_at = 2023-06-01 + i * 2h17m, status = (paid, paid, paid, shipped, ...)[i % 8]
EXPECTED = [
    {"id": 1, "amount": 84.26, "status": "paid", "ordered_at": "2023-06-01T02:17:00+00:00",
     "day": "2023-06-01", "big": False, "nothing": None},
    {"id": 2, "amount": 163.53, "status": "paid", "ordered_at": "2023-06-01T04:34:00+00:00",
     "day": "2023-06-01", "big": True, "nothing": None},
    {"id": 3, "amount": 242.8, "status": "shipped", "ordered_at": "2023-06-01T06:51:00+00:00",
     "day": "2023-06-01", "big": True, "nothing": None},
]


def test_unique_names():
    assert unique_names(["id", "name", "id", "id"]) == ["id", "name", "id_2", "id_3"]
    assert unique_names([]) == []


def test_renderers():
    columns = ("a", "b", "c")
    rows = [(1, date(2024, 1, 2), True), (None, datetime(2024, 1, 2, 3, 4, tzinfo=UTC), False)]
    assert json.loads(render_json(columns, rows)) == [
        {"a": 1, "b": "2024-01-02", "c": True}, {"a": None, "b": "2024-01-02T03:04:00+00:00", "c": False}]
    assert render_ndjson(columns, []) == b""
    assert [json.loads(x) for x in render_ndjson(columns, rows).splitlines()] == json.loads(render_json(columns, rows))
    assert render_csv(columns, rows).decode() == \
        "a,b,c\n1,2024-01-02,true\n,2024-01-02T03:04:00+00:00,false\n"
    assert render_csv(("j",), [({"k": [1, "a,b"]},)]).decode() == 'j\n"{""k"":[1,""a,b""]}"\n'
    # bytes (no data session makes them any more: bytea arrives as its \x hex text) as PostgreSQL writes bytea
    assert json.loads(render_json(("raw",), [(b"\xff\x01",)])) == [{"raw": "\\xff01"}]


def test_stream_chunks_write_the_header_once():
    batches = iter([[(1,), (2,)], [(3,)]])
    assert b"".join(stream_chunks("csv", ("n",), batches)) == b"n\n1\n2\n3\n"
    assert b"".join(stream_chunks("ndjson", ("n",), iter([[(1,)], [(2,)]]))) == b'{"n":1}\n{"n":2}\n'
    assert b"".join(stream_chunks("csv", ("n",), iter([]))) == b"n\n"


def test_json(api, endpoint):
    ep = endpoint(ORDERS_SQL, ORDERS_PARAMS)
    got = api.call(ep.query, ep.secret)
    assert got.status == 200, got
    assert got.headers["Content-Type"] == "application/json"
    assert got.json == EXPECTED
    assert all(isinstance(row["amount"], float) for row in got.json)  # NUMERIC as a JSON number (its exact text)


def test_ndjson(api, endpoint):
    ep = endpoint(ORDERS_SQL, ORDERS_PARAMS)
    got = api.call(ep.query, ep.secret, {"format": "ndjson"})
    assert got.status == 200, got
    assert got.headers["Content-Type"] == "application/x-ndjson"
    assert got.text.endswith("\n")
    assert [json.loads(line) for line in got.text.splitlines()] == EXPECTED


def test_csv(api, endpoint):
    ep = endpoint(ORDERS_SQL, ORDERS_PARAMS)
    got = api.call(ep.query, ep.secret, {"format": "csv"})
    assert got.status == 200, got
    assert got.headers["Content-Type"] == "text/csv; charset=utf-8"
    rows = list(csv.reader(io.StringIO(got.text)))
    assert rows[0] == list(EXPECTED[0])
    assert rows[1] == ["1", "84.26", "paid", "2023-06-01T02:17:00+00:00", "2023-06-01", "false", ""]
    assert len(rows) == 4


def test_format_in_post_body_and_case(api, endpoint):
    ep = endpoint(ORDERS_SQL, ORDERS_PARAMS)
    got = api.post(ep.query, ep.secret, {"params": {"n": 1}, "format": "csv"})
    assert got.status == 200 and got.headers["Content-Type"].startswith("text/csv")
    assert got.text.splitlines()[1].startswith("1,84.26,paid")
    upper = api.call(ep.query, ep.secret, {"format": "NDJSON", "n": "1"})
    assert upper.status == 200 and json.loads(upper.text) == EXPECTED[0]


@pytest.mark.parametrize("fmt", ["xlsx", "", "json,csv"])
def test_unknown_format(api, endpoint, fmt):
    ep = endpoint(ORDERS_SQL, ORDERS_PARAMS)
    got = api.call(ep.query, ep.secret, query_string=f"format={fmt}")
    if fmt == "":
        assert got.status == 200  # empty means the default
    else:
        assert got.status == 400 and got.json["code"] == "invalid_format", got


def test_empty_result(api, endpoint):
    ep = endpoint(ORDERS_SQL, ORDERS_PARAMS)
    assert api.call(ep.query, ep.secret, {"n": "0"}).json == []
    assert api.call(ep.query, ep.secret, {"n": "0", "format": "ndjson"}).content == b""
    assert api.call(ep.query, ep.secret, {"n": "0", "format": "csv"}).text == \
        "id,amount,status,ordered_at,day,big,nothing\n"


@pytest.mark.parametrize("fmt, stream", [("json", "false"), ("ndjson", "false"), ("csv", "false"),
                                         ("ndjson", "true"), ("csv", "true")])
def test_duplicate_column_names_are_kept(api, endpoint, fmt, stream):
    ep = endpoint("SELECT c.id, o.id, c.id FROM customers c JOIN orders o ON o.customer_id = c.id "
                  "WHERE o.id = 1")
    got = api.call(ep.query, ep.secret, {"format": fmt, "stream": stream})
    assert got.status == 200, got
    # order 1 belongs to customer (1 * 7919) % 1000 + 1 = 920
    if fmt == "csv":
        assert got.text == "id,id_2,id_3\n920,1,920\n"
    else:
        rows = got.json if fmt == "json" else [json.loads(x) for x in got.text.splitlines()]
        assert rows == [{"id": 920, "id_2": 1, "id_3": 920}]


def test_tsv_xml_and_yaml_renderers():
    """QueryAPIGate's shapes: TSV quoted as CSV where needed; XML ``<data><item>`` with column names made
    element names and NULL empty (marked ``null="true"``, so that it differs from an empty string); YAML a block list of mappings in column order; timestamps ISO 8601."""
    columns = ("a", "b c", "1d")
    rows = [(1, "x\ty", None), (2.5, datetime(2024, 1, 2, 3, 4, tzinfo=UTC), True)]
    assert render_tsv(columns, rows).decode() == 'a\tb c\t1d\n1\t"x\ty"\t\n2.5\t2024-01-02T03:04:00+00:00\ttrue\n'
    assert render_xml(columns, rows).decode() == (
        "<data><item><a>1</a><b_c>x\ty</b_c><_1d null=\"true\" /></item>"
        "<item><a>2.5</a><b_c>2024-01-02T03:04:00+00:00</b_c><_1d>True</_1d></item></data>")
    assert render_xml(("x",), [("<&>",)]).decode() == "<data><item><x>&lt;&amp;&gt;</x></item></data>"
    assert render_yaml(columns, rows).decode() == (
        "- a: 1\n  b c: \"x\\ty\"\n  1d: null\n- a: 2.5\n  b c: '2024-01-02T03:04:00+00:00'\n  1d: true\n")
    assert render_yaml(columns, []).decode() == "[]\n"


def test_xml_and_yaml_over_http(api, endpoint):
    ep = endpoint(ORDERS_SQL, ORDERS_PARAMS)
    got = api.call(ep.query, ep.secret, {"format": "yaml"})
    assert got.status == 200 and got.headers["Content-Type"].startswith("application/x-yaml"), got
    assert yaml.safe_load(got.text) == EXPECTED
    got = api.call(ep.query, ep.secret, {"format": "xml", "n": "1"})
    assert got.status == 200 and got.headers["Content-Type"].startswith("application/xml"), got
    item = ElementTree.fromstring(got.text)[0]
    assert {c.tag: c.text for c in item} == {"id": "1", "amount": "84.26", "status": "paid",
                                             "ordered_at": "2023-06-01T02:17:00+00:00", "day": "2023-06-01",
                                             "big": "False", "nothing": None}
    streamed = api.call(ep.query, ep.secret, {"format": "xml", "stream": "true"})
    assert streamed.status == 400 and streamed.json["code"] == "invalid_stream"
