"""The response cache through the HTTP API of one in-process app (real PostgreSQL and Redis):
``cache_ttl`` on queries and versions, hits and misses, HTTP semantics, keys that never
share an answer, and invalidation by changes, purges and writes."""
from __future__ import annotations

import falcon.testing
import pytest

from helpers.api import Api
from helpers.util import METRICS_AUTH, unique, wait_until

READ = "SELECT id, secret, n FROM {t} WHERE n >= :min ORDER BY id"
PARAMS = {"min": {"type": "int", "default": 0}}


@pytest.fixture
def table(superuser):
    """A fresh table in the demo database: (id, secret, n), three rows."""
    name = unique("cache_t").replace("-", "_")
    superuser(f"CREATE TABLE {name} (id int PRIMARY KEY, secret text, n int)", db="demo")
    superuser(f"INSERT INTO {name} VALUES (1, 'alpha@x', 1), (2, 'beta@x', 2), (3, 'gamma@x', 3)", db="demo")
    yield name
    superuser(f"DROP TABLE IF EXISTS {name}", db="demo")


def secrets(reply) -> list:
    assert reply.status == 200, reply
    return [row["secret"] for row in reply.json]


# --- cache_ttl ---------------------------------------------------------------------------
@pytest.mark.parametrize("ttl", [-1, "60", True, 1.5, 10 ** 9])
def test_cache_ttl_is_validated(api, demo_connection, table, ttl):
    reply = api.manage("POST", "/queries", {"name": unique("q"), "connection_name": demo_connection,
                                            "sql": READ.format(t=table), "parameters": PARAMS, "cache_ttl": ttl})
    assert reply.status == 400 and reply.json["code"] == "invalid_body" and "cache_ttl" in reply.json["errors"], reply


def test_cache_ttl_is_for_reads_only(api, demo_connection, table):
    reply = api.manage("POST", "/queries", {"name": unique("q"), "connection_name": demo_connection,
                                            "sql": f"UPDATE {table} SET n = n + 1", "cache_ttl": 30})
    assert reply.status == 400 and reply.json["errors"] == {"cache_ttl": "is for reads only"}, reply


def test_a_version_inherits_the_query_cache_ttl_or_sets_its_own(api, endpoint, table, superuser):
    ep = endpoint(READ.format(t=table), PARAMS, cache_ttl=60)
    api.ok("POST", f"/queries/{ep.query}/versions", {"sql": READ.format(t=table), "parameters": PARAMS,
                                                      "connection_name": ep.connection, "publish": True})
    api.ok("POST", f"/queries/{ep.query}/versions", {"sql": READ.format(t=table), "parameters": PARAMS,
                                                      "connection_name": ep.connection, "publish": True,
                                                      "cache_ttl": 0})
    doc = api.ok("GET", f"/queries/{ep.query}").json
    assert [v["cache_ttl"] for v in doc["versions"]] == [60, 60, 0] and doc["cache_ttl"] == 0
    assert "X-Cache" not in api.call(ep.query, ep.secret).headers        # v3 is not cached
    cached = api.call(ep.query, ep.secret, {"version": "2"})
    assert cached.headers["X-Cache"] == "miss"
    assert api.call(ep.query, ep.secret, {"version": "2"}).headers["X-Cache"] == "hit"


