"""gateway/pipeline/from_memory.py: a call the pipeline answered from the cache, answered again
without it. Its answer must be the pipeline's for the same request, byte for byte but for what
each call makes anew (the request id, the freshness headers); and each condition it rests on,
taken away, must make it say no (the pipeline then answers, with its own rules)."""
from __future__ import annotations

import datetime
import gc
import re
import time

import pytest

from gateway.pipeline.from_memory import REPLAYABLE
from helpers.history import wait_for_history

FIELDS = (("HOST", "gateway.test"), ("ACCEPT", "*/*"))
PEER = "127.0.0.1"
MADE_PER_CALL = {"x-request-id", "age", "cache-control"}


def _call(client, target: str, secret: str, fields: tuple = FIELDS, **headers) -> object:
    """Through the pipeline, as the server hands it a plain GET it may ask for again."""
    path, _, query = target.partition("?")
    return client.simulate_get(path, query_string=query, headers={"X-API-Key": secret, **headers},
                               extras={REPLAYABLE: (target, fields)}, remote_addr=PEER)


def _again(app, target: str, secret: str, fields: tuple = FIELDS, peer: str = PEER) -> object:
    return app.from_memory(target, fields, peer, secret)


def _cached(client, endpoint, sql: str = "SELECT 1 AS one", **fields) -> tuple:
    ep = endpoint(sql, cache_ttl=60, **fields)
    target = f"/q/{ep.query}"
    assert _call(client, target, ep.secret).headers["X-Cache"] == "miss"
    return ep, target


def _both(client, app, target: str, secret: str, fields: tuple = FIELDS, **headers) -> tuple:
    """The pipeline's answer to a request and the one made again without it. A catalog change
    from an earlier test, arriving between the two, rightly makes the second None (another
    snapshot): the pair is taken again then, three times at most."""
    for _ in range(3):
        result = _call(client, target, secret, fields, **headers)
        answer = _again(app, target, secret, fields)
        if answer is not None:
            break
    return result, answer


def _same_answer(result, answer) -> None:
    """The pipeline's answer (``result``) and the one made without it: the same status, headers
    in the same order with the same values (those made per call: present, well formed), body."""
    assert answer.status == result.status
    theirs = [(name.lower(), value) for name, value in result.headers.items()]
    ours = list(answer.headers)
    assert [name for name, _ in ours] == [name for name, _ in theirs]
    assert [h for h in ours if h[0] not in MADE_PER_CALL] == [h for h in theirs if h[0] not in MADE_PER_CALL]
    made = dict(ours)
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]+", made["x-request-id"])
    assert made["x-request-id"] != result.headers["x-request-id"]
    assert abs(int(made["age"]) - int(result.headers["age"])) <= 1
    their_age = int(result.headers["cache-control"].rpartition("=")[2])
    assert re.fullmatch(r"private, max-age=\d+", made["cache-control"])
    assert abs(int(made["cache-control"].rpartition("=")[2]) - their_age) <= 1
    assert answer.body == result.content


@pytest.mark.parametrize("query", ["", "?format=csv", "?page_size=1&page=2"])
def test_the_answer_is_the_pipelines(app, client, endpoint, query):
    ep = endpoint("SELECT g AS n, 'x' || g AS label FROM generate_series(1, 3) g", cache_ttl=60)
    target = f"/q/{ep.query}{query}"
    assert _call(client, target, ep.secret).headers["X-Cache"] == "miss"
    result, answer = _both(client, app, target, ep.secret)
    assert result.status_code == 200 and result.headers["X-Cache"] == "hit"
    _same_answer(result, answer)


def test_a_304_is_the_pipelines(app, client, endpoint):
    ep, target = _cached(client, endpoint)
    etag = _call(client, target, ep.secret).headers["ETag"]
    fields = (*FIELDS, ("IF-NONE-MATCH", etag))
    assert _call(client, target, ep.secret, fields, **{"If-None-Match": etag}).status_code == 304
    result, answer = _both(client, app, target, ep.secret, fields, **{"If-None-Match": etag})
    assert result.status_code == 304 and answer.body == b""
    _same_answer(result, answer)
    assert _both(client, app, target, ep.secret)[1].status.startswith("200")   # without the header: the body


def test_a_masked_key_gets_its_own_answer(app, client, endpoint, api):
    ep, target = _cached(client, endpoint, "SELECT id, email FROM customers ORDER BY id LIMIT 2")
    masked = api.key([ep.query], [ep.connection], mask=[{"column": "customers.email", "action": "null"}])
    assert _call(client, target, masked).headers["X-Cache"] == "hit"
    result, answer = _both(client, app, target, masked)
    assert b"@" not in answer.body and b'"email":null' in answer.body
    _same_answer(result, answer)
    assert _again(app, target, ep.secret) is None         # learned before the new key: another catalog
    unmasked, again = _both(client, app, target, ep.secret)
    assert b"@" in unmasked.content and again.body == unmasked.content     # each key its own


def test_the_call_is_recorded_and_counted(app, client, endpoint, superuser):
    ep, target = _cached(client, endpoint)
    cache = app.parts.cache
    hits, answered = cache.hits, app.from_memory.answered
    answer = _again(app, target, ep.secret)
    assert (cache.hits, app.from_memory.answered) == (hits + 1, answered + 1)
    request_id = dict(answer.headers)["x-request-id"]
    key_id = superuser("SELECT id FROM gw_api_keys WHERE name = %s", (ep.key,))[0][0]
    assert wait_for_history(superuser, [request_id]) == {request_id: (ep.query, 1, 200, None, 1, key_id)}


