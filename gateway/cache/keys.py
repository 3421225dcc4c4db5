"""What makes a cached answer unique, and what it read.

The digest covers the query version as the catalog serves it (its store id and number,
so a new version, a re-created query or a version moved to another connection is another
entry), the connection's identity (a change of host, database or login is another entry),
the resolved parameter values (typed, defaults applied), the page and the page size the
call ran with (the key's ``max_rows`` lowers it). The format is not in it: an entry holds
rows, and each call renders them in its own format (and masks them with its own plan).
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..model.catalog import Connection, QueryVersion


def digest(qv: QueryVersion, bound: Sequence, page: int, size: int) -> str:
    raw = repr((qv.statement, qv.connection.identity, bound, page, size)).encode()
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def database(connection: Connection) -> str:
    """The data database a connection reaches: two connections to it (other logins) share
    its tables, so a write through one invalidates what the other read."""
    return f"{connection.host}:{connection.port}/{connection.database}"


def reads(qv: QueryVersion) -> tuple[frozenset[str], bool]:
    """(the relations the version reads, whether any write to its database may change its
    answer: it reads a view or calls a user-defined function, whose tables the analysis does
    not see through)."""
    analysis = qv.analysis
    if analysis is None:
        return frozenset(), True
    return frozenset(analysis.tables), bool(analysis.views or analysis.user_functions)
