"""Purges while Redis stalls (SIGSTOP, then SIGCONT: its data and every connection survive) for
less than the freshness lease: two in-process apps on a PostgreSQL and Redis of this module's
own (``private_services``), one serving, one purging. A worker whose lease never ran out keeps
serving from memory and filling from the shared tier, so a purge that Redis did not take must
be delivered once it answers again, not merely waited out."""
from __future__ import annotations

import threading
import time

import falcon.testing
import pytest

from fleet.app import create_app
from gateway.settings import Settings
from helpers.api import Api
from helpers.services import stalled
from helpers.util import ADMIN_KEY, SECRET_KEY, wait_until

pytestmark = pytest.mark.slow

LEASE_MS = 3000


def _apps(private_services, tmp_path, **settings):
    """A serving and a purging app on this module's servers with ``settings``, once their cache
    buses are fresh: (the apps, an API client of each); closed after."""
    made = [create_app(Settings(
        database_url=private_services.store_url, redis_url=private_services.redis_url, admin_key=ADMIN_KEY,
        secret_key=SECRET_KEY, home=str(tmp_path / name), log_level="error", cache_shared="on",
        sync_timeout_ms=1000, allow_writes=True, **settings)) for name in ("serving", "purging")]
    for app in made:
        wait_until(lambda a=app: a.parts.cache._sync.fresh(), 10, what="the cache bus")
    try:
        yield made, [Api.in_process(falcon.testing.TestClient(a), private_services) for a in made]
    finally:
        for app in made:
            app.parts.close()


@pytest.fixture
def pair(private_services, tmp_path):
    """(serving app, purging app, an API client of each)."""
    for (serving, purging), apis in _apps(private_services, tmp_path, freshness_lease_ms=LEASE_MS, bus_ping_ms=100,
                                          allow_functions="pg_sleep"):
        yield serving, purging, *apis


@pytest.fixture
def cached(pair, private_services):
    """A query cached by the serving app (memory and shared tier); its table changed outside the
    gateway afterwards: (serving api, purging api, query, secret)."""
    serving, purging, serving_api, purging_api = pair
    private_services.sql("DROP TABLE IF EXISTS cache_stall; CREATE TABLE cache_stall (v int); "
                         "INSERT INTO cache_stall VALUES (1)", db="postgres")
    connection = purging_api.connection(password=private_services.pg.password())
    query = purging_api.query("SELECT v FROM cache_stall", connection=connection, cache_ttl=600)
    secret = purging_api.key([query], [connection])
    wait_until(lambda: serving_api.call(query, secret).status == 200, 5, what="the query on the serving app")
    assert serving_api.call(query, secret).headers["X-Cache"] == "hit"
    private_services.sql("UPDATE cache_stall SET v = 2", db="postgres")
    return serving_api, purging_api, query, secret


def test_a_purge_that_missed_the_shared_tier_in_a_short_stall_still_empties_it(cached, private_services):
    """A stall longer than the shared tier's timeout (0.25 s) and shorter than the bus's (0.5 s):
    the bus carries the purge to every worker, which must not then fill from the older entry."""
    serving_api, purging_api, query, secret = cached
    resume = stalled(private_services, 0.4)
    try:
        purged = purging_api.manage("DELETE", "/cache/entries", params={"query": query})
    finally:
        resume.join()
    assert purged.status == 204, purged
    after = serving_api.call(query, secret)
    assert after.json == [{"v": 2}], (after.headers.get("X-Cache"), purged.headers.get("X-Cache-Invalidated"))


def test_a_purge_not_published_in_a_stall_shorter_than_the_lease_still_reaches_every_worker(cached,
                                                                                               private_services):
    """A stall longer than the bus's timeout (0.5 s) and shorter than the lease (3 s): no worker's
    lease runs out, so waiting it out proves nothing; the purge must reach them once Redis answers."""
    serving_api, purging_api, query, secret = cached
    resume = stalled(private_services, 1.2)
    try:
        purged = purging_api.manage("DELETE", "/cache/entries", params={"query": query})
    finally:
        resume.join()
    assert purged.status == 204, purged
    after = serving_api.call(query, secret)
    assert after.json == [{"v": 2}], (after.headers.get("X-Cache"), purged.headers.get("X-Cache-Invalidated"))


