"""A slow database through a real gunicorn master (1 worker, 8 threads): one data connection
that stops answering (a table locked ``ACCESS EXCLUSIVE``) holds its bulkhead's share of the
worker's threads (6 of 8), and calls to another connection keep their latency.

Before the bulkhead, the calls to the locked table took all 8 threads and a call to the other
connection waited for a thread until the lock went (here ~6 s).
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg2
import pytest
import requests

from helpers.api import Api
from helpers.masters import Master
from helpers.util import unique, wait_until

LOCK_S = 6.0


@pytest.fixture(scope="module")
def master(services, tmp_path_factory):
    one = Master(services, tmp_path_factory.mktemp("slowdb-master"), workers=1, threads=8, cpus="off")
    try:
        yield one.start(60)
    finally:
        one.stop()


def waiting_on_lock(services, table: str) -> int:
    return services.sql("SELECT count(*) FROM pg_locks WHERE relation = %s::regclass AND NOT granted",
                        (table,), db="demo")[0][0]


def test_a_locked_table_holds_its_connections_share_and_the_other_connection_keeps_its_latency(master, services):
    api = Api.over_http(master.base, services)
    table = unique("stuck")
    services.sql(f"CREATE TABLE {table} (id int); INSERT INTO {table} VALUES (1)", db="demo")
    holder = psycopg2.connect(services.pg.url("demo"))
    pool = ThreadPoolExecutor(16)
    try:
        stuck = api.endpoint(f"SELECT count(*) AS n FROM {table}")                       # the demo database
        other = api.endpoint("SELECT 1 AS one", connection=api.connection(database="postgres"))

        def call(ep):
            started = time.monotonic()
            got = requests.get(f"{master.base}/q/{ep.query}", headers={"X-API-Key": ep.secret}, timeout=60)
            return got, time.monotonic() - started

        for ep in (stuck, other):   # sessions open, statements prepared
            assert call(ep)[0].status_code == 200
        quiet = sorted(call(other)[1] for _ in range(20))

        holder.cursor().execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        locked_at = time.monotonic()
        release = threading.Timer(LOCK_S, holder.rollback)
        release.start()
        blocked = [pool.submit(call, stuck) for _ in range(14)]
        wait_until(lambda: waiting_on_lock(services, table) >= 6, 10, what="the stuck calls waiting on the lock")
        # A sleep that is the test: past GATEWAY_CONNECTION_STALL_MS (500 ms) the calls past the
        # share are refused; the bulkhead shows no sign of the moment.
        time.sleep(0.7)
        during = [call(other) for _ in range(20)]
        slowest = max(took for _, took in during)
        # Before the bulkhead the first of these waited for a thread until the lock went.
        assert slowest < max(0.5, 10 * quiet[-1]), (slowest, quiet)
        assert time.monotonic() - locked_at < LOCK_S - 0.5, "measured after the lock went: the machine is too slow"
        assert waiting_on_lock(services, table) == 6     # the share, not every thread
        results = [f.result() for f in blocked]
        release.join()
    finally:
        holder.close()
        pool.shutdown(wait=True)
        api.close()
        services.sql(f"DROP TABLE IF EXISTS {table}", db="demo")

    assert all(got.status_code == 200 and got.json() == [{"one": 1}] for got, _ in during), during
    statuses = sorted(got.status_code for got, _ in results)
    assert statuses == [200] * 6 + [503] * 8, statuses              # the share ran once the lock went
    for got, took in results:
        if got.status_code == 503:
            assert got.json()["code"] == "connection_busy" and got.headers["Retry-After"] == "1"
            assert took < 1.0, took                                  # refused at once, not after the lock