def test_a_version_cache_ttl_changes_in_place(api, endpoint, table, superuser):
    """QueryAPIGate's PATCH /queries/<name>/versions/<n> {"cache_ttl"}: the version's entries go with it."""
    ep = endpoint(READ.format(t=table), PARAMS)
    assert "X-Cache" not in api.call(ep.query, ep.secret).headers
    doc = api.ok("PATCH", f"/queries/{ep.query}/versions/1", {"cache_ttl": 30}).json
    assert doc["versions"][0]["cache_ttl"] == 30
    assert api.call(ep.query, ep.secret).headers["X-Cache"] == "miss"
    superuser(f"UPDATE {table} SET secret = 'changed' WHERE id = 1", db="demo")
    assert secrets(api.call(ep.query, ep.secret))[0] == "alpha@x"             # cached
    api.ok("PATCH", f"/queries/{ep.query}/versions/1", {"cache_ttl": 40})
    again = api.call(ep.query, ep.secret)
    assert again.headers["X-Cache"] == "miss" and secrets(again)[0] == "changed"   # the change purged it
    api.ok("PATCH", f"/queries/{ep.query}/versions/1", {"cache_ttl": None})
    assert "X-Cache" not in api.call(ep.query, ep.secret).headers
    for body, status in (({"cache_ttl": -5}, 400), ({"sql": "SELECT 1"}, 400), ({}, 400)):
        assert api.manage("PATCH", f"/queries/{ep.query}/versions/1", body).status == status
    assert api.manage("PATCH", f"/queries/{ep.query}/versions/9", {"cache_ttl": 5}).json["code"] == "version_not_found"


# --- hits, misses, HTTP semantics -------------------------------------------------------
def test_miss_then_hit_with_http_semantics(api, endpoint, table, superuser):
    ep = endpoint(READ.format(t=table), PARAMS, cache_ttl=60)
    first = api.call(ep.query, ep.secret)
    assert first.headers["X-Cache"] == "miss" and secrets(first) == ["alpha@x", "beta@x", "gamma@x"]
    # A change made outside the gateway is not seen until the TTL (or a purge): the proof it is cached.
    superuser(f"UPDATE {table} SET secret = 'changed' WHERE id = 1", db="demo")
    second = api.call(ep.query, ep.secret)
    assert second.headers["X-Cache"] == "hit" and second.content == first.content
    assert second.headers["ETag"] == first.headers["ETag"]
    control = second.headers["Cache-Control"]
    assert control.startswith("private, max-age=") and 55 <= int(control.split("=")[1]) <= 60
    assert 0 <= int(second.headers["Age"]) <= 5
    # cache=false and Cache-Control: no-cache ask the database
    bypass = api.call(ep.query, ep.secret, {"cache": "false"})
    assert bypass.headers["X-Cache"] == "bypass" and secrets(bypass)[0] == "changed"
    assert api.call(ep.query, ep.secret, headers={"Cache-Control": "no-cache"}).headers["X-Cache"] == "bypass"
    bad = api.call(ep.query, ep.secret, {"cache": "maybe"})
    assert bad.status == 400 and bad.json["code"] == "invalid_cache", bad


def test_if_none_match_answers_304_without_a_body(api, endpoint, table):
    ep = endpoint(READ.format(t=table), PARAMS, cache_ttl=60)
    etag = api.call(ep.query, ep.secret).headers["ETag"]
    same = api.call(ep.query, ep.secret, headers={"If-None-Match": etag})
    assert same.status == 304 and same.content == b"" and same.headers["ETag"] == etag
    assert api.call(ep.query, ep.secret, headers={"If-None-Match": f'"other", {etag}'}).status == 304
    other = api.call(ep.query, ep.secret, headers={"If-None-Match": '"other"'})
    assert other.status == 200 and len(other.json) == 3


def test_entries_are_keyed_by_values_page_size_and_format(api, endpoint, table):
    ep = endpoint(READ.format(t=table), PARAMS, cache_ttl=60)
    assert api.call(ep.query, ep.secret, {"min": "2"}).headers["X-Cache"] == "miss"
    assert secrets(api.call(ep.query, ep.secret, {"min": "2"})) == ["beta@x", "gamma@x"]
    assert api.call(ep.query, ep.secret, {"min": "3"}).headers["X-Cache"] == "miss"
    assert api.call(ep.query, ep.secret, {"min": "2", "page_size": "1"}).headers["X-Cache"] == "miss"
    paged = api.call(ep.query, ep.secret, {"min": "2", "page_size": "1", "page": "2"})
    assert paged.headers["X-Cache"] == "miss" and secrets(paged) == ["gamma@x"]
    assert paged.headers["X-Has-More"] == "false"
    csv = api.call(ep.query, ep.secret, {"min": "2", "format": "csv"})
    assert csv.headers["X-Cache"] == "hit" and csv.text.splitlines() == ["id,secret,n", "2,beta@x,2", "3,gamma@x,3"]
    assert csv.headers["ETag"] != api.call(ep.query, ep.secret, {"min": "2"}).headers["ETag"]


