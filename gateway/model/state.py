"""The worker's current catalog and how far it may be trusted.

The bus (``fleet.shared.bus``) renews a freshness lease each time it hears from Redis. While the
lease holds, a request reads ``holder.catalog`` with no I/O at all. When the lease has run
out (the bus is down or slow), a request first asks the store for the catalog's generation
(one small read) and applies what changed if it moved, so a worker cut off from the bus never serves a
definition older than the last management call that returned.
"""
from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable

import psycopg2
import psycopg2.extensions

from ..errors import unavailable
from ..store import catalog as store_catalog
from . import catalog as catalog_mod

log = logging.getLogger("gateway.state")



class CatalogHolder:
    __slots__ = ("catalog", "fresh_until", "reloads", "full_loads", "rows_read", "last", "_connect", "_conn", "_lock",
                 "_on_reload")

    def __init__(self, connect: Callable[[], psycopg2.extensions.connection],
                 on_reload: Callable[[catalog_mod.Catalog, catalog_mod.Catalog], object] | None = None,
                 conn: psycopg2.extensions.connection | None = None) -> None:
        """``conn``: a store session to start with (the start's own), else one is opened on first use."""
        self.catalog = catalog_mod.Catalog.empty()
        self.fresh_until = 0.0
        self.reloads = 0          # new snapshots swapped in
        self.full_loads = 0       # of them, read whole (the others applied the change log)
        self.rows_read = 0        # rows read from the store by every refresh
        self.last: catalog_mod.Refresh | None = None
        self._connect = connect
        self._conn: psycopg2.extensions.connection | None = conn
        if conn is not None:
            conn.autocommit = True
        self._lock = threading.Lock()
        self._on_reload = on_reload

    # --- hot path --------------------------------------------------------------------------
    def current(self) -> catalog_mod.Catalog:
        if time.monotonic() < self.fresh_until:
            return self.catalog
        return self._revalidate()

    def fresh(self) -> catalog_mod.Catalog | None:
        """The snapshot ``current`` would return without reading the store, or None."""
        return self.catalog if time.monotonic() < self.fresh_until else None

    # --- control plane ---------------------------------------------------------------------
    def renew(self, until: float) -> None:
        self.fresh_until = until

    def distrust(self) -> None:
        self.fresh_until = 0.0

    def reload(self, at_least: int = 0) -> int:
        """Bring the catalog up to date and return the generation now served: the rows
        changed since this worker's generation, applied to a copy of its snapshot, or the
        whole catalog when that gap is unknown (``catalog.refresh``).

        ``at_least`` (the bus announced that generation): load at once, unless already
        there. Without it (a worker checking on its own): read the store's generation
        first and load only if it moved (one small read when nothing changed)."""
        with self._lock:
            if at_least and self.catalog.generation >= at_least:
                return self.catalog.generation
            # A held connection may have died with a restart of the store since its last use:
            # that is found on first use, and the read is made once more on a fresh one.
            reused = self._conn is not None and not self._conn.closed
            try:
                return self._load(at_least)
            except (psycopg2.OperationalError, psycopg2.InterfaceError):
                self._drop_store()
                if not reused:
                    raise
            except psycopg2.Error:
                self._drop_store()
                raise
            try:
                return self._load(at_least)
            except psycopg2.Error:
                self._drop_store()
                raise

    def _load(self, at_least: int) -> int:
        conn = self._store()
        if not at_least and self.reloads:
            with conn.cursor() as cur:
                if store_catalog.generation(cur) == self.catalog.generation:
                    return self.catalog.generation
        new, done = catalog_mod.refresh(conn, self.catalog)
        self.last = done
        self.rows_read += done.rows
        if new is not self.catalog:
            self._swap(new, done.how == "full")
        return self.catalog.generation

    def _swap(self, new: catalog_mod.Catalog, full: bool) -> None:
        old, self.catalog = self.catalog, new
        self.reloads += 1
        self.full_loads += full
        if full:
            # A whole catalog is hundreds of thousands of long-lived objects, which every full
            # pass of the cyclic garbage collector would walk again (measured: 150-170 ms of CPU
            # at 10,000 keys and 5,000 queries, holding the interpreter: a data-plane stall).
            # A catalog holds no reference cycles (reference counting frees it once replaced),
            # so everything alive now is moved out of the collector's reach. Applied changes
            # add only a handful of objects.
            gc.freeze()
        if self._on_reload is not None:
            self._on_reload(old, new)

    def _revalidate(self) -> catalog_mod.Catalog:
        try:
            self.reload()
        except psycopg2.Error:
            raise unavailable("catalog_stale", "this worker cannot confirm its catalog is current") from None
        return self.catalog

    def _store(self) -> psycopg2.extensions.connection:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
            self._conn.autocommit = True
        return self._conn

    def _drop_store(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
        self._conn = None

    def close(self) -> None:
        with self._lock:
            self._drop_store()
