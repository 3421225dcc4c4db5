"""The grants every entry point checks the same way: the key's connections (ad-hoc SQL), and
whether a connection is active."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import forbidden

if TYPE_CHECKING:
    from ..model.catalog import ApiKey, Connection


def check_connection(key: ApiKey, connection: Connection) -> None:
    """The key must be granted the connection itself (ad-hoc SQL: a ``queries`` grant does not
    reach it), and the connection must be active."""
    if connection.name not in key.connections and "*" not in key.connections:
        raise forbidden("connection_forbidden", f"this key is not granted connection '{connection.name}'")
    check_active(connection)


def check_active(connection: Connection) -> None:
    if not connection.active:
        raise forbidden("connection_inactive", f"connection '{connection.name}' is inactive")
