"""The cache with Redis away (a PostgreSQL and Redis of this module's own, ``private_services``):
the shared tier is a miss, each worker's memory keeps serving while the store's purge counter
says no purge happened, a purge made meanwhile still empties every worker's memory before any
of it is served again, and the shared tier is emptied when Redis is back."""
from __future__ import annotations

import time

import falcon.testing
import pytest

from fleet.app import create_app
from gateway.settings import Settings
from helpers.api import Api
from helpers.util import ADMIN_KEY, SECRET_KEY, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def isolated(private_services, tmp_path):
    settings = Settings(database_url=private_services.store_url, redis_url=private_services.redis_url,
                        admin_key=ADMIN_KEY, secret_key=SECRET_KEY, home=str(tmp_path), log_level="error",
                        cache_shared="on", freshness_lease_ms=600, bus_ping_ms=100, sync_timeout_ms=1000)
    app = create_app(settings)
    api = Api.in_process(falcon.testing.TestClient(app), private_services)
    wait_until(lambda: app.parts.cache._sync.fresh(), 10, what="the cache bus")
    yield app, api
    app.parts.close()


def test_memory_keeps_serving_without_redis_and_purges_still_hold(isolated, private_services):
    app, api = isolated
    sql = private_services.sql
    sql("DROP TABLE IF EXISTS cache_fail; CREATE TABLE cache_fail (v int); INSERT INTO cache_fail VALUES (1)",
        db="postgres")
    connection = api.connection(password=private_services.pg.password())
    query = api.query("SELECT v FROM cache_fail", connection=connection, cache_ttl=600)
    secret = api.key([query], [connection])
    assert api.call(query, secret).headers["X-Cache"] == "miss"
    assert api.call(query, secret).headers["X-Cache"] == "hit"
    private_services.redis.stop()
    try:
        wait_until(lambda: not app.parts.cache._sync.fresh(), 5, what="the cache's lease to run out")
        # The first call away from the bus empties memory (it cannot know what it missed) ...
        first = api.call(query, secret)
        assert first.status == 200 and first.headers["X-Cache"] == "miss", first
        # ... then memory serves again: the store's purge counter has not moved.
        assert [api.call(query, secret).headers["X-Cache"] for _ in range(5)] == ["hit"] * 5
        sql("UPDATE cache_fail SET v = 2", db="postgres")
        started = time.monotonic()
        purged = api.manage("DELETE", "/cache/entries", params={"query": query})
        assert purged.status == 204 and "degraded" in purged.headers["X-Cache-Invalidated"], purged.headers
        assert time.monotonic() - started >= 0.6       # waited out the lease: every worker stopped trusting
        after = api.call(query, secret)
        assert after.headers["X-Cache"] == "miss" and after.json == [{"v": 2}], after
        assert api.call(query, secret).headers["X-Cache"] == "hit"
    finally:
        private_services.redis.start()
    wait_until(lambda: app.parts.cache._sync.fresh(), 10, what="the cache bus back")
    back = api.call(query, secret)
    assert back.status == 200 and back.json == [{"v": 2}]
    assert api.call(query, secret).headers["X-Cache"] == "hit"


def test_a_forged_shared_entry_is_a_miss(isolated, private_services):
    app, api = isolated
    connection = api.connection(password=private_services.pg.password())
    query = api.query("SELECT 42 AS v", connection=connection, cache_ttl=600)
    secret = api.key([query], [connection])
    assert api.call(query, secret).headers["X-Cache"] == "miss"
    client = private_services.redis_client()
    try:
        keys = client.keys("gw:{fleet}:cache:e:*")
        assert keys
        for key in keys:
            raw = client.get(key)
            client.set(key, raw[:16] + raw[16:].replace(b"*", b"+"))   # one byte of the rows changed
    finally:
        client.close()
    app.parts.cache.memory.clear()
    forged = api.call(query, secret)
    assert forged.headers["X-Cache"] == "miss" and forged.json == [{"v": 42}], forged
