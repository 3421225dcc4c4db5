"""The grants every entry point checks the same way: the key's connections."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import GatewayError, forbidden

if TYPE_CHECKING:
    from ..model.catalog import ApiKey, Connection


def check_connection(key: ApiKey, connection: Connection) -> None:
    """The key must be granted the connection, and the connection must be active."""
    if connection.name not in key.connections and "*" not in key.connections:
        raise forbidden("connection_not_allowed", f"this key is not granted connection '{connection.name}'")
    if not connection.active:
        raise GatewayError(503, "connection_inactive", f"connection '{connection.name}' is inactive",
                           headers={"Retry-After": "60"})
