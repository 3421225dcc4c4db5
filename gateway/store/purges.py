"""The cache's purge counter in the store (``gw_cache_state.purges``).

Every purge of the response cache, and every write through the gateway that invalidates
cached answers, bumps it before it returns. A worker that hears the cache's bus needs
none of this; one that does not (its lease ran out) reads it before serving from memory:
if it moved, a purge the worker did not apply may have happened, and its memory is emptied
(``gateway.cache.service``). One connection (``oneconn.OneConnection``).
"""
from __future__ import annotations

from collections.abc import Callable

import psycopg2.extensions

from .oneconn import OneConnection


class PurgeCounter:
    def __init__(self, connect: Callable[[], psycopg2.extensions.connection]) -> None:
        self._conn = OneConnection(connect)

    def bump(self) -> int:
        return self._run("UPDATE gw_cache_state SET purges = purges + 1 RETURNING purges")

    def read(self) -> int:
        return self._run("SELECT purges FROM gw_cache_state")

    def _run(self, statement: str) -> int:
        row = self._conn.fetchone(statement)
        return int(row[0]) if row else 0

    def close(self) -> None:
        self._conn.close()
