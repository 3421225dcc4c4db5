"""A starting worker's warm-up (``gateway/warmup.py``): before it serves, it opens data sessions
with the called statements prepared and makes the plans of what the fleet called most in the
last ``warm_window_s`` (the store's run history); bounded by its settings; nothing run; never a
reason not to start. Each "worker" here is an in-process app on the session's store: ``caller``
makes the history, ``fresh`` is the worker that starts after it."""
from __future__ import annotations

import time

import falcon.testing

from gateway.ports import LocalSync
from helpers.history import wait_for_history
from helpers.util import unique, wait_until


def _calls(client, name: str, secret: str, times: int, method: str = "GET", **params) -> list[str]:
    """``times`` calls of ``name`` through ``client``, each answered 200; their request ids."""
    ids = []
    for _ in range(times):
        if method == "GET":
            got = client.simulate_get(f"/q/{name}", params=params, headers={"X-API-Key": secret})
        else:
            got = client.simulate_post(f"/q/{name}", json={"params": params}, headers={"X-API-Key": secret})
        assert got.status_code == 200, got.text
        ids.append(got.headers["X-Request-Id"])
    return ids


def _hot(api, superuser, make_app, sql: str, weight: int = 3000):
    """A query on a connection of its own, called through another app (the history as a worker
    records it), then made ``weight`` runs hotter: the store's history is the whole test
    session's, and the warm-up reads the most called pairs of its newest runs. (connection,
    query, secret)"""
    connection = api.connection()
    query = api.query(sql, connection=connection)
    secret = api.key([query], [connection])
    caller = falcon.testing.TestClient(make_app(sync=LocalSync()))
    assert len(wait_for_history(superuser, _calls(caller, query, secret, 3))) == 3
    _hotter(superuser, query, weight)
    return connection, query, secret


def _hotter(superuser, query: str, weight: int) -> None:
    """``weight`` more runs like the query's last one, now."""
    superuser("INSERT INTO gw_run_history (at, request_id, key_id, query, version, status, duration_ms, worker) "
              "SELECT clock_timestamp(), 'warm-' || g, r.key_id, r.query, r.version, 200, 1, 'tests' "
              "FROM (SELECT * FROM gw_run_history WHERE query = %s ORDER BY id DESC LIMIT 1) r, "
              "generate_series(1, %s) g", (query, weight))


def _pool(app, query: str, write: bool = False):
    qv = app.parts.holder.catalog.queries[query].published
    return app.parts.pools.get(qv.connection, write), qv


def _planned(app, key_id: int, qv) -> bool:
    return qv.plan_id in app.parts.holder.catalog.plans.get(key_id, {})


def test_a_starting_worker_opens_sessions_and_makes_plans_for_what_the_fleet_calls(api, superuser, make_app):
    _, query, secret = _hot(api, superuser, make_app, "SELECT id, name FROM customers WHERE id = 1")
    key_id = superuser("SELECT key_id FROM gw_run_history WHERE query = %s LIMIT 1", (query,))[0][0]
    fresh = make_app(sync=LocalSync(), warm_sessions=4)
    pool, qv = _pool(fresh, query)
    assert pool.open_count >= 1, "no session opened before the first call"
    assert pool.open_count <= 4
    assert _planned(fresh, key_id, qv), "the plan is made on the first call"
    idle = list(pool._idle)
    assert idle and all(qv.statement in s.prepared for s in idle), "the statement is prepared on the first call"
    # The first call takes a warm session: nothing opened, nothing prepared anew.
    opened = pool.open_count
    client = falcon.testing.TestClient(fresh)
    got = client.simulate_get(f"/q/{query}", headers={"X-API-Key": secret})
    assert got.status_code == 200 and got.json[0]["id"] == 1, got.text
    assert pool.open_count == opened


def test_without_warm_up_a_starting_worker_is_cold(api, superuser, make_app):
    _, query, _ = _hot(api, superuser, make_app, "SELECT id FROM customers WHERE id = 2")
    key_id = superuser("SELECT key_id FROM gw_run_history WHERE query = %s LIMIT 1", (query,))[0][0]
    cold = make_app(sync=LocalSync(), warm_calls=0)
    pool, qv = _pool(cold, query)
    assert pool.open_count == 0 and not _planned(cold, key_id, qv)


def test_the_warm_up_is_bounded(api, superuser, make_app):
    """Three hot queries on three connections: ``warm_sessions=2`` opens two sessions in all,
    ``warm_calls=1`` makes one plan; the pair called most is the one warmed."""
    hot = [_hot(api, superuser, make_app, f"SELECT id FROM customers WHERE id = {i}", weight=n)
           for i, n in ((1, 1000), (2, 3000), (3, 2000))]
    fresh = make_app(sync=LocalSync(), warm_calls=1, warm_sessions=2)
    assert fresh.parts.pools.open_sessions() <= 2
    planned = [_planned(fresh, superuser("SELECT key_id FROM gw_run_history WHERE query = %s LIMIT 1", (q,))[0][0],
                        _pool(fresh, q)[1]) for _, q, _ in hot]
    assert planned == [False, True, False], planned
    assert _pool(fresh, hot[1][1])[0].open_count >= 1
    assert _pool(fresh, hot[0][1])[0].open_count == 0 and _pool(fresh, hot[2][1])[0].open_count == 0


