"""A write through the gateway racing a management change (a PostgreSQL and Redis of this
module's own, ``private_services``, whose catalog holds only what these tests save): a cached
query published while a slow write runs must not keep the answer it read before the write
committed, once the write is answered."""
from __future__ import annotations

import threading

import falcon.testing
import pytest

from fleet.app import create_app
from gateway.settings import Settings
from helpers.api import Api
from helpers.util import ADMIN_KEY, SECRET_KEY, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def writer(private_services, tmp_path):
    app = create_app(Settings(database_url=private_services.store_url, redis_url=private_services.redis_url,
                              admin_key=ADMIN_KEY, secret_key=SECRET_KEY, home=str(tmp_path), log_level="error",
                              allow_writes=True, allow_functions="pg_sleep"))
    wait_until(lambda: app.parts.cache._sync.fresh(), 10, what="the cache bus")
    yield Api.in_process(falcon.testing.TestClient(app), private_services)
    app.parts.close()


def test_a_cached_query_published_during_a_slow_write_is_invalidated_by_it(writer, private_services):
    api = writer
    private_services.sql("DROP TABLE IF EXISTS cache_race; CREATE TABLE cache_race (id int PRIMARY KEY, v text); "
                         "INSERT INTO cache_race VALUES (1, 'old')", db="postgres")
    connection = api.connection(password=private_services.pg.password())
    write = api.query("UPDATE cache_race SET v = 'new' FROM (SELECT pg_sleep(1.5)) AS slept WHERE id = 1",
                      connection=connection)
    secret = api.key([write], [connection], allow_writes=True)
    wrote: list = []
    writing = threading.Thread(target=lambda: wrote.append(api.call(write, secret)))
    writing.start()
    # The write runs, on the catalog of its start.
    wait_until(lambda: private_services.sql("SELECT 1 FROM pg_stat_activity WHERE wait_event = 'PgSleep'",
                                            db="postgres"), 10, 0.01, "the write running")
    read = api.query("SELECT v FROM cache_race WHERE id = 1", connection=connection, cache_ttl=600)
    secret = api.key([read, write], [connection], allow_writes=True)
    before = api.call(read, secret)               # the write has not committed: the older row, cached
    writing.join()
    assert before.json == [{"v": "old"}] and before.headers["X-Cache"] == "miss"
    assert wrote[0].status == 200 and wrote[0].headers.get("X-Rows-Affected") == "1", wrote[0]
    after = api.call(read, secret)
    assert after.json == [{"v": "new"}], after.headers["X-Cache"]
