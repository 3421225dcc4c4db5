"""The control plane: validated changes to connections, saved queries and API keys.

Each service validates (and, for a query, reads and analyses the SQL) first, then opens one
short store transaction that also bumps the catalog generation and writes the audit entry
(``changes.Changes``); after the commit the fleet is told (``Sync.announce``) and the call
returns once no worker serves the old state. The store's statements are in
``gateway.store.statements``. Shapes follow QueryAPIGate's Management API.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..model.actor import Actor
from .audit import Audit
from .changes import ACTOR, Changes
from .connections import Connections
from .keys import Keys
from .queries import Queries

if TYPE_CHECKING:
    import psycopg2.pool

    from ..crypto import PasswordBox
    from ..governance.schema_cache import SchemaCache
    from ..ports import Sync
    from ..settings import Settings


class Management:
    """The four control services over one store pool, as the Management API uses them."""

    def __init__(self, settings: Settings, sync: Sync, password_box: PasswordBox,
                 store_pool: psycopg2.pool.AbstractConnectionPool, schemas: SchemaCache,
                 on_change: Callable[[dict], object] | None = None) -> None:
        self.changes = Changes(store_pool, sync, on_change)
        self.connections = Connections(self.changes, password_box)
        self.queries = Queries(self.changes, settings, schemas)
        self.keys = Keys(self.changes)
        self.audit = Audit(self.changes)

    @property
    def last_sync(self) -> dict:
        return self.changes.last_sync


__all__ = ["Management", "Actor", "ACTOR", "Changes", "Connections", "Queries", "Keys", "Audit"]