# --- keys never share an answer ---------------------------------------------------------
def test_a_masked_key_never_receives_another_keys_values(api, endpoint, table):
    """Adversarial: the unmasked key fills every entry first; the masked keys then hit it."""
    ep = endpoint(READ.format(t=table), PARAMS, cache_ttl=60)
    nulled = api.key([ep.query], [ep.connection], mask=[{"column": f"{table}.secret", "action": "null"}])
    hashed = api.key([ep.query], [ep.connection], mask=[{"column": f"{table}.secret", "action": "hash"}])
    dropped = api.key([ep.query], [ep.connection], mask=[{"column": f"{table}.secret", "action": "drop"}])
    capped = api.key([ep.query], [ep.connection], max_rows=1)
    plain_values = {"alpha@x", "beta@x", "gamma@x"}
    for params in ({}, {"min": "2"}, {"format": "csv"}, {"format": "ndjson"}, {"page_size": "1", "page": "2"}):
        plain = api.call(ep.query, ep.secret, params)
        assert plain.status == 200 and any(v.encode() in plain.content for v in plain_values)
        for secret in (nulled, hashed, dropped):
            got = api.call(ep.query, secret, params)
            assert got.status == 200 and got.headers["X-Cache"] == "hit", got
            assert not any(v.encode() in got.content for v in plain_values), (params, got.content)
            assert got.headers["ETag"] != plain.headers["ETag"]
    assert [r["secret"] for r in api.call(ep.query, nulled).json] == [None, None, None]
    assert all("secret" not in r for r in api.call(ep.query, dropped).json)
    one = api.call(ep.query, capped)
    assert len(one.json) == 1 and one.headers["X-Page-Size"] == "1"


def test_cached_answers_are_charged_to_each_keys_rows_quota(api, endpoint, table):
    """A hit costs the database nothing but is rows the key received: charged like a miss,
    to the key that got them (another key's fill is not its own)."""
    ep = endpoint(READ.format(t=table), PARAMS, cache_ttl=60)
    assert api.call(ep.query, ep.secret).headers["X-Cache"] == "miss"      # filled by a key without a quota
    quota = api.key([ep.query], [ep.connection], quota={"rows": 7, "per": "day"},
                    mask=[{"column": f"{table}.secret", "action": "hash"}])
    for _ in range(3):   # 3 rows a call: 3, 6, then 9 (a page may overshoot by its own size)
        got = api.call(ep.query, quota)
        assert got.status == 200 and got.headers["X-Cache"] == "hit" and len(got.json) == 3, got
        assert "alpha@x" not in got.text
    refused = api.call(ep.query, quota)
    assert refused.status == 429 and refused.json["code"] == "quota_exceeded", refused
    assert api.call(ep.query, ep.secret).status == 200     # the filling key was not charged for them


