"""The store's connection pool for management calls: one that waits for a free connection.

psycopg2's ``ThreadedConnectionPool`` raises "connection pool exhausted" the moment every
connection is out, which a management call would answer as 503 ``store_unavailable`` while
the store is fine: five concurrent calls on a worker of eight threads and four store
connections were enough. Here a caller waits (up to ``wait_s``) for a connection another
call gives back; the store is only "unavailable" when it does not answer.

It also keeps every connection it opened. psycopg2's pool keeps only ``minconn`` idle ones
and closes the rest as they come back, so whenever two management calls overlapped in a
worker the second opened a new store connection and closed it after (a backend forked by
the postmaster, one at a time, and authenticated): with 8 clients creating keys that was a
fifth of a call's time (docs/bench/2026-11-30-controlplane.md). Connections are still
opened only when needed, and at most ``maxconn``.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg2.extensions
import psycopg2.pool


class WaitingPool(psycopg2.pool.ThreadedConnectionPool):
    def __init__(self, minconn: int, maxconn: int, *args: Any, wait_s: float = 10.0, **kwargs: Any) -> None:
        super().__init__(minconn, maxconn, *args, **kwargs)
        # Opened eagerly: minconn (above). Kept when given back: up to maxconn (psycopg2's
        # putconn keeps a connection while fewer than ``minconn`` are idle).
        self.minconn = maxconn
        self._free = threading.BoundedSemaphore(maxconn)
        self._wait_s = wait_s

    def getconn(self, key: Any = None) -> Any:
        if not self._free.acquire(timeout=self._wait_s):
            raise psycopg2.pool.PoolError(f"no store connection came free within {self._wait_s:g} s")
        try:
            return super().getconn(key)
        except BaseException:
            self._free.release()
            raise

    def putconn(self, conn: Any = None, key: Any = None, close: bool = False) -> None:
        try:
            super().putconn(conn, key, close)
        finally:
            self._free.release()


@contextmanager
def borrowed(pool: psycopg2.pool.AbstractConnectionPool) -> Iterator[psycopg2.extensions.connection]:
    """A connection of ``pool`` for one short read: given back rolled back, or closed when
    anything failed on it."""
    conn = pool.getconn()
    broken = True
    try:
        yield conn
        conn.rollback()
        broken = False
    finally:
        pool.putconn(conn, close=broken)


def ping(conn: psycopg2.extensions.connection) -> None:
    """One round trip on ``conn``; raises ``psycopg2.Error`` when the store does not answer."""
    with conn.cursor() as cur:
        cur.execute("SELECT 1")
