"""Typed parameters: parsing from text and JSON, constraints, and the 400 a caller sees."""
from __future__ import annotations

import math
import re
from datetime import date, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from gateway.errors import GatewayError
from gateway.model.params import INT_MAX, INT_MIN, TYPES, ParamBinder, ParamError, ParamSpec, compile_specs


def spec(kind="str", **fields) -> ParamSpec:
    return ParamSpec("p", {"type": kind, **fields})


def refused(kind, raw, via="text", **fields) -> str:
    s = spec(kind, **fields)
    with pytest.raises(ParamError) as info:
        s.coerce_text(raw) if via == "text" else s.coerce_json(raw)
    return str(info.value)


# --- each type, from text ------------------------------------------------------------------
@pytest.mark.parametrize("kind, raw, expected", [
    ("int", "-12", -12), ("int", "+5", 5), ("int", "0", 0), ("int", "007", 7),
    ("int", str(INT_MAX), INT_MAX), ("int", str(INT_MIN), INT_MIN),
    ("float", "1.5", 1.5), ("float", "-2", -2.0), ("float", "1e3", 1000.0), ("float", ".5", 0.5),
    ("str", "", ""), ("str", " spaced ", " spaced "), ("str", "héllo ☃", "héllo ☃"),
    ("bool", "true", True), ("bool", "TRUE", True), ("bool", "1", True), ("bool", "yes", True),
    ("bool", "on", True), ("bool", "false", False), ("bool", "0", False), ("bool", "No", False),
    ("bool", "off", False),
    ("date", "2024-02-29", date(2024, 2, 29)),
    ("datetime", "2024-01-02T03:04:05", datetime(2024, 1, 2, 3, 4, 5)),
    ("datetime", "2024-01-02 03:04:05+02:00",
     datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2)))),
])
def test_from_text(kind, raw, expected):
    value = spec(kind).coerce_text(raw)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("kind, raw", [
    ("int", "1_000"), ("int", "0x1f"), ("int", " 7"), ("int", "7 "), ("int", "1.0"), ("int", "1e3"),
    ("int", "abc"), ("int", "true"), ("int", "--1"), ("int", "٣"), ("int", "9223372036854775808"),
    ("int", "-9223372036854775809"), ("int", "99999999999999999999"),
    ("float", "nan"), ("float", "NaN"), ("float", "inf"), ("float", "-inf"), ("float", "Infinity"),
    ("float", "1_0"), ("float", " 1.5"), ("float", "1.5 "), ("float", "abc"), ("float", "1e999"),
    ("bool", "maybe"), ("bool", "2"), ("bool", "t"),
    ("date", "2023-02-29"), ("date", "2024/01/01"), ("date", "tomorrow"),
    ("datetime", "yesterday"), ("datetime", "2024-13-01T00:00:00"),
    ("str", "a\x00b"),
])
def test_from_text_is_strict(kind, raw):
    refused(kind, raw)


# --- each type, from JSON ------------------------------------------------------------------
@pytest.mark.parametrize("kind, value, expected", [
    ("int", 5, 5), ("int", -5, -5), ("int", 3.0, 3), ("int", "12", 12),
    ("float", 1, 1.0), ("float", 2.5, 2.5), ("float", "2.5", 2.5),
    ("bool", True, True), ("bool", False, False), ("bool", "false", False),
    ("str", "x", "x"),
    ("date", "2024-01-31", date(2024, 1, 31)),
    ("datetime", "2024-01-31T10:00:00", datetime(2024, 1, 31, 10)),
])
def test_from_json(kind, value, expected):
    result = spec(kind).coerce_json(value)
    assert result == expected and type(result) is type(expected)


@pytest.mark.parametrize("kind, value", [
    ("int", True), ("int", False), ("int", 1.5), ("int", "0x1f"), ("int", "1_000"), ("int", [1]),
    ("int", {"a": 1}), ("int", 2 ** 63), ("int", float("inf")), ("int", float("nan")),
    ("float", True), ("float", float("nan")), ("float", float("inf")), ("float", "nan"), ("float", [1.0]),
    ("bool", 1), ("bool", 0), ("bool", "maybe"),
    ("str", 5), ("str", True), ("str", ["a"]), ("str", "a\x00"),
    ("date", 20240101), ("date", "2024-02-30"), ("datetime", 1700000000),
])
def test_from_json_is_strict(kind, value):
    refused(kind, value, via="json")


# --- constraints ---------------------------------------------------------------------------
def test_enum():
    s = spec("str", enum=["paid", "shipped"])
    assert s.coerce_text("paid") == "paid"
    assert "must be one of paid, shipped" in refused("str", "PAID", enum=["paid", "shipped"])
    assert spec("int", enum=[1, 2]).coerce_text("2") == 2
    refused("int", "3", enum=[1, 2])