def test_ready_answers_are_kept_per_format_and_plan_in_any_order(api, endpoint, table):
    """An entry keeps each answer it rendered (``gateway.pipeline.cached.View``): here the masked keys
    fill and render first, the unmasked key after, then all of them in turns; every key gets its own
    body (the same one each time), its own ETag, and a 304 only for its own ETag."""
    ep = endpoint(READ.format(t=table), PARAMS, cache_ttl=60)
    nulled = api.key([ep.query], [ep.connection], mask=[{"column": f"{table}.secret", "action": "null"}])
    hashed = api.key([ep.query], [ep.connection], mask=[{"column": f"{table}.secret", "action": "hash"}])
    plain_too = api.key([ep.query], [ep.connection])   # nothing to mask either: the same answer as ep's
    plain_values = [b"alpha@x", b"beta@x", b"gamma@x"]
    states = []
    for fmt in ("json", "csv"):
        first = {}
        for round_ in range(3):
            for secret in (nulled, hashed, ep.secret, plain_too):
                got = api.call(ep.query, secret, {"format": fmt})
                assert got.status == 200, got
                states.append(got.headers["X-Cache"])
                masked = secret in (nulled, hashed)
                assert any(v in got.content for v in plain_values) != masked, (fmt, round_, got.content)
                seen = first.setdefault(secret, (got.content, got.headers["ETag"]))
                assert (got.content, got.headers["ETag"]) == seen
        assert len({etag for _, etag in first.values()}) == 3 and first[ep.secret] == first[plain_too]
        for secret, (_, etag) in first.items():
            assert api.call(ep.query, secret, {"format": fmt}, headers={"If-None-Match": etag}).status == 304
            other = first[nulled if secret != nulled else hashed][1]
            again = api.call(ep.query, secret, {"format": fmt}, headers={"If-None-Match": other})
            assert again.status == 200 and again.content == first[secret][0]
    assert states == ["miss"] + ["hit"] * (len(states) - 1)   # one entry: the rows, in every format


def test_narrowed_and_revoked_grants_apply_to_cached_answers_at_once(api, endpoint, table):
    ep = endpoint(READ.format(t=table), PARAMS, cache_ttl=60)
    assert secrets(api.call(ep.query, ep.secret))[0] == "alpha@x"
    assert api.call(ep.query, ep.secret).headers["X-Cache"] == "hit"
    api.ok("PATCH", f"/api-keys/{ep.key}", {"mask": [{"column": f"{table}.secret", "action": "null"}]})
    narrowed = api.call(ep.query, ep.secret)
    assert narrowed.headers["X-Cache"] == "hit" and secrets(narrowed) == [None, None, None]
    api.ok("PATCH", f"/api-keys/{ep.key}", {"max_rows": 2, "mask": None})
    assert len(api.call(ep.query, ep.secret).json) == 2
    other = endpoint("SELECT 1 AS one")
    api.ok("PATCH", f"/api-keys/{ep.key}", {"queries": [other.query], "connections": []})   # revoked
    refused = api.call(ep.query, ep.secret)
    assert refused.status in (403, 404) and b"alpha" not in refused.content, refused
    api.ok("PATCH", f"/api-keys/{ep.key}", {"queries": [ep.query], "connections": [ep.connection], "active": False})
    assert api.call(ep.query, ep.secret).status == 401
    api.ok("PATCH", f"/api-keys/{ep.key}", {"active": True})
    assert api.call(ep.query, ep.secret).headers["X-Cache"] == "hit"      # the entry was there all along
    api.ok("DELETE", f"/api-keys/{ep.key}")
    assert api.call(ep.query, ep.secret).status == 401


# --- invalidation -----------------------------------------------------------------------
def test_versions_unpublish_and_connection_changes_invalidate(api, endpoint, table, superuser):
    ep = endpoint(READ.format(t=table), PARAMS, cache_ttl=60)
    api.call(ep.query, ep.secret)
    superuser(f"UPDATE {table} SET secret = 'v2' WHERE id = 1", db="demo")
    assert secrets(api.call(ep.query, ep.secret))[0] == "alpha@x"               # cached
    api.ok("POST", f"/queries/{ep.query}/unpublish", {})
    assert api.call(ep.query, ep.secret).status == 404
    api.ok("POST", f"/queries/{ep.query}/publish", {"version": 1})
    again = api.call(ep.query, ep.secret)
    assert again.headers["X-Cache"] == "miss" and secrets(again)[0] == "v2"     # the same version: purged
    superuser(f"UPDATE {table} SET secret = 'v3' WHERE id = 1", db="demo")
    api.ok("POST", f"/queries/{ep.query}/versions", {"sql": READ.format(t=table) + " LIMIT 5", "parameters": PARAMS,
                                                      "connection_name": ep.connection, "publish": True})
    new = api.call(ep.query, ep.secret)
    assert new.headers["X-Cache"] == "miss" and secrets(new)[0] == "v3"
    superuser(f"UPDATE {table} SET secret = 'v4' WHERE id = 1", db="demo")
    api.ok("PATCH", f"/connections/{ep.connection}", {"port": api.services.pg.port})
    moved = api.call(ep.query, ep.secret)
    assert moved.headers["X-Cache"] == "miss" and secrets(moved)[0] == "v4"