def test_a_fill_that_read_before_a_redis_restart_is_not_shared_after_a_purge(pair, private_services):
    """Redis restarted without persistence loses the shared tier's purge generation: counted again
    from 0, it may come back to the very value a fill in flight took before the restart, and the
    fill's answer (read before a write made after the restart) would be stored for every worker."""
    serving, purging, serving_api, purging_api = pair
    sql = private_services.sql
    sql("DROP TABLE IF EXISTS cache_aba; CREATE TABLE cache_aba (id int PRIMARY KEY, v text); "
        "INSERT INTO cache_aba VALUES (1, 'old')", db="postgres")
    connection = purging_api.connection(password=private_services.pg.password())
    read = purging_api.query("SELECT v, pg_sleep(4) AS slept FROM cache_aba WHERE id = 1", connection=connection,
                             cache_ttl=600)
    other = purging_api.query("SELECT 1 AS one", connection=connection, cache_ttl=600)
    write = purging_api.query("UPDATE cache_aba SET v = 'new' WHERE id = 1", connection=connection)
    secret = purging_api.key([read, other, write], [connection], allow_writes=True)
    wait_until(lambda: serving_api.call(other, secret).status == 200, 5, what="the queries on the serving app")
    client = private_services.redis_client()
    gen = "gw:{fleet}:cache:gen"
    try:
        for _ in range(20):   # a generation the purges after the restart will reach again
            purging_api.manage("DELETE", "/cache/entries", params={"query": other})
        taken = int(client.get(gen))
        leader: list = []
        filling = threading.Thread(target=lambda: leader.append(purging_api.call(read, secret)))
        filling.start()
        wait_until(lambda: sql("SELECT 1 FROM pg_stat_activity WHERE wait_event = 'PgSleep'", db="postgres"), 10,
                   0.02, "the fill reading (it took the generation before)")
        private_services.redis.stop()
        private_services.redis.start()
        for app in (serving, purging):
            wait_until(lambda a=app: a.parts.cache._sync.fresh(), 10, what="the cache bus back")
        client = private_services.redis_client()
        while int(client.get(gen) or 0) < taken - 1:
            purging_api.manage("DELETE", "/cache/entries", params={"query": other})
        wrote = purging_api.call(write, secret)
        assert wrote.status == 200 and wrote.headers.get("X-Rows-Affected") == "1", wrote
        filling.join()
        assert leader[0].json[0]["v"] == "old"
        after = serving_api.call(read, secret)        # after the write was answered
        assert after.json[0]["v"] == "new", after.headers.get("X-Cache")
    finally:
        client.close()


def test_a_purge_redis_refused_for_lack_of_memory_is_not_undone_by_the_shared_tier(cached, private_services):
    """Redis full (maxmemory, noeviction: every write refused, every read answered): no purge nor
    heartbeat gets in, so every worker stops trusting its memory; it must not trust the shared
    tier either, which still holds what the purge could not drop."""
    serving_api, purging_api, query, secret = cached
    client = private_services.redis_client()
    try:
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1")
        purged = purging_api.manage("DELETE", "/cache/entries", params={"query": query})
        assert purged.status == 204 and "degraded" in purged.headers["X-Cache-Invalidated"], purged.headers
        after = serving_api.call(query, secret)
        assert after.status == 200 and after.json == [{"v": 2}], after.headers.get("X-Cache")
    finally:
        client.config_set("maxmemory", "0")
        client.close()


@pytest.fixture
def slow_ping(private_services, tmp_path):
    """(serving app, its API, purging app's API): bus pings every 2 s, a lease of 6 s."""
    for (serving, _), apis in _apps(private_services, tmp_path, freshness_lease_ms=6000, bus_ping_ms=2000):
        yield serving, *apis


def test_a_write_whose_purge_redis_missed_in_a_stall_reaches_every_worker_within_the_lease(slow_ping,
                                                                                           private_services):
    """A stall (1 s) longer than the publish's timeout (0.5 s) that falls between two of a worker's
    heartbeats: its lease never runs out, so the write's degraded purge must be delivered once
    Redis answers again; the worker may serve the older answer within the lease, not after."""
    serving, serving_api, purging_api = slow_ping
    private_services.sql("DROP TABLE IF EXISTS cache_gap; CREATE TABLE cache_gap (id int PRIMARY KEY, v text); "
                         "INSERT INTO cache_gap VALUES (1, 'old')", db="postgres")
    connection = purging_api.connection(password=private_services.pg.password())
    read = purging_api.query("SELECT v FROM cache_gap", connection=connection, cache_ttl=600)
    write = purging_api.query("UPDATE cache_gap SET v = 'new' WHERE id = 1", connection=connection)
    secret = purging_api.key([read, write], [connection], allow_writes=True)
    wait_until(lambda: serving_api.call(read, secret).status == 200, 5, what="the query on the serving app")
    assert serving_api.call(read, secret).headers["X-Cache"] == "hit"
    sync = serving.parts.cache._sync
    renewed = sync._fresh_until
    wait_until(lambda: sync._fresh_until != renewed, 5, what="a pong")   # the next heartbeat is 2 s away
    resume = stalled(private_services, 1.0)
    try:
        wrote = purging_api.call(write, secret)
        answered = time.monotonic()
    finally:
        resume.join()
    assert wrote.status == 200 and "degraded" in wrote.headers["X-Cache-Invalidated"], wrote.headers
    assert sync.fresh()                           # the worker never stopped trusting its memory
    seen = []
    while time.monotonic() - answered < 6.5 and seen[-1:] != ["new"]:
        seen.append(serving_api.call(read, secret).json[0]["v"])
        time.sleep(0.1)
    assert seen[-1] == "new", f"'old' served {len(seen)} times over {time.monotonic() - answered:.1f} s"