def test_min_max():
    assert spec("int", min=1, max=10).coerce_text("10") == 10
    assert refused("int", "0", min=1, max=10) == "must be >= 1"
    assert refused("int", "11", min=1, max=10) == "must be <= 10"
    assert spec("float", min=0.5).coerce_json(0.5) == 0.5
    refused("float", 0.49, via="json", min=0.5)


def test_lengths_and_pattern():
    assert spec("str", min_length=2, max_length=3).coerce_text("abc") == "abc"
    assert refused("str", "a", min_length=2) == "must be at least 2 characters"
    assert refused("str", "abcd", max_length=3) == "must be at most 3 characters"
    s = spec("str", pattern=r"[A-Z]{2}")
    assert s.coerce_text("US") == "US"
    refused("str", "USA", pattern=r"[A-Z]{2}")  # the whole value must match
    refused("str", "us", pattern=r"[A-Z]{2}")


def test_text_too_long():
    assert refused("str", "x" * 65_537) == "is too long"


def test_binder_required_default_unknown_and_repeated():
    binder = ParamBinder(compile_specs({
        "n": {"type": "int", "required": True},
        "plan": {"type": "str", "enum": ["free", "pro"], "default": "free"},
        "since": {"type": "date", "required": False},   # optional without a default: said so
    }))
    assert binder.bind({"n": "3"}, from_text=True) == (3, "free", None)
    assert binder.bind({"n": 3, "plan": "pro", "since": "2024-01-01"}, from_text=False) == \
        (3, "pro", date(2024, 1, 1))
    # An empty text value of a non-str type counts as missing.
    assert binder.bind({"n": "1", "since": ""}, from_text=True) == (1, "free", None)

    with pytest.raises(GatewayError) as info:
        binder.bind({}, from_text=True)
    assert (info.value.status, info.value.code) == (400, "param_required")
    assert info.value.extra == {"errors": {"n": "is required"}}

    with pytest.raises(GatewayError) as info:
        binder.bind({"plan": "gold", "extra": "1"}, from_text=True)
    assert info.value.code == "param_invalid"  # not only missing
    assert set(info.value.extra["errors"]) == {"n", "plan", "extra"}
    assert info.value.extra["errors"]["extra"] == "is not a parameter of this query"

    with pytest.raises(GatewayError) as info:
        binder.bind({"n": ["1", "2"]}, from_text=True)
    assert info.value.extra["errors"] == {"n": "was given more than once"}


def test_empty_text_for_non_str_uses_default():
    binder = ParamBinder(compile_specs({"n": {"type": "int", "default": 7}, "s": {"type": "str", "default": "d"}}))
    assert binder.bind({"n": "", "s": ""}, from_text=True) == (7, "")


@pytest.mark.parametrize("doc, field", [
    ({"p": {"type": "decimal"}}, "p"),
    ({"p": {"type": "int", "colour": "red"}}, "p"),
    ({"p": {"type": "int", "enum": []}}, "p"),
    ({"p": {"type": "int", "enum": ["a"]}}, "p"),
    ({"p": {"type": "int", "default": "x"}}, "p"),
    ({"p": {"type": "int", "default": 5, "max": 3}}, "p"),
    ({"p": {"type": "str", "pattern": "("}}, "p"),
    ({"p": {"type": "str", "min_length": -1}}, "p"),
    ({"p": {"type": "int", "min": "1"}}, "p"),
    ({"p": 5}, "p"),
    ({"p": "money"}, "p"),
    ({"1bad": {"type": "int"}}, "1bad"),
    ({"has-dash": {"type": "int"}}, "has-dash"),
])
def test_bad_specs_are_refused_at_save_time(doc, field):
    with pytest.raises(GatewayError) as info:
        compile_specs(doc)
    assert info.value.code == "invalid_body"
    assert field in info.value.extra["errors"]


def test_short_form():
    (s,) = compile_specs({"aid": "int"})
    assert (s.name, s.kind, s.required) == ("aid", "int", True)   # no default: required (QueryAPIGate's rule)


def test_json_type_names_and_the_required_rule():
    specs = compile_specs({"a": "integer", "b": {"type": "number", "default": 1.5}, "c": {"type": "string",
                           "required": False}, "d": {"type": "boolean", "required": True, "default": True}})
    assert [(s.kind, s.required) for s in specs] == [("int", True), ("float", False), ("str", False), ("bool", True)]
    assert [s.to_doc()["type"] for s in specs] == ["integer", "number", "string", "boolean"]
    assert ParamBinder(specs).bind({"a": "1"}, from_text=True) == (1, 1.5, None, True)
    with pytest.raises(GatewayError) as info:
        ParamBinder(specs).bind({}, from_text=True)
    assert info.value.code == "param_required" and info.value.extra == {"errors": {"a": "is required"}}
    for bad in ({"type": "int", "required": "yes"}, {"type": "uuid"}):
        with pytest.raises(GatewayError):
            compile_specs({"x": bad})


