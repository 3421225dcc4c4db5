"""A slow database: each connection's bulkhead (the threads its calls may hold in a worker) and
deadlines counted from when the request arrived (``gateway/execution/bulkhead.py``,
``gateway/execution/deadline.py``), in process on the session's PostgreSQL.

A table locked ``ACCESS EXCLUSIVE`` by a test session is the database that stops answering:
a call on it waits for the lock, holding its thread. The server's arrival stamp
(``gateway.http.common.ARRIVED``) is set through ``falcon.testing``'s ``extras``, as the
worker sets it in the WSGI environ.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import falcon.testing
import psycopg2
import pytest

from gateway.errors import GatewayError
from gateway.execution.bulkhead import Bulkhead
from gateway.execution.deadline import Deadline
from gateway.http.common import ARRIVED
from gateway.ports import LocalSync
from gateway.settings import Settings
from helpers.util import unique, wait_until


# --- the bulkhead itself (no database) ------------------------------------------------------
def far() -> Deadline:
    return Deadline(time.monotonic(), 60_000, 60_000)


def test_places_are_a_share_of_the_threads():
    assert Settings().connection_places() == 6                                   # 8 threads: 2 left to others
    assert Settings(threads=4).connection_places() == 3
    assert Settings(threads=2).connection_places() == 1
    assert Settings(threads=1).connection_places() == 1                          # at least one
    assert Settings(threads=100, connection_thread_share=0.29).connection_places() == 29
    assert Settings(threads=8, connection_thread_share=1).connection_places() == 8  # no bulkhead
    assert Settings(threads=8, pool_size=2).connection_places() == 2              # never more than the pool's
    for bad in (0, -0.5, 1.5):
        with pytest.raises(SystemExit):
            Settings(connection_thread_share=bad)


def test_a_full_bulkhead_that_moves_queues_and_one_that_stalls_refuses_at_once():
    bulkhead = Bulkhead(2, stall_ms=200)
    bulkhead.enter(far())
    bulkhead.enter(far())
    # Full, but a place moved just now: the next call waits, and gets the place given back.
    threading.Timer(0.05, bulkhead.leave).start()
    started = time.monotonic()
    bulkhead.enter(far())
    assert 0.04 < time.monotonic() - started < 0.5 and bulkhead.held == 2
    # Nothing moves any more: after the stall time a call is refused, and then at once.
    started = time.monotonic()
    with pytest.raises(GatewayError) as busy:
        bulkhead.enter(far())
    assert busy.value.code == "connection_busy" and busy.value.headers == {"Retry-After": "1"}
    assert 0.1 < time.monotonic() - started < 0.5
    started = time.monotonic()
    with pytest.raises(GatewayError) as again:
        bulkhead.enter(far())
    assert again.value.code == "connection_busy" and time.monotonic() - started < 0.01
    assert bulkhead.refused == 2 and bulkhead.held == 2


def test_a_call_never_waits_for_a_place_past_its_deadline():
    bulkhead = Bulkhead(1, stall_ms=60_000)
    bulkhead.enter(far())
    started = time.monotonic()
    with pytest.raises(GatewayError) as late:
        bulkhead.enter(Deadline(started, 300, 60_000))
    assert late.value.code == "deadline_exceeded" and late.value.status == 504
    assert 0.25 < time.monotonic() - started < 0.6
    bulkhead.leave()
    # A deadline already passed: refused even with a place free, never run late.
    with pytest.raises(GatewayError) as passed:
        bulkhead.enter(Deadline(time.monotonic() - 1, 500, 60_000))
    assert passed.value.code == "deadline_exceeded" and bulkhead.held == 0


def test_the_statement_timeout_is_what_is_left():
    now = time.monotonic()
    assert 450 <= Deadline(now - 1.5, 2000, 30_000).statement_ms() <= 500
    assert Deadline(now, None, 30_000).statement_ms() is None          # the session's own, just arrived
    assert 19_000 <= Deadline(now - 10, None, 30_000).statement_ms() <= 20_000   # waited 10 s of its 30
    with pytest.raises(GatewayError) as late:
        Deadline(now - 2.995, 3000, 30_000).statement_ms()            # 5 ms left: too little to start
    assert late.value.code == "deadline_exceeded"


# --- in process, on PostgreSQL --------------------------------------------------------------
@pytest.fixture
def locked_table(services):
    """``locked_table()`` -> (table name, lock(), unlock()): a table of the demo database that a
    session of the test can hold ``ACCESS EXCLUSIVE``."""
    made, holders = [], []

    def make():
        table = unique("stuck")
        services.sql(f"CREATE TABLE {table} (id int); INSERT INTO {table} VALUES (1), (2)", db="demo")
        made.append(table)
        holder = psycopg2.connect(services.pg.url("demo"))
        holders.append(holder)

        def lock():
            holder.cursor().execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")

        def unlock():
            holder.rollback()
        return table, lock, unlock
    yield make
    for holder in holders:
        holder.close()
    for table in made:
        services.sql(f"DROP TABLE IF EXISTS {table}", db="demo")


def waiting_on_lock(services, table: str) -> int:
    """Sessions waiting for a lock on ``table`` (of the demo database)."""
    return services.sql("SELECT count(*) FROM pg_locks WHERE relation = %s::regclass AND NOT granted",
                        (table,), db="demo")[0][0]


def call(client, ep, *, arrived: float | None = None, **params):
    extras = {} if arrived is None else {ARRIVED: arrived}
    started = time.monotonic()
    got = client.simulate_get(f"/q/{ep.query}", params=params or None, headers={"X-API-Key": ep.secret},
                              extras=extras)
    return got, time.monotonic() - started


def test_timeout_counts_from_the_arrival_stamp(make_app, endpoint):
    """(b) ``timeout=2`` for a request that arrived 3 s ago: 504 at once, nothing run (the code
    before counted from when the thread took it, ran it and answered 200)."""
    ep = endpoint("SELECT 1 AS one")
    client = falcon.testing.TestClient(make_app(sync=LocalSync()))
    got, took = call(client, ep, arrived=time.monotonic() - 3, timeout="2")
    assert (got.status_code, got.json["code"]) == (504, "deadline_exceeded"), got.text
    assert took < 0.5
    # No stamp (a server that sets none): from when the application saw it.
    assert call(client, ep, timeout="2")[0].status_code == 200
    # The server's statement timeout counts from arrival too.
    strict = falcon.testing.TestClient(make_app(sync=LocalSync(), statement_timeout_ms=2000))
    got, took = call(strict, ep, arrived=time.monotonic() - 3)
    assert (got.status_code, got.json["code"], took < 0.5) == (504, "deadline_exceeded", True), got.text
    assert call(strict, ep, arrived=time.monotonic() - 1)[0].status_code == 200


def test_a_late_call_is_not_answered_from_the_cache_either(make_app, endpoint):
    ep = endpoint("SELECT 1 AS one", cache_ttl=60)
    client = falcon.testing.TestClient(make_app(sync=LocalSync()))
    assert call(client, ep)[0].status_code == 200                       # now cached
    got, _ = call(client, ep, arrived=time.monotonic() - 3, timeout="2")
    assert (got.status_code, got.json["code"]) == (504, "deadline_exceeded"), got.text


def test_the_statement_runs_under_what_is_left_of_the_deadline(make_app, endpoint):
    """Arrived 1.5 s ago with ``timeout=2``: PostgreSQL cancels the statement 0.5 s from now,
    not 2 s (as the code before did)."""
    ep = endpoint("SELECT pg_sleep(2) AS slept")
    client = falcon.testing.TestClient(make_app(sync=LocalSync()))
    got, took = call(client, ep, arrived=time.monotonic() - 1.5, timeout="2")
    assert (got.status_code, got.json["code"]) == (504, "query_timeout"), got.text
    assert 0.35 < took < 1.2, took


@pytest.mark.parametrize("overrides, status, code, within", [
    ({}, 503, "connection_busy", (0, 0.3)),                                  # stopped moving: at once
    ({"connection_stall_ms": 60_000}, 504, "deadline_exceeded", (0.35, 1.2)),  # let wait: at its deadline
])
def test_a_call_queued_behind_a_full_bulkhead_is_refused_not_answered_late(make_app, endpoint, locked_table,
                                                                            services, overrides, status, code,
                                                                            within):
    """(c) 4 threads: 3 places. Three calls wait on a locked table and fill them; a fourth, that
    arrived 2.5 s ago with ``timeout=3``, is refused at once (503: the connection has stopped
    moving), or, where the bulkhead lets it wait, 504 at its deadline; never 200 once the lock
    goes 1.5 s later (the code before ran it under a 3 s statement timeout and answered 200 late)."""
    table, lock, unlock = locked_table()
    ep = endpoint(f"SELECT count(*) AS n FROM {table}")
    client = falcon.testing.TestClient(make_app(sync=LocalSync(), threads=4, **overrides))
    assert call(client, ep)[0].status_code == 200
    lock()
    pool = ThreadPoolExecutor(3)
    try:
        held = [pool.submit(call, client, ep) for _ in range(3)]
        wait_until(lambda: waiting_on_lock(services, table) >= 3, 10, what="three calls waiting on the lock")
        # A sleep that is the test: past GATEWAY_CONNECTION_STALL_MS (500 ms), nothing having moved
        time.sleep(0.6)
        threading.Timer(1.5, unlock).start()
        got, took = call(client, ep, arrived=time.monotonic() - 2.5, timeout="3")
        assert got.status_code == status and got.json["code"] == code, got.text
        assert within[0] < took < within[1], took
        if status == 503:
            assert got.headers["Retry-After"] == "1"
        assert [f.result()[0].status_code for f in held] == [200] * 3   # once the lock went
    finally:
        unlock()
        pool.shutdown(wait=True)


def test_calls_waiting_for_another_calls_cache_fill_hold_places_too(make_app, endpoint, locked_table, services):
    """One call fills a cached answer from a locked table; two more wait for its fill (single
    flight). Each holds a thread on that connection as the filler does, so each holds a place:
    with 3 places the fourth call is refused, not left waiting as a follower too."""
    table, lock, unlock = locked_table()
    ep = endpoint(f"SELECT count(*) AS n FROM {table}", cache_ttl=60)
    app = make_app(sync=LocalSync(), threads=4)
    client = falcon.testing.TestClient(app)
    bulkhead = app.parts.pools.bulkheads.get(app.parts.holder.catalog.connections[ep.connection])
    lock()
    pool = ThreadPoolExecutor(3)
    try:
        held = [pool.submit(call, client, ep) for _ in range(3)]
        wait_until(lambda: waiting_on_lock(services, table) == 1 and bulkhead.held == 3, 10,
                   what=lambda: f"one fill on the lock and 3 places held, held={bulkhead.held}")
        # A sleep that is the test: past GATEWAY_CONNECTION_STALL_MS (500 ms), nothing having moved
        time.sleep(0.6)
        got, took = call(client, ep)
        assert (got.status_code, got.json["code"]) == (503, "connection_busy"), got.text
        assert took < 0.3 and waiting_on_lock(services, table) == 1   # one statement only: single flight held
        unlock()
        assert [f.result()[0].json for f in held] == [[{"n": 2}]] * 3
    finally:
        unlock()
        pool.shutdown(wait=True)
    assert bulkhead.held == 0 and call(client, ep)[0].json == [{"n": 2}]


def raw_stream(app, ep, query_string: str):
    """The WSGI body of a streamed call, not read yet (as a server holds it)."""
    env = falcon.testing.create_environ(f"/q/{ep.query}", query_string=query_string,
                                        headers={"X-API-Key": ep.secret})
    return app(env, lambda status, headers, exc_info=None: None)


def test_no_path_leaks_a_place(make_app, endpoint, api, demo_connection):
    """(d) 2 threads: 1 place. Errors, timeouts, cut and abandoned streams, failed cache fills
    and ad-hoc errors each give the place back: a normal call after all of them still runs."""
    fails = endpoint("SELECT 1 / :d AS q", {"d": {"type": "int", "default": 0}})
    cached = endpoint("SELECT 1 / :d AS q", {"d": {"type": "int", "default": 0}}, cache_ttl=60)
    slow = endpoint("SELECT pg_sleep(1) AS s")
    series = endpoint("SELECT g FROM generate_series(1, 5000) g")
    cut = endpoint("SELECT g, CASE WHEN g < 4500 THEN g ELSE 1 / (g - g) END AS q FROM generate_series(1, 5000) g")
    adhoc = api.key([], [demo_connection])
    app = make_app(sync=LocalSync(), threads=2)   # made after what it serves (LocalSync: no bus)
    client = falcon.testing.TestClient(app)
    bulkhead = app.parts.pools.bulkheads.get(app.parts.holder.catalog.connections[demo_connection])
    assert bulkhead.places == 1
    for _ in range(3):
        assert call(client, fails)[0].json["code"] == "query_failed"
        assert call(client, cached)[0].json["code"] == "query_failed"
        assert call(client, slow, timeout="0.05")[0].json["code"] == "query_timeout"
        assert call(client, fails, stream="true", format="csv")[0].json["code"] == "query_failed"
        with pytest.raises(GatewayError):   # cut after its first rows were sent
            call(client, cut, stream="true", format="csv")
        body = raw_stream(app, series, "stream=true&format=csv")
        next(iter(body))
        body.close()                      # the client went away after the first chunk
        raw_stream(app, series, "stream=true&format=ndjson").close()   # before the first
        got = client.simulate_post("/execute_sql", headers={"X-API-Key": adhoc},
                                   json={"connection_name": demo_connection, "sql": "SELECT 1 / 0 AS q"})
        assert got.json["code"] == "query_failed"
        assert bulkhead.held == 0
    got, took = call(client, fails, d="1")
    assert got.status_code == 200 and got.json == [{"q": 1}] and took < 1
    assert call(client, series, stream="true", format="csv")[0].text.count("\n") == 5001
    assert bulkhead.held == 0 and bulkhead.refused == 0