def test_the_warm_up_runs_nothing(api, superuser, make_app, services):
    """A saved write called often is prepared by a starting worker, never executed: the
    table holds what the calls wrote, not one row more; where the server no longer allows
    writes, no writable session is opened for it."""
    table = unique("warm_writes")
    superuser(f"CREATE TABLE {table} (n int)", db=services.data_database)
    connection = api.connection()
    query = api.query(f"INSERT INTO {table} VALUES (:n)", {"n": {"type": "int", "required": True}},
                      connection=connection)
    writer = api.key([query], [connection], allow_writes=True)
    caller = falcon.testing.TestClient(make_app(sync=LocalSync(), allow_writes=True))
    wait_for_history(superuser, _calls(caller, query, writer, 12, method="POST", n=7))
    _hotter(superuser, query, 3000)
    for _ in range(2):
        fresh = make_app(sync=LocalSync(), allow_writes=True)
        pool, qv = _pool(fresh, query, write=True)
        assert pool.open_count >= 1 and all(qv.statement in s.prepared for s in pool._idle)
    assert superuser(f"SELECT count(*) FROM {table}", db=services.data_database) == [(12,)]
    # A worker of a server that does not allow writes (the default) opens no writable session for it.
    read_only = make_app(sync=LocalSync())
    assert _pool(read_only, query, write=True)[0].open_count == 0


def test_a_hot_connection_that_cannot_be_reached_does_not_stop_the_start(api, superuser, make_app):
    connection, query, secret = _hot(api, superuser, make_app, "SELECT id FROM customers WHERE id = 3")
    _, other_query, other_secret = _hot(api, superuser, make_app, "SELECT id FROM customers WHERE id = 4")
    # The first connection now points at a port nobody listens on (its data went away).
    assert api.manage("PATCH", f"/connections/{connection}", {"port": 9}).status == 200
    started = time.monotonic()
    fresh = make_app(sync=LocalSync())
    assert time.monotonic() - started < 10
    client = falcon.testing.TestClient(fresh)
    assert client.simulate_get(f"/q/{other_query}", headers={"X-API-Key": other_secret}).json == [{"id": 4}]
    got = client.simulate_get(f"/q/{query}", headers={"X-API-Key": secret})
    assert got.status_code == 503 and got.json["code"] == "database_unavailable", got.text


def _slowed_schemas(app, settings, api, count: int, delay_s: float):
    """A SchemaCache of its own over ``count`` new connections whose every read takes
    ``delay_s`` more (a read slowed by a busy start): (the cache, the connections, the names
    read, in order)."""
    from gateway.crypto import PasswordBox
    from gateway.governance.schema_cache import SchemaCache

    names = [api.connection() for _ in range(count)]
    current = app.parts.holder.current().connections
    connections = [next(c for c in current.values() if c.name == name) for name in names]
    schemas = SchemaCache(settings, PasswordBox(settings.secret_key))
    reads: list[str] = []
    load = schemas._load

    def counted(c):
        reads.append(c.name)
        time.sleep(delay_s)      # a sleep that is the test: a slow read
        return load(c)
    schemas._load = counted
    return schemas, connections, reads


def test_a_schema_read_under_way_is_waited_for_not_made_twice(app, settings, api):
    """A starting worker reads every connection's schema in the background (``warm``); the
    warm-up needs the hot ones' now: it waits for that read instead of making a second one."""
    schemas, [connection], reads = _slowed_schemas(app, settings, api, 1, 0.2)   # kin_now comes while it runs
    schemas.warm([connection])
    assert schemas.kin_now(connection, 5.0) is not None
    assert reads == [connection.name]


def test_a_hot_connection_queued_behind_many_is_read_at_once(app, settings, api):
    """A starting worker queues every connection's schema read (hundreds in a fleet, some
    unreachable: a connect timeout each); the warm-up takes the hot one out of the queue and
    reads it now instead of waiting for its turn, and it is not read a second time after."""
    schemas, connections, reads = _slowed_schemas(app, settings, api, 8, 0.3)   # 2.1 s ahead of the hot one
    hot = connections[-1]
    schemas.warm(connections)
    started = time.monotonic()
    assert schemas.kin_now(hot, 1.5) is not None
    assert time.monotonic() - started < 1.5
    wait_until(lambda: len(reads) >= len(connections) and not schemas._loading, 10, 0.05, lambda: str(reads))
    assert sorted(reads) == sorted(c.name for c in connections), reads


def test_closing_stops_the_queued_reads_and_waits_for_the_one_under_way(app, settings, api):
    """A worker's exit: no queued schema read starts after ``close``, and the one under way is
    waited for (a daemon thread inside libpq at interpreter exit crashed a process with SIGSEGV)."""
    schemas, connections, reads = _slowed_schemas(app, settings, api, 5, 0.3)
    schemas.warm(connections)
    wait_until(lambda: reads, 5, 0.01, "the first read under way")
    schemas.close()
    # Every reading thread is gone, so no queued read can start later: what was read is final.
    assert not any(t.is_alive() for t in schemas._threads)
    assert reads == [connections[0].name], reads
