"""``max_concurrent`` side by side: the same key (max_concurrent 2) sends three slow calls at once
to QueryAPIGate 0.43.0 and to this gateway; both let two run and refuse one the same way
(status, code, ``Retry-After``, the body's ``retry_after`` and ``max_concurrent``). Not one of
``compat_calls``: those are sent one after another, and this needs calls at once."""
from __future__ import annotations

import threading

from conftest import PEER_ADMIN_KEY

from helpers.api import Api
from helpers.util import unique

SLOW_S = 3.0


def attack(api: Api, base: str, n: int, calls: int) -> list:
    connection = api.connection()
    query = api.query("SELECT true AS slept FROM pg_sleep(:s)", {"s": "float"}, connection=connection,
                      description="Sleeps")
    secret = api.key([query], [], name=unique("mc"), max_concurrent=n)
    start = threading.Barrier(calls)
    got: list = [None] * calls

    def one(i: int) -> None:
        start.wait()
        got[i] = api.call(query, secret, params={"s": str(SLOW_S)})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def test_max_concurrent_answers_as_queryapigate(peer_server, gunicorn, services):
    peer = Api.over_http(peer_server.base_url, services)
    peer.admin = {"X-API-Key": PEER_ADMIN_KEY}
    ours = Api.over_http(gunicorn.base, services)
    try:
        theirs_got, ours_got = attack(peer, peer_server.base_url, 2, 3), attack(ours, gunicorn.base, 2, 3)
    finally:
        peer.close()
        ours.close()
    for side, got in (("peer", theirs_got), ("ours", ours_got)):
        assert sorted(r.status for r in got) == [200, 200, 429], (side, got)
        assert [r.json for r in got if r.status == 200] == [[{"slept": True}]] * 2, (side, got)
    [theirs] = [r for r in theirs_got if r.status == 429]
    [mine] = [r for r in ours_got if r.status == 429]
    assert mine.json["code"] == theirs.json["code"] == "too_many_concurrent"
    assert mine.headers["Retry-After"] == theirs.headers["Retry-After"] == "1"
    for field in ("retry_after", "max_concurrent"):
        assert mine.json[field] == theirs.json[field], field
    assert set(theirs.json) == set(mine.json), (theirs.json, mine.json)
