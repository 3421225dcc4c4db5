"""The response cache attacked over HTTP (real PostgreSQL and Redis): a key must never get from
the cache what it could not get uncached, and the cache's HTTP answers must say so to every
cache between the gateway and the caller."""
from __future__ import annotations

import pytest

from helpers.history import wait_for_history
from helpers.util import unique, wait_until

READ = "SELECT id, secret, n FROM {t} WHERE n >= :min ORDER BY id"
PARAMS = {"min": {"type": "int", "default": 0}}
SECRETS = (b"alpha@x", b"beta@x", b"gamma@x")


@pytest.fixture
def table(superuser):
    """A fresh table in the demo database: (id, secret, n), three rows."""
    name = unique("cache_adv").replace("-", "_")
    superuser(f"CREATE TABLE {name} (id int PRIMARY KEY, secret text, n int)", db="demo")
    superuser(f"INSERT INTO {name} VALUES (1, 'alpha@x', 1), (2, 'beta@x', 2), (3, 'gamma@x', 3)", db="demo")
    yield name
    superuser(f"DROP TABLE IF EXISTS {name}", db="demo")


def vary(reply) -> set[str]:
    return {v.strip().lower() for v in reply.headers.get("Vary", "").split(",") if v.strip()}


# --- HTTP semantics -----------------------------------------------------------------------
def test_cached_answers_vary_by_the_api_key(api, endpoint, table):
    """``Cache-Control: private, max-age=N`` lets the caller's own cache (a browser's, a client
    library's) keep the answer for N seconds. Without ``Vary: X-API-Key`` that cache hands the
    unmasked answer of one key to the next request sent with another key for the same URL,
    without asking the gateway: the masked key gets the values it could never get."""
    ep = endpoint(READ.format(t=table), PARAMS, cache_ttl=60)
    masked = api.key([ep.query], [ep.connection], mask=[{"column": f"{table}.secret", "action": "null"}])
    for state in ("miss", "hit", "bypass"):
        params = {"cache": "false"} if state == "bypass" else {}
        plain = api.call(ep.query, ep.secret, params)
        assert plain.headers["X-Cache"] == state and plain.headers["Cache-Control"].startswith("private, max-age=")
        assert "x-api-key" in vary(plain), (state, dict(plain.headers))
    other = api.call(ep.query, masked)
    assert other.status == 200 and not any(s in other.content for s in SECRETS)
    assert "x-api-key" in vary(other)
    # A 304 carries the same Vary as the 200 it stands for (RFC 9110 15.4.5).
    not_modified = api.call(ep.query, masked, headers={"If-None-Match": other.headers["ETag"]})
    assert not_modified.status == 304 and "x-api-key" in vary(not_modified)


def test_no_store_is_a_bypass_that_stores_nothing(api, endpoint, table, superuser):
    """``Cache-Control: no-store`` (RFC 9111 5.2.1.5): the cache must not store the answer. A
    ``no-cache`` call (or ``cache=false``) asks the database and may refresh the entry."""
    ep = endpoint(READ.format(t=table), PARAMS, cache_ttl=60)
    first = api.call(ep.query, ep.secret, headers={"Cache-Control": "no-store"})
    assert first.status == 200 and first.headers["X-Cache"] == "bypass"
    superuser(f"UPDATE {table} SET secret = 'changed' WHERE id = 1", db="demo")
    after = api.call(ep.query, ep.secret)
    assert after.headers["X-Cache"] == "miss" and after.json[0]["secret"] == "changed", after.headers
    # and a no-store call does not replace what is held either
    superuser(f"UPDATE {table} SET secret = 'again' WHERE id = 1", db="demo")
    assert api.call(ep.query, ep.secret, headers={"Cache-Control": "no-store"}).json[0]["secret"] == "again"
    held = api.call(ep.query, ep.secret)
    assert held.headers["X-Cache"] == "hit" and held.json[0]["secret"] == "changed"


