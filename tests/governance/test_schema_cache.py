"""A worker's copy of the data databases' schemas (``gateway/governance/schema_cache.py``): a
read borrows an idle read session of the connection's pool while another stays idle for the
calls (opening a session costs both sides about 4 ms of CPU, and each called connection is read
again every ``ttl_s``), and never adds one to a pool; a borrowed session goes back as it was."""
from __future__ import annotations

import pytest

from gateway.crypto import PasswordBox
from gateway.execution.runner import Pools
from gateway.governance.schema_cache import SchemaCache


@pytest.fixture
def pools(settings):
    """Session pools of this test's own: the session app's are shared with its background reads
    (a new connection's schema is read behind each change), which would take the idle sessions
    these tests count."""
    made = Pools(settings, PasswordBox(settings.secret_key))
    yield made
    made.close()


def _setup(app, settings, api, pools):
    name = api.connection()
    connection = next(c for c in app.parts.holder.current().connections.values() if c.name == name)
    return connection, pools.get(connection, False), \
        SchemaCache(settings, PasswordBox(settings.secret_key), pools=pools)


def _timeout(session) -> str:
    with session.conn.cursor() as cur:
        cur.execute("SHOW statement_timeout")
        return cur.fetchone()[0]


def test_a_read_borrows_an_idle_session_and_gives_it_back_as_it_was(app, settings, api, pools, opened_sessions):
    connection, pool, schemas = _setup(app, settings, api, pools)
    first, second = pool.acquire(), pool.acquire()
    timeout = _timeout(first)
    pool.release(first)
    pool.release(second)               # the one a call takes first
    del opened_sessions[:]
    assert "customers" in str(schemas.fresh(connection).relations)
    assert opened_sessions == []                           # no session of its own
    assert pool.open_count == 2 and pool.take_idle() is second     # the read's went back on top
    assert _timeout(second) == timeout     # the calls' timeout, as the options set it
    pool.release(second)


def test_with_one_idle_session_or_none_a_read_opens_its_own_and_the_pool_stays_as_it_was(
        app, settings, api, pools, opened_sessions):
    connection, pool, schemas = _setup(app, settings, api, pools)
    busy, idle = pool.acquire(), pool.acquire()
    pool.release(idle)                    # the one a call would find: not for the read
    del opened_sessions[:]
    try:
        assert "customers" in str(schemas.fresh(connection).relations)
    finally:
        pool.release(busy)
    assert [name for name, _ in opened_sessions] == ["gateway-fleet-schema"] and opened_sessions[0][1].closed
    assert pool.open_count == 2


def test_an_idle_session_that_died_is_dropped_and_the_read_made_on_a_fresh_one(app, settings, api, pools,
                                                                             superuser, services):
    connection, pool, schemas = _setup(app, settings, api, pools)
    sessions = [pool.acquire(), pool.acquire()]
    pids = [s.conn.get_backend_pid() for s in sessions]
    for session in sessions:
        pool.release(session)
    superuser("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,), db=services.data_database)
    assert "customers" in str(schemas.fresh(connection).relations)
    assert pool.open_count == 0 and pool.take_idle() is None