def test_only_the_same_request(app, client, endpoint):
    ep, target = _cached(client, endpoint)
    assert _again(app, target, ep.secret) is not None
    assert _again(app, target, ep.secret + "x") is None                   # another (wrong) secret
    assert _again(app, target, None) is None                              # none
    assert _again(app, target + "?page=1", ep.secret) is None             # another target
    assert _again(app, target, ep.secret, (*FIELDS, ("X-FORWARDED-FOR", "10.0.0.9"))) is None   # another head
    assert _again(app, target, ep.secret, FIELDS[::-1]) is None           # the same fields, another order
    assert _again(app, target, ep.secret, peer="10.1.1.1") is None        # another peer


def test_no_while_the_catalog_would_need_the_store(app, client, endpoint):
    ep, target = _cached(client, endpoint)
    holder = app.parts.holder
    until = holder.fresh_until
    holder.distrust()
    try:
        assert _again(app, target, ep.secret) is None
    finally:
        holder.renew(until)


def test_no_after_a_change_of_the_key(app, client, endpoint, api):
    ep, target = _cached(client, endpoint)
    api.ok("PATCH", f"/api-keys/{ep.key}", {"max_rows": 5})
    assert _again(app, target, ep.secret) is None
    api.ok("PATCH", f"/api-keys/{ep.key}", {"active": False})
    assert _again(app, target, ep.secret) is None
    assert _call(client, target, ep.secret).status_code == 401


def test_no_once_the_key_expired(app, client, endpoint, api):
    """Nothing in the catalog changes when a key expires: ``identify``'s own clock decides."""
    ep, target = _cached(client, endpoint)
    at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=2)
    api.ok("PATCH", f"/api-keys/{ep.key}", {"expires_at": at.isoformat()})
    assert _call(client, target, ep.secret).headers["X-Cache"] == "hit"   # learned under the new catalog
    assert _again(app, target, ep.secret) is not None
    time.sleep(max(0.0, at.timestamp() - time.time()) + 0.2)     # a sleep that is the test: the key expires
    assert _again(app, target, ep.secret) is None
    refused = _call(client, target, ep.secret)
    assert refused.status_code == 401 and refused.json["code"] == "key_expired"


def test_no_once_the_entry_is_purged_or_filled_again(app, client, endpoint, api):
    ep, target = _cached(client, endpoint)
    api.ok("DELETE", f"/cache/entries?query={ep.query}")
    assert _again(app, target, ep.secret) is None
    # Filled again by another request (another head): the entry held is not the one learned.
    assert _call(client, target, ep.secret, (("HOST", "other"),)).headers["X-Cache"] == "miss"
    assert _again(app, target, ep.secret, (("HOST", "other"),)) is not None
    assert _again(app, target, ep.secret) is None


def test_no_while_the_cache_bus_may_have_missed_a_purge(app, client, endpoint, monkeypatch):
    """Redis away (or this worker's cache lease run out): a purge may have been sent that this
    worker did not hear. The pipeline then asks the store's purge counter before it serves
    memory; an answer made without it must not serve memory at all (issue 14, item 7)."""
    ep, target = _cached(client, endpoint)
    assert _again(app, target, ep.secret) is not None
    monkeypatch.setattr(app.parts.cache._sync, "fresh", lambda: False)
    assert _again(app, target, ep.secret) is None


def test_no_once_the_schema_trees_changed(app, client, endpoint, monkeypatch):
    """A partition attached or detached changes what the plan reads (``SchemaCache.kin``) and
    so the entry a call is keyed to, with the catalog unchanged."""
    ep, target = _cached(client, endpoint)
    assert _again(app, target, ep.secret) is not None
    monkeypatch.setattr(app.from_memory._schemas, "kin", lambda connection: object())
    assert _again(app, target, ep.secret) is None


def test_never_for_a_key_admitted_through_redis_or_a_call_that_asks_for_the_database(app, client, endpoint, api):
    ep, target = _cached(client, endpoint)
    api.ok("PATCH", f"/api-keys/{ep.key}", {"max_concurrent": 2})
    assert _call(client, target, ep.secret).headers["X-Cache"] == "hit"
    assert _again(app, target, ep.secret) is None
    other, other_target = _cached(client, endpoint, "SELECT 2 AS two")
    fields = (*FIELDS, ("CACHE-CONTROL", "no-cache"))
    assert _call(client, other_target, other.secret, fields, **{"Cache-Control": "no-cache"}).status_code == 200
    assert _again(app, other_target, other.secret, fields) is None


def _learned(app, target: str) -> object:
    return next(record for request, record in app.from_memory._learned.items() if request[0] == target)


def test_what_is_learned_holds_nothing_the_cache_let_go(app, client, endpoint, api):
    """The cache's byte bound holds: a purged entry (and the body made of it) is freed, not kept
    by the call learned from it; and a change of the catalog lets go of the calls learned under
    the old snapshot (and with them that snapshot)."""
    ep, target = _cached(client, endpoint, "SELECT repeat('x', 100000) AS pad")
    learned = _learned(app, target)
    entry, view = learned.entry, learned.view
    assert entry() is not None and view() is not None
    api.ok("DELETE", f"/cache/entries?query={ep.query}")
    gc.collect()
    assert entry() is None and view() is None
    assert _again(app, target, ep.secret) is None
    other, other_target = _cached(client, endpoint, "SELECT 3 AS three")   # another catalog (a new query)
    assert [request[0] for request in app.from_memory._learned] == [other_target]
