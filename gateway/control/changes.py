"""The control plane's plumbing: a store transaction, and a change (one transaction that
also bumps the catalog generation and writes the audit entry, then tells the fleet and
returns once no worker serves the old state)."""
from __future__ import annotations

import contextvars
import select
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import psycopg2
import psycopg2.extras
import psycopg2.pool

from ..errors import unavailable
from ..model.actor import Actor
from ..store import statements as store
from ..store.pool import ping

if TYPE_CHECKING:
    from ..ports import Sync


# Generations the store's change log keeps (gw_catalog_changes): a worker further behind
# (one cut off from the bus and the store that long) loads the whole catalog instead. At
# about 40 bytes a row, 100,000 changes are a few MB.
CHANGE_LOG_KEEP = 100_000

# The default actor is shared by every context that set none: it is only read, never changed.
ACTOR: contextvars.ContextVar[Actor] = contextvars.ContextVar("gateway_actor", default=Actor())  # noqa: B039


def _spoken_to(conn: psycopg2.extensions.connection) -> bool:
    """Whether an idle connection has something to read: the server ended it (its goodbye
    and the end of the stream), or, rarely, a notice. Either way it is tried before use."""
    try:
        return bool(select.select([conn], [], [], 0)[0])
    except (OSError, ValueError, psycopg2.Error):
        return True


class Changes:
    def __init__(self, store_pool: psycopg2.pool.AbstractConnectionPool, sync: Sync,
                 on_change: Callable[[dict], object] | None = None) -> None:
        self._pool = store_pool
        self._sync = sync
        self._on_change = on_change     # live events: called with each committed change
        self.last_sync: dict = {}

    @contextmanager
    def cursor(self) -> Iterator[store.Cursor]:
        """One short store transaction (committed at the end, rolled back on error)."""
        conn = self._live_connection()
        broken = False
        try:
            with conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
                yield cur
            conn.commit()
        except psycopg2.OperationalError:
            broken = True
            raise unavailable("store_unavailable", "the gateway's store cannot be reached") from None
        except BaseException:
            if not conn.closed:
                conn.rollback()
            raise
        finally:
            self._pool.putconn(conn, close=broken or bool(conn.closed))

    def _live_connection(self) -> psycopg2.extensions.connection:
        """A pooled store connection that answers. After a restart of the store every idle
        one is dead, and that is found only on use: one the server has written to while it
        sat idle (a server that ends a connection says so, then closes it) is tried with a
        trivial statement and replaced if it fails, so the first call after the store is
        back does not fail. A quiet one is used as it is: the trial was a round trip on
        every management call, a tenth of a create-key call's time with 8 clients."""
        for _ in range(self._pool.maxconn + 1):
            try:
                conn = self._pool.getconn()
            except (psycopg2.Error, psycopg2.pool.PoolError):
                raise unavailable("store_unavailable", "the gateway's store cannot be reached") from None
            if not conn.closed and not _spoken_to(conn):
                return conn
            try:
                ping(conn)
                return conn
            except (psycopg2.OperationalError, psycopg2.InterfaceError):
                self._pool.putconn(conn, close=True)
        raise unavailable("store_unavailable", "the gateway's store cannot be reached")

    @contextmanager
    def change(self, action: str, kind: str, name: str, new: bool = False) -> Iterator[store.Cursor]:
        """A write transaction that bumps the generation and records the audit entry (who,
        what, before, after) in the same commit; announces to the fleet after it. ``new``: the
        change inserts the object, so there is no "before" to read (if one exists, the insert
        fails and nothing is recorded)."""
        with self.cursor() as cur:
            before = None if new else store.snapshot(cur, kind, name)
            yield cur
            after = store.snapshot(cur, kind, name)
            changed = after or before   # the object's id, for the workers' incremental apply
            who = ACTOR.get()
            generation = store.commit_change(cur, who, action, kind, name, before, after,
                                             None if changed is None else changed["id"], CHANGE_LOG_KEEP)
        self.last_sync = self._sync.announce(generation)
        if self._on_change is not None:
            self._on_change({"action": action, "kind": kind, "name": name, "generation": generation,
                             "actor": who.name, "request_id": who.request_id})