def test_a_request_max_age_takes_no_older_answer(api, endpoint, table, superuser):
    """``Cache-Control: max-age=N`` (RFC 9111 5.2.1.1; a browser's reload sends max-age=0): no
    cached answer older than N seconds; the database answers and the entry is refreshed."""
    ep = endpoint(READ.format(t=table), PARAMS, cache_ttl=600)
    assert api.call(ep.query, ep.secret).headers["X-Cache"] == "miss"
    for n, control in enumerate(("max-age=0", "no-transform, max-age=0", 'max-age="0"')):
        superuser(f"UPDATE {table} SET secret = 'changed{n}' WHERE id = 1", db="demo")
        wait_until(lambda: api.call(ep.query, ep.secret).headers["Age"] != "0", timeout_s=5)   # a second old
        young = api.call(ep.query, ep.secret, headers={"Cache-Control": "max-age=600"})
        assert young.headers["X-Cache"] == "hit" and young.json[0]["secret"] != f"changed{n}"   # young enough
        reloaded = api.call(ep.query, ep.secret, headers={"Cache-Control": control})
        assert reloaded.headers["X-Cache"] == "bypass" and reloaded.json[0]["secret"] == f"changed{n}", control
        held = api.call(ep.query, ep.secret)                               # refreshed
        assert held.headers["X-Cache"] == "hit" and held.json[0]["secret"] == f"changed{n}"
    for ignored in ("max-age=\u0661", "s-maxage=0", "max-age=abc"):        # not a request max-age
        assert api.call(ep.query, ep.secret, headers={"Cache-Control": ignored}).headers["X-Cache"] == "hit", ignored


def test_a_post_whose_etag_matches_is_412_not_304(api, endpoint, table):
    """RFC 9110 13.1.2: a matching If-None-Match answers 304 to GET and HEAD only; 412 to others."""
    ep = endpoint(READ.format(t=table), PARAMS, cache_ttl=60)
    etag = api.call(ep.query, ep.secret).headers["ETag"]
    assert api.call(ep.query, ep.secret, headers={"If-None-Match": etag}).status == 304
    posted = api.request("POST", f"/q/{ep.query}", json_body={}, headers={"X-API-Key": ep.secret,
                                                                        "If-None-Match": etag})
    assert posted.status == 412 and posted.json["code"] == "precondition_failed", posted
    other = api.request("POST", f"/q/{ep.query}", json_body={}, headers={"X-API-Key": ep.secret,
                                                                       "If-None-Match": '"other"'})
    assert other.status == 200 and len(other.json) == 3


# --- cache_ttl validation -----------------------------------------------------------------
@pytest.mark.parametrize("version", ["\u00b2", "\u0661", "1\u00b9", "\uff11"])
def test_a_version_path_of_non_ascii_digits_is_a_404_not_a_500(api, endpoint, table, version):
    ep = endpoint(READ.format(t=table), PARAMS)
    reply = api.manage("PATCH", f"/queries/{ep.query}/versions/{version}", {"cache_ttl": 30})
    assert reply.status == 404 and reply.json["code"] == "version_not_found", reply


def test_a_data_modifying_cte_takes_no_cache_ttl(api, demo_connection, table):
    sql = f"WITH d AS (DELETE FROM {table} WHERE id = 1 RETURNING *) SELECT * FROM d"
    reply = api.manage("POST", "/queries", {"name": unique("q"), "connection_name": demo_connection,
                                            "sql": sql, "cache_ttl": 30})
    assert reply.status == 400, reply


# --- hits pay like misses -----------------------------------------------------------------
def test_hits_are_rate_limited_and_recorded_like_misses(api, endpoint, table, superuser):
    ep = endpoint(READ.format(t=table), PARAMS, cache_ttl=60)
    name, secret = api.named_key([ep.query], [ep.connection], rate_limit="3/minute", rate_limit_burst=3)
    replies = [api.call(ep.query, secret) for _ in range(4)]
    assert [r.status for r in replies] == [200, 200, 200, 429], replies
    assert [r.headers.get("X-Cache") for r in replies[:3]] == ["miss", "hit", "hit"]
    ids = [r.headers["X-Request-Id"] for r in replies]
    found = wait_for_history(superuser, ids)
    assert [found[i][2:5] for i in ids] == [(200, None, 3)] * 3 + [(429, "rate_limited", None)], found


