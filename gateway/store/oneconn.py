"""One store connection for rare reads off the hot path (a quota counter rebuilt, the cache's
purge counter): opened on first use, in autocommit, shared under a lock, and reopened once
when it broke (the store restarted), so a caller sees the store's error only when a fresh
connection fails too."""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import psycopg2
import psycopg2.extensions

_BROKEN = (psycopg2.OperationalError, psycopg2.InterfaceError)


class OneConnection:
    def __init__(self, connect: Callable[[], psycopg2.extensions.connection]) -> None:
        self._connect = connect
        self._conn: psycopg2.extensions.connection | None = None
        self._lock = threading.Lock()

    def fetchone(self, statement: str, args: Sequence[Any] = ()) -> tuple | None:
        with self._lock:
            try:
                return self._once(statement, args)
            except _BROKEN:
                self._drop()   # a broken connection (the store restarted): once more on a fresh one
            try:
                return self._once(statement, args)
            except _BROKEN:
                self._drop()
                raise

    def _once(self, statement: str, args: Sequence[Any]) -> tuple | None:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
            self._conn.autocommit = True
        with self._conn.cursor() as cur:
            cur.execute(statement, args or None)
            row = cur.fetchone()
        return tuple(row) if row is not None else None

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