def test_spec_round_trips_through_its_doc():
    original = {"type": "date", "required": False, "default": "2024-01-01", "description": "since"}
    s = ParamSpec("since", original)
    assert s.to_doc() == original
    assert ParamSpec("since", s.to_doc()).default == date(2024, 1, 1)


# --- properties --------------------------------------------------------------------------
_STRICT_INT = re.compile(r"[+-]?[0-9]{1,19}")


@given(st.integers(min_value=INT_MIN, max_value=INT_MAX))
def test_any_int_in_range_round_trips_through_text(value):
    assert spec("int").coerce_text(str(value)) == value
    if value >= 0:
        assert spec("int").coerce_text(f"+{value}") == value


@given(st.integers(min_value=INT_MAX + 1) | st.integers(max_value=INT_MIN - 1))
def test_any_int_out_of_range_is_refused(value):
    with pytest.raises(ParamError):
        spec("int").coerce_text(str(value))
    with pytest.raises(ParamError):
        spec("int").coerce_json(value)


@given(st.text(max_size=30))
def test_text_outside_the_strict_int_grammar_is_refused(text):
    s = spec("int")
    if _STRICT_INT.fullmatch(text) and INT_MIN <= int(text) <= INT_MAX:
        assert s.coerce_text(text) == int(text)
    else:
        with pytest.raises(ParamError):
            s.coerce_text(text)


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_any_finite_float_round_trips_through_text(value):
    assert spec("float").coerce_text(repr(value)) == value


@given(st.dates())
def test_any_date_round_trips_through_text(value):
    assert spec("date").coerce_text(value.isoformat()) == value


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6)
_raw_args = st.dictionaries(st.sampled_from(["i", "f", "s", "b", "d", "t", "zzz"]),
                            st.text(max_size=25) | st.lists(st.text(max_size=5), min_size=2, max_size=3),
                            max_size=7)


@given(st.sampled_from(TYPES), st.text(max_size=40), _json_values)
def test_coercion_raises_only_param_errors(kind, text, value):
    s = spec(kind)
    for attempt in (lambda: s.coerce_text(text), lambda: s.coerce_json(value)):
        try:
            attempt()
        except ParamError:
            pass


_BINDER = ParamBinder(compile_specs({
    "i": {"type": "int", "min": -5, "max": 5}, "f": {"type": "float", "required": True},
    "s": {"type": "str", "pattern": "[a-z]+", "max_length": 4}, "b": {"type": "bool", "default": True},
    "d": {"type": "date"}, "t": {"type": "datetime", "enum": ["2024-01-01T00:00:00"]},
}))


@given(_raw_args)
def test_binding_text_raises_only_gateway_errors(raw):
    try:
        values = _BINDER.bind(raw, from_text=True)
    except GatewayError as exc:
        assert exc.status == 400 and exc.code in ("param_invalid", "param_required")
        assert exc.extra["errors"] and all(isinstance(v, str) for v in exc.extra["errors"].values())
    else:
        assert len(values) == 6 and isinstance(values[1], float) and math.isfinite(values[1])


@given(st.dictionaries(st.sampled_from(["i", "f", "s", "b", "d", "t", "zzz"]), _json_values, max_size=7))
def test_binding_json_raises_only_gateway_errors(raw):
    try:
        _BINDER.bind(raw, from_text=False)
    except GatewayError as exc:
        assert exc.code in ("param_invalid", "param_required")


_spec_docs = st.dictionaries(
    st.sampled_from(["type", "required", "default", "enum", "min", "max", "min_length", "max_length",
                     "pattern", "description", "other"]),
    st.sampled_from(list(TYPES)) | _json_values, max_size=5)


@hsettings(max_examples=200)
@given(st.dictionaries(st.text(max_size=8), _spec_docs | _json_values, max_size=3))
def test_compiling_any_spec_raises_only_gateway_errors(doc):
    try:
        compile_specs(doc)
    except GatewayError as exc:
        assert exc.code in ("invalid_body", "pattern_unsupported")


# --- over HTTP: the 400 a caller sees ---------------------------------------------------
TYPED = {n: {"type": t, "required": False} for n, t in
         (("i", "int"), ("f", "float"), ("s", "str"), ("b", "bool"), ("d", "date"), ("t", "datetime"))}
TYPED_SQL = "SELECT :i AS i, :f AS f, :s AS s, :b AS b, :d AS d, :t AS t"