# --- listing --------------------------------------------------------------------------------
def test_the_listing_is_the_admins_and_shows_no_values(api, endpoint, table):
    ep = endpoint(READ.format(t=table), PARAMS, cache_ttl=60)
    assert api.call(ep.query, ep.secret, {"min": "2"}).status == 200
    for headers in ({}, {"X-API-Key": ep.secret}):
        for path in ("/api/v1/cache/entries", f"/api/v1/cache/entries?query={ep.query}"):
            for method in ("GET", "DELETE"):
                reply = api.request(method, path, headers=headers)
                assert reply.status in (401, 403) and not any(s in reply.content for s in SECRETS), reply
    listing = api.ok("GET", f"/cache/entries?query={ep.query}")
    assert listing.json["count"] == 1 and not any(s in listing.content for s in SECRETS)
    item = listing.json["items"][0]
    assert {"key", "meta", "content_type", "size_bytes", "ttl_remaining_s"} <= set(item)
    entry = api.request("GET", f"/api/v1/cache/entries/{item['key']}", headers={"X-API-Key": ep.secret})
    assert entry.status == 403 and b"beta@x" not in entry.content, entry
    # non-ASCII digits ("²" passes str.isdigit() and fails int()) are bad input, not a 500
    for bad in ({"limit": "0"}, {"limit": "x"}, {"limit": "\u00b2"}, {"limit": "\u0661"}, {"query": "a b"},
                {"other": "1"}):
        reply = api.manage("GET", "/cache/entries", params=bad)
        assert reply.status == 400 and reply.json["code"] == "invalid_filter", (bad, reply)


# --- masks and a schema that moved under a cached answer ----------------------------------
@pytest.fixture
def outer_inner(superuser):
    """``o`` (id, secret) and ``i`` (id) in the demo database: a query's unqualified ``secret``
    inside a subquery on ``i`` reads ``o.secret`` until ``i`` gets a column of that name."""
    o, i = unique("adv_o").replace("-", "_"), unique("adv_i").replace("-", "_")
    superuser(f"CREATE TABLE {o} (id int PRIMARY KEY, secret text)", db="demo")
    superuser(f"CREATE TABLE {i} (id int PRIMARY KEY)", db="demo")
    superuser(f"INSERT INTO {o} VALUES (1, 'alpha@x'), (2, 'beta@x')", db="demo")
    superuser(f"INSERT INTO {i} VALUES (1), (2)", db="demo")
    yield o, i
    superuser(f"DROP TABLE IF EXISTS {o}, {i}", db="demo")


def test_a_cached_answer_is_never_masked_by_a_plan_of_another_schema(api, endpoint, outer_inner, superuser):
    """The entry holds rows read under the schema of its fill; the plan is made under the schema
    the worker read last. A column added since moves a name to another table: the new plan
    leaves ``x`` unmasked (it is ``i.secret`` now), and the cached rows still hold ``o.secret``
    in it. Uncached, the key gets ``i.secret``; from the cache it must not get ``o.secret``."""
    o, i = outer_inner
    sql = f"SELECT {o}.id, (SELECT secret FROM {i} WHERE {i}.id = {o}.id) AS x FROM {o} ORDER BY {o}.id"
    ep = endpoint(sql, cache_ttl=60)
    masked = api.key([ep.query], [ep.connection], mask=[{"column": f"{o}.secret", "action": "null"}])
    first = api.call(ep.query, masked)
    assert first.status == 200 and [r["x"] for r in first.json] == [None, None], first
    assert first.headers["X-Cache"] == "miss"
    superuser(f"ALTER TABLE {i} ADD COLUMN secret text DEFAULT 'public'", db="demo")
    # Saving a query on the connection reads its schema again in this worker (as its
    # background refresh would within GATEWAY_SCHEMA_TTL).
    api.query("SELECT 1 AS one", connection=ep.connection)
    for _ in range(2):
        got = api.call(ep.query, masked)
        assert got.status == 200 and not any(s in got.content for s in SECRETS), (got.headers, got.content)
    uncached = api.call(ep.query, masked, headers={"Cache-Control": "no-store"})
    assert [r["x"] for r in uncached.json] == ["public", "public"], uncached


def test_a_schema_change_elsewhere_keeps_the_cached_answers(api, endpoint, outer_inner, superuser):
    """What keys an entry is what the version's columns are under the schema, not the whole
    schema: a table made or dropped elsewhere in the database drops no cached answer."""
    o, i = outer_inner
    ep = endpoint(f"SELECT {o}.id, (SELECT secret FROM {i} WHERE {i}.id = {o}.id) AS x FROM {o} ORDER BY {o}.id",
                  cache_ttl=60)
    assert api.call(ep.query, ep.secret).headers["X-Cache"] == "miss"
    elsewhere = unique("adv_elsewhere").replace("-", "_")
    superuser(f"CREATE TABLE {elsewhere} (id int, secret text)", db="demo")
    try:
        api.query("SELECT 1 AS one", connection=ep.connection)   # this worker reads the schema again
        assert api.call(ep.query, ep.secret).headers["X-Cache"] == "hit"
    finally:
        superuser(f"DROP TABLE {elsewhere}", db="demo")


