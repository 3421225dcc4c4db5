"""The cache's purge counter in the store (``gw_cache_state.purges``).

Every purge of the response cache, and every write through the gateway that invalidates
cached answers, bumps it before it returns. A worker that hears the cache's bus needs
none of this; one that does not (its lease ran out) reads it before serving from memory:
if it moved, a purge the worker did not apply may have happened, and its memory is emptied
(``gateway.cache.service``). One connection, opened on first use, reopened once when it
broke; a caller sees the store's error only when that fails too.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

import psycopg2
import psycopg2.extensions


class PurgeCounter:
    def __init__(self, connect: Callable[[], psycopg2.extensions.connection]) -> None:
        self._connect = connect
        self._conn: psycopg2.extensions.connection | None = None
        self._lock = threading.Lock()

    def bump(self) -> int:
        return self._run("UPDATE gw_cache_state SET purges = purges + 1 RETURNING purges")

    def read(self) -> int:
        return self._run("SELECT purges FROM gw_cache_state")

    def _run(self, statement: str) -> int:
        with self._lock:
            try:
                return self._once(statement)
            except (psycopg2.OperationalError, psycopg2.InterfaceError):
                self._drop()   # a broken connection (the store restarted): once more on a fresh one
            try:
                return self._once(statement)
            except (psycopg2.OperationalError, psycopg2.InterfaceError):
                self._drop()
                raise

    def _once(self, statement: str) -> int:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
            self._conn.autocommit = True
        with self._conn.cursor() as cur:
            cur.execute(statement)
            row = cur.fetchone()
        return int(row[0]) if row else 0

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            try:
                conn.close()
            except psycopg2.Error:
                pass

    def close(self) -> None:
        with self._lock:
            self._drop()
