"""gateway/pipeline/from_memory.py: the server answers a call on its loop only when nothing in it
can wait on I/O. Each case takes away one of the conditions and expects no: a loop that guessed
yes then would read the store, ask Redis or the database on the thread every connection waits on."""
from __future__ import annotations


def _call(client, query: str, secret: str, **headers) -> object:
    raw = f"/q/{query}"
    return client.simulate_get(raw, headers={"X-API-Key": secret, **headers}, extras={"RAW_URI": raw})


def _cached(client, endpoint) -> tuple:
    ep = endpoint("SELECT 1 AS one", cache_ttl=60)
    assert _call(client, ep.query, ep.secret).status_code == 200
    return ep, f"/q/{ep.query}"


def test_a_call_answered_from_memory_is_recognised_and_only_it(app, client, endpoint):
    ep, raw = _cached(client, endpoint)
    assert app.from_memory(raw, ep.secret)
    assert not app.from_memory(raw, ep.secret + "x")              # another key
    assert not app.from_memory(raw + "?page=1", ep.secret)        # another target


def test_no_while_the_catalog_would_need_the_store(app, client, endpoint):
    ep, raw = _cached(client, endpoint)
    holder = app.parts.holder
    until = holder.fresh_until
    holder.distrust()
    try:
        assert not app.from_memory(raw, ep.secret)
    finally:
        holder.renew(until)


def test_no_once_the_entry_is_gone(app, client, endpoint, api):
    ep, raw = _cached(client, endpoint)
    api.ok("DELETE", f"/cache/entries?query={ep.query}")
    assert not app.from_memory(raw, ep.secret)


def test_no_after_a_change_of_the_catalog(app, client, endpoint, api):
    ep, raw = _cached(client, endpoint)
    api.ok("PATCH", f"/api-keys/{ep.key}", {"max_rows": 5})
    assert not app.from_memory(raw, ep.secret)


def test_never_for_a_key_admitted_through_redis_or_a_call_that_asks_for_the_database(app, client, endpoint, api):
    ep, raw = _cached(client, endpoint)
    api.ok("PATCH", f"/api-keys/{ep.key}", {"max_concurrent": 2})
    assert _call(client, ep.query, ep.secret).headers["X-Cache"] == "hit"
    assert not app.from_memory(raw, ep.secret)
    other = endpoint("SELECT 2 AS two", cache_ttl=60)
    raw_other = f"/q/{other.query}"
    assert _call(client, other.query, other.secret, **{"Cache-Control": "no-cache"}).status_code == 200
    assert not app.from_memory(raw_other, other.secret)
