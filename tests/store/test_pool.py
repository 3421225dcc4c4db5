"""The management calls' store pool: it waits for a connection instead of failing, and it
keeps the connections it opened, so overlapping calls do not each open (and close) one."""
from __future__ import annotations

import threading

import psycopg2.pool
import pytest

from gateway.store.pool import WaitingPool


def backend(conn) -> int:
    with conn.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        return cur.fetchone()[0]


def test_overlapping_calls_reuse_the_connections_they_opened(services):
    pool = WaitingPool(1, 4, services.store_url, application_name="pool-test")
    try:
        for _ in range(3):   # four calls at once, three times: the same four backends each time
            conns = [pool.getconn() for _ in range(4)]
            pids = {backend(c) for c in conns}
            for c in conns:
                c.rollback()
                pool.putconn(c)
            if _ == 0:
                first = pids
            assert pids == first, (pids, first)
        assert len(first) == 4
    finally:
        pool.closeall()


def test_a_fifth_caller_waits_for_a_connection_given_back(services):
    pool = WaitingPool(1, 2, services.store_url, wait_s=5)
    try:
        held = [pool.getconn(), pool.getconn()]
        got: list = []
        waiter = threading.Thread(target=lambda: got.append(pool.getconn()))
        waiter.start()
        waiter.join(0.3)
        assert not got   # still waiting
        pool.putconn(held.pop())
        waiter.join(5)
        assert got and not got[0].closed
        pool.putconn(got[0])
        pool.putconn(held.pop())
    finally:
        pool.closeall()


def test_no_connection_within_the_wait_is_a_pool_error(services):
    pool = WaitingPool(1, 1, services.store_url, wait_s=0.2)
    try:
        conn = pool.getconn()
        with pytest.raises(psycopg2.pool.PoolError):
            pool.getconn()
        pool.putconn(conn)
    finally:
        pool.closeall()