@pytest.fixture
def partitioned(superuser):
    """``p`` partitioned by id into ``p_1`` (id 1: a secret) and ``p_2`` (id 11: public)."""
    p = unique("adv_p").replace("-", "_")
    superuser(f"CREATE TABLE {p} (id int, secret text) PARTITION BY RANGE (id)", db="demo")
    superuser(f"CREATE TABLE {p}_1 PARTITION OF {p} FOR VALUES FROM (0) TO (10)", db="demo")
    superuser(f"CREATE TABLE {p}_2 PARTITION OF {p} FOR VALUES FROM (10) TO (20)", db="demo")
    superuser(f"INSERT INTO {p} VALUES (1, 'alpha@x'), (11, 'public')", db="demo")
    yield p
    superuser(f"DROP TABLE IF EXISTS {p}, {p}_1, {p}_2", db="demo")


def test_a_detached_partition_rows_never_come_back_unmasked_from_the_cache(api, endpoint, partitioned,
                                                                             superuser):
    """A rule on a partition's column masks the parent's column while the partition is
    attached (its rows are the parent's). Detached, its rows leave the parent and the rule no
    longer applies there: the cached rows, read while it was attached, must not go out under
    the new plan."""
    p = partitioned
    ep = endpoint(f"SELECT id, secret FROM {p} ORDER BY id", cache_ttl=60)
    masked = api.key([ep.query], [ep.connection], mask=[{"column": f"{p}_1.secret", "action": "null"}])
    first = api.call(ep.query, masked)
    assert first.status == 200 and first.json == [{"id": 1, "secret": None}, {"id": 11, "secret": None}], first
    superuser(f"ALTER TABLE {p} DETACH PARTITION {p}_1", db="demo")
    api.query("SELECT 1 AS one", connection=ep.connection)   # this worker reads the schema again
    got = api.call(ep.query, masked)
    assert got.status == 200 and b"alpha@x" not in got.content, (got.headers, got.content)
    assert got.json == [{"id": 11, "secret": "public"}], got


# --- what keys an entry --------------------------------------------------------------------
def test_equal_values_share_an_entry_and_bad_ones_never_reach_it(api, endpoint, table):
    """``min=2``, ``min=02`` and ``min=+2`` are one value (one entry); a value the binder
    refuses, a repeated or unknown argument, is a typed 400 whatever the cache holds."""
    ep = endpoint(READ.format(t=table), PARAMS, cache_ttl=60)
    states = [api.call(ep.query, ep.secret, {"min": v}).headers["X-Cache"] for v in ("2", "02", "+2")]
    assert states == ["miss", "hit", "hit"]
    assert api.call(ep.query, ep.secret, {"page": "01", "page_size": "010", "format": "JSON", "min": "2"}) \
        .headers["X-Cache"] == "hit"
    for query_string, code in (("min=2.0", "param_invalid"), ("min=2&min=2", "param_invalid"),
                               ("min=2&other=1", "param_invalid"), ("min=2&cache=false&cache=false", "invalid_cache"),
                               ("min=2&page=0", "invalid_paging"), ("min=2&format=exe", "invalid_format")):
        reply = api.call(ep.query, ep.secret, query_string=query_string)
        assert reply.status == 400 and reply.json["code"] == code, (query_string, reply)


def test_a_narrowed_table_allow_list_refuses_a_cached_answer_at_once(api, endpoint, table):
    ep = endpoint(READ.format(t=table), PARAMS, cache_ttl=60)
    assert api.call(ep.query, ep.secret).headers["X-Cache"] == "miss"
    api.ok("PATCH", f"/api-keys/{ep.key}", {"allowed_tables": ["public.nothing_here"]})
    refused = api.call(ep.query, ep.secret)
    assert refused.status == 403 and not any(s in refused.content for s in SECRETS), refused
    etag_call = api.call(ep.query, ep.secret, headers={"If-None-Match": "*"})
    assert etag_call.status == 403, etag_call     # not a 304: the refusal comes before the cache