def test_purge_all_and_by_query(api, endpoint, table, superuser):
    one = endpoint(READ.format(t=table), PARAMS, cache_ttl=60)
    two = endpoint(READ.format(t=table), PARAMS, cache_ttl=60)
    api.call(one.query, one.secret)
    api.call(two.query, two.secret)
    listed = api.ok("GET", "/cache/entries", params={"query": one.query}).json
    assert listed["count"] == 1
    item = listed["items"][0]
    # QueryAPIGate's fields, then ours
    assert item["meta"] == {"name": one.query, "version": 1, "connection": one.connection, "format": None,
                            "page": 1, "page_size": 10}, item
    assert item["size_bytes"] > 0 and 0 < item["ttl_remaining_s"] <= 60 and item["content_type"] == "application/json"
    assert item["query"] == one.query and item["version"] == 1 and item["rows"] == 3 and item["tier"] == "memory"
    assert len(item["key"]) == 32 and item["expires_at"] > item["created_at"]
    body = api.ok("GET", f"/cache/entries/{item['key']}").json          # the admin sees the rows as held
    assert [r["secret"] for r in body] == ["alpha@x", "beta@x", "gamma@x"]
    superuser(f"UPDATE {table} SET secret = 'purged' WHERE id = 1", db="demo")
    purge = api.manage("DELETE", "/cache/entries", params={"query": one.query})
    assert purge.status == 204 and purge.content == b"", purge
    assert purge.headers["X-Cache-Invalidated"].startswith("acked=") and "pending=0" in purge.headers[
        "X-Cache-Invalidated"], purge.headers
    assert api.manage("GET", f"/cache/entries/{item['key']}").json["code"] == "cache_entry_not_found"
    assert secrets(api.call(one.query, one.secret))[0] == "purged"
    assert secrets(api.call(two.query, two.secret))[0] == "alpha@x"           # another query: kept
    api.ok("DELETE", "/cache/entries")
    assert secrets(api.call(two.query, two.secret))[0] == "purged"
    # one entry by its key
    key = api.ok("GET", "/cache/entries", params={"query": two.query}).json["items"][0]["key"]
    superuser(f"UPDATE {table} SET secret = 'by-key' WHERE id = 1", db="demo")
    assert api.manage("DELETE", f"/cache/entries/{key}").status == 204
    assert secrets(api.call(two.query, two.secret))[0] == "by-key"
    assert api.manage("DELETE", "/cache/entries/not-a-key").status == 204      # nothing to drop
    assert api.manage("DELETE", "/cache/entries", params={"query": "bad name!"}).status == 400
    assert api.request("DELETE", "/api/v1/cache/entries").status == 401       # admin only
    assert api.request("GET", "/api/v1/cache/entries").status == 401


@pytest.fixture
def writer(make_app, services):
    """An app that runs writes (GATEWAY_ALLOW_WRITES), with its own API client."""
    return Api.in_process(falcon.testing.TestClient(make_app(allow_writes=True)), services)


