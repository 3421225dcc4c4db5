"""The catalog's reads: what each worker's snapshot is loaded and refreshed from.

``gateway.model.catalog`` builds the snapshot from these rows and ``gateway.model.state``
keeps it; the statements against the store live here, beside the control plane's
(``statements.py``) that write what they read. Rows are dicts (a ``RealDictCursor``).
"""
from __future__ import annotations

from typing import TypeAlias

import psycopg2.extensions

Cursor: TypeAlias = psycopg2.extensions.cursor

_VERSIONS = """SELECT q.name AS query_name, q.published_version, v.*, md5(v::text) AS signature
                 FROM gw_queries q JOIN gw_query_versions v ON v.query_id = q.id"""


def generation(cur: Cursor) -> int | None:
    """The store's catalog generation (a plain cursor: one value)."""
    cur.execute("SELECT generation FROM gw_catalog_state")
    row = cur.fetchone()
    return None if row is None else row[0]


def begin_refresh(cur: Cursor, mine: int) -> list[dict]:
    """Start a repeatable-read, read-only snapshot and, in the same round trip, read the
    store's generation (``now``), ``log_from``, and the changes logged after ``mine`` when
    the log reaches back that far (one row with no change otherwise). End it with
    :func:`end_refresh`."""
    cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; "
                "SELECT s.generation AS now, s.log_from, c.kind, c.id, c.generation "
                "FROM gw_catalog_state s LEFT JOIN gw_catalog_changes c "
                "ON s.generation > %(mine)s AND s.log_from <= %(mine)s AND c.generation > %(mine)s",
                {"mine": mine})
    return cur.fetchall()


def end_refresh(cur: Cursor) -> None:
    cur.execute("COMMIT")


def _rows(cur: Cursor, every: str, ids: list[int] | None) -> list[dict]:
    if ids is None:
        cur.execute(every)
    else:
        cur.execute(every + " WHERE id = ANY(%s)", (ids,))
    return cur.fetchall()


def connections(cur: Cursor, ids: list[int] | None = None) -> list[dict]:
    """Every connection, or those of ``ids``."""
    return _rows(cur, "SELECT * FROM gw_connections", ids)


def versions(cur: Cursor, query_ids: list[int] | None = None) -> list[dict]:
    """Every query's versions, or those of ``query_ids``, ordered by query and version, each
    with its query's name, its published version and the stored row's digest."""
    if query_ids is None:
        cur.execute(_VERSIONS + " ORDER BY q.id, v.version")
    else:
        cur.execute(_VERSIONS + " WHERE q.id = ANY(%s) ORDER BY q.id, v.version", (query_ids,))
    return cur.fetchall()


def keys(cur: Cursor, ids: list[int] | None = None) -> list[dict]:
    """Every API key, or those of ``ids``."""
    return _rows(cur, "SELECT * FROM gw_api_keys", ids)