def test_each_type_reaches_the_database_typed(api, endpoint):
    ep = endpoint(TYPED_SQL, TYPED)
    expected = [{"i": -3, "f": 2.5, "s": "x'y", "b": True, "d": "2024-02-29", "t": "2024-01-02T03:04:05"}]
    got = api.call(ep.query, ep.secret, {"i": "-3", "f": "2.5", "s": "x'y", "b": "yes", "d": "2024-02-29",
                                         "t": "2024-01-02T03:04:05"})
    assert got.status == 200, got
    assert got.json == expected
    posted = api.post(ep.query, ep.secret, {"params": {"i": -3, "f": 2.5, "s": "x'y", "b": True,
                                                       "d": "2024-02-29", "t": "2024-01-02T03:04:05"}})
    assert posted.status == 200 and posted.json == expected
    nulls = api.call(ep.query, ep.secret)
    assert nulls.json == [dict.fromkeys(expected[0])]


@pytest.mark.parametrize("query_string, errors", [
    ("i=1_000", {"i": "must be an integer"}),
    ("i=0x1f", {"i": "must be an integer"}),
    ("i=%207", {"i": "must be an integer"}),
    ("i=true", {"i": "must be an integer"}),
    ("f=NaN", {"f": "must be a finite number"}),
    ("f=inf", {"f": "must be a finite number"}),
    ("s=a%00b", {"s": "must not contain NUL characters"}),
    ("b=maybe", {"b": "must be true or false"}),
    ("d=2023-02-29", {"d": "must be a date (YYYY-MM-DD)"}),
    ("i=1&i=2", {"i": "was given more than once"}),
    ("nope=1", {"nope": "is not a parameter of this query"}),
    ("i=x&f=y", {"i": "must be an integer", "f": "must be a number"}),
])
def test_invalid_params_over_http(api, endpoint, query_string, errors):
    ep = endpoint(TYPED_SQL, TYPED)
    got = api.call(ep.query, ep.secret, query_string=query_string)
    assert got.status == 400, got
    assert got.json["code"] == "param_invalid"
    assert got.json["errors"] == errors
    assert got.json["request_id"] == got.headers["X-Request-Id"]


@pytest.mark.parametrize("params, errors", [
    ({"i": True}, {"i": "must be an integer"}),
    ({"i": 1.5}, {"i": "must be an integer"}),
    ({"s": 5}, {"s": "must be a string"}),
    ({"b": 1}, {"b": "must be true or false"}),
    ({"d": 20240101}, {"d": "must be a date"}),
    ({"nope": 1}, {"nope": "is not a parameter of this query"}),
])
def test_invalid_json_params_over_http(api, endpoint, params, errors):
    ep = endpoint(TYPED_SQL, TYPED)
    got = api.post(ep.query, ep.secret, {"params": params})
    assert got.status == 400 and got.json["code"] == "param_invalid", got
    assert got.json["errors"] == errors


def test_required_default_and_constraints_over_http(api, endpoint):
    ep = endpoint("SELECT :n AS n, :plan AS plan, :code AS code",
                  {"n": {"type": "int", "required": True, "min": 1, "max": 100},
                   "plan": {"type": "str", "enum": ["free", "pro"], "default": "free"},
                   "code": {"type": "str", "pattern": "[A-Z]{2}", "min_length": 2, "max_length": 2,
                            "required": False}})
    missing = api.call(ep.query, ep.secret)
    assert missing.status == 400 and missing.json["code"] == "param_required"
    assert missing.json["errors"] == {"n": "is required"}
    ok = api.call(ep.query, ep.secret, {"n": "5"})
    assert ok.status == 200 and ok.json == [{"n": 5, "plan": "free", "code": None}]
    bad = api.call(ep.query, ep.secret, {"n": "101", "plan": "gold", "code": "usa"})
    assert bad.status == 400 and bad.json["code"] == "param_invalid"
    assert set(bad.json["errors"]) == {"n", "plan", "code"}
    assert api.call(ep.query, ep.secret, {"n": "1", "plan": "pro", "code": "DE"}).json == \
        [{"n": 1, "plan": "pro", "code": "DE"}]


def test_any_query_string_gets_a_typed_answer(api, endpoint):
    """No query string makes the data plane fail with anything but a typed 200 or 400."""
    ep = endpoint(TYPED_SQL, TYPED)

    @hsettings(max_examples=60, deadline=None)
    @given(st.dictionaries(st.sampled_from(["i", "f", "s", "b", "d", "t", "x", "page", "format"]),
                           st.text(st.characters(codec="utf-8"), max_size=12),
                           max_size=5))
    def check(params):
        got = api.call(ep.query, ep.secret, params)
        assert got.status in (200, 400), got
        if got.status == 400:
            assert set(got.json) >= {"error", "code", "request_id"}

    check()