def test_writes_through_the_gateway_invalidate_what_read_their_tables(writer, table, superuser):
    api = writer
    connection = api.connection()
    other = unique("cache_u").replace("-", "_")
    superuser(f"CREATE TABLE {other} (id int PRIMARY KEY, secret text, n int)", db="demo")
    superuser(f"INSERT INTO {other} VALUES (1, 'other', 1)", db="demo")
    try:
        reader = api.query(READ.format(t=table), PARAMS, connection=connection, cache_ttl=60)
        joined = api.query(f"SELECT o.secret FROM {other} o JOIN {table} t ON t.id = o.id", connection=connection,
                           cache_ttl=60)
        untouched = api.query(f"SELECT secret FROM {other}", connection=connection, cache_ttl=60)
        update = api.query(f"UPDATE {table} SET secret = :s WHERE id = 1", {"s": {"type": "str"}},
                           connection=connection)
        secret = api.key([reader, joined, untouched, update], [connection], allow_writes=True)
        for name in (reader, joined, untouched):
            assert api.call(name, secret).headers["X-Cache"] == "miss"
        superuser(f"UPDATE {other} SET secret = 'outside' WHERE id = 1", db="demo")
        wrote = api.call(update, secret, {"s": "through-the-gateway"})
        assert wrote.status == 200 and "X-Cache" not in wrote.headers, wrote
        after = api.call(reader, secret)
        assert after.headers["X-Cache"] == "miss" and secrets(after)[0] == "through-the-gateway"
        assert api.call(joined, secret).headers["X-Cache"] == "miss"      # reads the written table too
        kept = api.call(untouched, secret)
        assert kept.headers["X-Cache"] == "hit" and secrets(kept) == ["other"]   # another table: kept
        # an ad-hoc write invalidates the same way
        assert api.call(reader, secret).headers["X-Cache"] == "hit"
        adhoc = api.adhoc(secret, {"connection_name": connection, "sql": f"UPDATE {table} SET n = n + 1"})
        assert adhoc.status == 200, adhoc
        assert api.call(reader, secret).headers["X-Cache"] == "miss"
    finally:
        superuser(f"DROP TABLE IF EXISTS {other}", db="demo")


def test_metrics_count_hits_misses_and_bytes(app, api, endpoint, table):
    ep = endpoint(READ.format(t=table), PARAMS, cache_ttl=60)
    cache = app.parts.cache
    # The session's app shares its catalog bus's worker id with the apps other tests make in this process
    # (fleet.shared.bus: one per process), so it may learn of the new query a moment late: wait for it.
    wait_until(lambda: api.call(ep.query, ep.secret, {"page_size": "1"}).status == 200, 5, what="the new query")
    hits, misses = cache.hits, cache.misses
    states = [api.call(ep.query, ep.secret).headers.get("X-Cache") for _ in range(2)]
    states.append(api.call(ep.query, ep.secret, {"cache": "false"}).headers.get("X-Cache"))
    assert states == ["miss", "hit", "bypass"], states
    assert (cache.hits - hits, cache.misses - misses) == (1, 1) and cache.memory.bytes > 0
    app.parts.history.flush() if hasattr(app.parts.history, "flush") else None
    text = api.request("GET", "/metrics", headers=METRICS_AUTH).text
    for name in ("gateway_cache_hits_total", "gateway_cache_misses_total", "gateway_cache_shared_fills_total",
                 "gateway_cache_evictions_total", "gateway_cache_bytes", "gateway_cache_entries"):
        assert name in text, name


def test_changes_of_queries_never_cached_announce_no_purge(api, endpoint, table, services):
    """A fleet that caches nothing pays nothing: no purge (no second round of acknowledgements) for a
    change of a query none of whose versions has a TTL; one for a query that has."""
    client = services.redis_client()
    try:
        def purges() -> int:
            return int(client.get("gw:{fleet}:cache:seq") or 0)
        plain = endpoint(READ.format(t=table), PARAMS)
        before = purges()
        api.ok("POST", f"/queries/{plain.query}/versions", {"sql": READ.format(t=table), "parameters": PARAMS,
                                                             "connection_name": plain.connection, "publish": True})
        api.ok("POST", f"/queries/{plain.query}/unpublish", {})
        assert purges() == before
        cached = endpoint(READ.format(t=table), PARAMS, cache_ttl=60)
        before = purges()
        api.ok("POST", f"/queries/{cached.query}/unpublish", {})
        assert purges() == before + 1
        api.ok("PATCH", f"/queries/{plain.query}/versions/1", {"cache_ttl": 0})   # set_cache_ttl always purges
        assert purges() == before + 2
    finally:
        client.close()
