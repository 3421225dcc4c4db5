"""A rows quota counts every row a key receives: pages, streams and ad-hoc statements
alike, and a stream stops where the quota does (before this, a 5-row quota delivered
5,000 rows through ``stream=true``)."""
from __future__ import annotations

import json

import falcon.testing


def test_a_stream_stops_at_the_rows_quota_and_is_charged(api, endpoint):
    ep = endpoint("SELECT aid FROM pgbench_accounts WHERE aid <= 5000 ORDER BY aid")
    secret = api.key([ep.query], [ep.connection], quota={"rows": 5, "per": "day"})
    got = api.call(ep.query, secret, {"stream": "true", "format": "ndjson"})
    assert got.status == 200, got
    assert [json.loads(line)["aid"] for line in got.text.splitlines()] == [1, 2, 3, 4, 5]
    again = api.call(ep.query, secret, {"stream": "true", "format": "ndjson"})
    assert again.status == 429 and again.json["code"] == "quota_exceeded", again


def test_a_stream_is_charged_for_what_it_sent(api, endpoint):
    ep = endpoint("SELECT aid FROM pgbench_accounts WHERE aid <= 30 ORDER BY aid")
    secret = api.key([ep.query], [ep.connection], quota={"rows": 100, "per": "day"})
    for _ in range(3):
        got = api.call(ep.query, secret, {"stream": "true", "format": "csv"})
        assert got.status == 200 and len(got.text.splitlines()) == 31, got
    last = api.call(ep.query, secret, {"stream": "true", "format": "csv"})
    assert last.status == 200 and len(last.text.splitlines()) == 1 + 10, last    # 90 spent: 10 left
    assert api.call(ep.query, secret, {"stream": "true", "format": "csv"}).status == 429


def test_adhoc_rows_count_against_the_quota(api, demo_connection):
    secret = api.key([], [demo_connection], quota={"rows": 5, "per": "day"})
    body = {"sql": "SELECT aid FROM pgbench_accounts ORDER BY aid", "connection_name": demo_connection,
            "page_size": 50}
    first = api.adhoc(secret, body)
    assert first.status == 200 and len(first.json) == 50, first   # a page may overshoot by its own size
    refused = api.adhoc(secret, body)
    assert refused.status == 429 and refused.json["code"] == "quota_exceeded", refused


def test_streams_at_once_share_the_rows_quota(api, endpoint, app):
    """Three streams of one key opened before any of them sends a row (as concurrent calls
    are): the quota is checked and charged in one step per batch, so together they send the
    quota and no more (before: each read what was left when it opened and sent all of it,
    15 rows for a 5-row quota)."""
    ep = endpoint("SELECT aid FROM pgbench_accounts WHERE aid <= 5000 ORDER BY aid")
    secret = api.key([ep.query], [ep.connection], quota={"rows": 5, "per": "day"})
    bodies = []
    for _ in range(3):
        environ = falcon.testing.create_environ(f"/q/{ep.query}", query_string="stream=true&format=ndjson",
                                                headers={"X-API-Key": secret})
        statuses: list = []
        bodies.append((app(environ, lambda status, headers, *exc, into=statuses: into.append(status)), statuses))
    sent, answers = [], []
    for body, statuses in bodies:
        try:
            data = b"".join(body)
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
        answers.append((statuses, data[:200]))
        sent.append(data.count(b"\n"))
    assert all(statuses == ["200 OK"] for statuses, _ in answers), answers
    assert sum(sent) == 5, sent
    assert api.call(ep.query, secret, {"stream": "true", "format": "ndjson"}).status == 429
