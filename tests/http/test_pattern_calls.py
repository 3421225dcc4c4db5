"""Parameter patterns that cannot hang a worker, through the real app: the classic evil
patterns answer a 10,000-character hostile value within a second, over HTTP to a gunicorn
master (on Python's re each such call ran for minutes and held its thread); a pattern RE2
cannot run is refused when saved, 400 ``pattern_unsupported``."""
from __future__ import annotations

import time

import pytest
import requests

from helpers.patterns import EVIL
from helpers.util import unique


@pytest.mark.parametrize("pattern", sorted(EVIL))
def test_evil_pattern_answers_quickly(http, http_endpoint, gunicorn, pattern):
    ep = http_endpoint("SELECT :s AS s", {"s": {"type": "str", "pattern": pattern}})
    url = f"{gunicorn.base}/q/{ep.query}"
    headers = {"X-API-Key": ep.secret}
    started = time.monotonic()
    try:
        got = requests.post(url, json={"params": {"s": EVIL[pattern]}}, headers=headers, timeout=(5, 2))
    except requests.ReadTimeout:
        pytest.fail(f"{pattern}: no answer within 2 s (backtracking)")
    elapsed = time.monotonic() - started
    assert (got.status_code, got.json()["code"]) == (400, "param_invalid"), got.text
    assert "must match" in got.json()["errors"]["s"]
    assert elapsed < 1.0, f"{pattern}: {elapsed:.2f} s"
    ok = requests.post(url, json={"params": {"s": "a" * 40}}, headers=headers, timeout=10)
    assert ok.status_code == 200 and ok.json() == [{"s": "a" * 40}], ok.text


@pytest.mark.parametrize("pattern", [r"(\w)\1", r"(?=a)a", r"(?<=a)b", r"(?P<x>a)(?P=x)", r"a++",
                                     r"(.*a){999}"])
def test_unsupported_pattern_is_refused_when_saved(api, demo_connection, pattern):
    for path, name in (("/queries", unique("q")), (None, None)):
        if path is None:   # a new version of a query saved without the pattern
            name = api.query("SELECT :s AS s", {"s": "str"}, connection=demo_connection)
            path = f"/queries/{name}/versions"
        got = api.manage("POST", path, {"name": name, "connection_name": demo_connection, "sql": "SELECT :s AS s",
                                        "parameters": {"s": {"type": "str", "pattern": pattern}}, "publish": True})
        assert (got.status, got.json["code"]) == (400, "pattern_unsupported"), got
        assert "RE2" in got.json["errors"]["s"] or "instructions" in got.json["errors"]["s"]


def test_an_invalid_pattern_stays_invalid_body(api, demo_connection):
    got = api.manage("POST", "/queries", {"name": unique("q"), "connection_name": demo_connection,
                                          "sql": "SELECT :s AS s", "parameters": {"s": {"type": "str", "pattern": "("}}})
    assert (got.status, got.json["code"]) == (400, "invalid_body") and "s" in got.json["errors"]


def test_the_whole_value_must_match(api, endpoint):
    """A full match, as with re.fullmatch before: a value that only contains a match is refused."""
    ep = endpoint("SELECT :s AS s", {"s": {"type": "str", "pattern": "[a-z]+|[0-9]+"}})
    for value, status in (("abc", 200), ("123", 200), ("abc1", 400), ("xabc\n", 400), ("", 400)):
        got = api.call(ep.query, ep.secret, {"s": value})
        assert got.status == status, (value, got)


def test_a_long_value_is_refused_before_matching(api, endpoint):
    from gateway.model.patterns import MAX_INPUT
    ep = endpoint("SELECT length(:s) AS n", {"s": {"type": "str", "pattern": "[a-z]*"}})
    assert api.post(ep.query, ep.secret, {"params": {"s": "a" * MAX_INPUT}}).json == [{"n": MAX_INPUT}]
    got = api.post(ep.query, ep.secret, {"params": {"s": "a" * (MAX_INPUT + 1)}})
    assert (got.status, got.json["code"]) == (400, "param_invalid") and "pattern" in got.json["errors"]["s"]
