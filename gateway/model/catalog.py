"""The worker's in-memory catalog: keys, connections and saved queries, ready to serve.

A catalog is immutable once built. A change builds the next one from the previous one and
the rows the change log says changed (``refresh``; the whole store is read only when that gap
is unknown) and swaps the reference, so a request reads one consistent snapshot with no lock. Everything
a call needs (the parameter binder, the statement text, the grants) was prepared at save
time and is only looked up here.
"""
from __future__ import annotations

import time
from collections.abc import Iterable

import psycopg2.extensions
import psycopg2.extras

from ..store import catalog as reads
from .entries import ApiKey, Connection, Gap, Query, QueryVersion

# The entries, importable from here as ever (``gateway.model.entries`` builds them).
__all__ = ["ApiKey", "Catalog", "Connection", "Query", "QueryVersion", "Refresh", "load", "refresh"]


def _by_prefix(keys: Iterable[ApiKey]) -> dict[str, ApiKey]:
    """Keys by their secret's public prefix; a key rotated within its grace period also by the
    previous secret's (``identify`` checks which secret it is)."""
    found: dict[str, ApiKey] = {}
    for key in keys:
        found[key.prefix] = key
    for key in list(found.values()):
        if key.previous_prefix:
            found.setdefault(key.previous_prefix, key)
    return found


class Catalog:
    __slots__ = ("generation", "keys", "queries", "connections", "key_ids", "query_ids", "connection_ids",
                 "loaded_at", "plans")

    def __init__(self, generation: int, keys: dict[str, ApiKey], queries: dict[str, Query],
                 connections: dict[str, Connection], key_ids: dict[int, str] | None = None,
                 query_ids: dict[int, str] | None = None, connection_ids: dict[int, Connection] | None = None,
                 plans: dict[int, dict] | None = None) -> None:
        self.generation = generation
        self.keys = keys                  # prefix -> ApiKey
        self.queries = queries            # name -> Query
        self.connections = connections    # name -> Connection
        # By store id, so a change read from the change log finds what it replaces.
        self.key_ids = key_ids if key_ids is not None else {k.id: k.prefix for k in keys.values()}
        self.query_ids = query_ids if query_ids is not None else {q.id: q.name for q in queries.values()}
        self.connection_ids = connection_ids if connection_ids is not None else \
            {c.id: c for c in connections.values()}
        self.loaded_at = time.monotonic()
        # The snapshot above never changes. ``plans`` is its memo, not its data: key id ->
        # {plan id -> CallPlan or the refusal}, derived from the snapshot alone, filled on
        # first use (``setdefault``: two threads deriving the same plan keep one). A plan
        # depends on the key and on the version only, and a version's plan id names its
        # stored row (its digest: a changed row is a new plan id), so the next snapshot keeps
        # the memos of the keys it did not change and drops those of the keys it did: grants
        # and plans never disagree.
        self.plans: dict[int, dict] = plans if plans is not None else {}

    @classmethod
    def empty(cls) -> Catalog:
        """What a worker holds before its first load: generation -1, below any the store has,
        so the first refresh reads everything."""
        return cls(-1, {}, {}, {})


class Refresh:
    """What one refresh did: ``how`` is "none" (already current), "changes" (applied the rows
    changed since the worker's generation) or "full" (read everything); ``rows`` read."""

    __slots__ = ("how", "rows", "changes")

    def __init__(self, how: str, rows: int, changes: int = 0) -> None:
        self.how = how
        self.rows = rows
        self.changes = changes


def load(conn: psycopg2.extensions.connection) -> Catalog:
    """Read the whole catalog, and the generation it is, in one repeatable-read snapshot."""
    return refresh(conn, Catalog.empty())[0]


def refresh(conn: psycopg2.extensions.connection, current: Catalog) -> tuple[Catalog, Refresh]:
    """The catalog at the store's generation, built from ``current`` by the changes logged
    since its generation (``gw_catalog_changes``), or read whole when that gap is unknown:
    a worker that never loaded, one behind what the log still holds, one ahead of the store
    (a store restored from a backup), or a log that misses a generation (a change made by an
    older release that logs nothing). One repeatable-read snapshot: what is read is exactly
    the store at that generation."""
    mine = current.generation
    with conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
        # One round trip: the snapshot (it starts at the first read), the generation, and the
        # changes logged since ``mine`` when the log reaches back that far (one row with no
        # change otherwise).
        state = reads.begin_refresh(cur, mine)
        try:
            generation = state[0]["now"]
            if generation == mine:
                return current, Refresh("none", 1)
            if 0 <= state[0]["log_from"] <= mine < generation:
                logged = [r for r in state if r["kind"] is not None]
                if len({r["generation"] for r in logged}) == generation - mine:
                    try:
                        new, rows = _apply(cur, current, generation, logged)
                        return new, Refresh("changes", len(state) + rows, generation - mine)
                    except Gap:
                        pass
            new, rows = _read_all(cur, generation)
            return new, Refresh("full", len(state) + rows)
        finally:
            reads.end_refresh(cur)


def _read_all(cur: psycopg2.extensions.cursor, generation: int) -> tuple[Catalog, int]:
    connections = {r["name"]: Connection(r) for r in reads.connections(cur)}
    by_id = {c.id: c for c in connections.values()}
    version_rows = reads.versions(cur)
    queries = _queries(version_rows, by_id, {})
    key_rows = reads.keys(cur)
    keys = _by_prefix(ApiKey(r) for r in key_rows)
    return Catalog(generation, keys, queries, connections), len(connections) + len(version_rows) + len(key_rows)


def _queries(rows: list[dict], connections: dict[int, Connection], previous: dict[int, Query]) -> dict[str, Query]:
    """Queries from their version rows (ordered by query, version). A version ``previous``
    already holds whose stored row is the same (its digest) on the same connection object is
    kept as it is, prepared forms and memos with it."""
    queries: dict[str, Query] = {}
    for r in rows:
        query = queries.get(r["query_name"])
        if query is None:
            query = queries[r["query_name"]] = Query(r["query_id"], r["query_name"])
        connection = connections.get(r["connection_id"])
        if connection is None:
            raise Gap.no_connection(r["query_id"], r["connection_id"])
        old = previous.get(r["query_id"])
        version = old.versions.get(r["version"]) if old is not None else None
        if version is None or version.signature != r["signature"] or version.connection is not connection \
                or version.name != r["query_name"]:
            version = QueryVersion(r["query_name"], r, connection)
        query.versions[version.version] = version
        if r["published_version"] == version.version:
            query.published = version
    return queries


def _apply(cur: psycopg2.extensions.cursor, current: Catalog, generation: int,
           logged: list[dict]) -> tuple[Catalog, int]:
    """The next snapshot: ``current``'s dicts copied (a C-level copy of references) with the
    changed entries replaced. Nothing of ``current`` is modified: requests still reading it
    see it whole. Returns it with the number of rows read."""
    changed: dict[str, set[int]] = {"connection": set(), "query": set(), "key": set()}
    for r in logged:
        changed[r["kind"]].add(r["id"])
    connections, connection_ids, connection_rows = _changed_connections(cur, current, changed["connection"])
    queries, query_ids, query_rows = _changed_queries(cur, current, changed["query"], changed["connection"],
                                                      connection_ids)
    keys, key_ids, plans, key_rows = _changed_keys(cur, current, changed["key"])
    return Catalog(generation, keys, queries, connections, key_ids, query_ids, connection_ids, plans), \
        connection_rows + query_rows + key_rows


def _changed_connections(cur: psycopg2.extensions.cursor, current: Catalog, changed: set[int]
                         ) -> tuple[dict[str, Connection], dict[int, Connection], int]:
    connections, connection_ids = current.connections, current.connection_ids
    if not changed:
        return connections, connection_ids, 0
    ids = sorted(changed)
    fresh = [Connection(r) for r in reads.connections(cur, ids)]
    connections, connection_ids = connections.copy(), connection_ids.copy()
    for cid in ids:                      # every old entry out first: a name may move
        old = connection_ids.pop(cid, None)
        if old is not None and connections.get(old.name) is old:
            del connections[old.name]
    for connection in fresh:
        connections[connection.name] = connection_ids[connection.id] = connection
    return connections, connection_ids, len(fresh)


def _changed_queries(cur: psycopg2.extensions.cursor, current: Catalog, changed: set[int], moved: set[int],
                     connection_ids: dict[int, Connection]) -> tuple[dict[str, Query], dict[int, str], int]:
    """The changed queries read again; those with a version on a changed (``moved``)
    connection rebound to it."""
    queries, query_ids = current.queries, current.query_ids
    if not changed and not moved:
        return queries, query_ids, 0
    rows = 0
    queries, query_ids = queries.copy(), query_ids.copy()
    previous: dict[int, Query] = {}
    ids = sorted(changed)
    for qid in ids:
        name = query_ids.pop(qid, None)
        if name is not None:
            old_query = queries.pop(name, None)
            if old_query is not None:
                previous[qid] = old_query
    if ids:
        version_rows = reads.versions(cur, ids)
        rows += len(version_rows)
        for query in _queries(version_rows, connection_ids, previous).values():
            queries[query.name] = query
            query_ids[query.id] = query.name
    if moved:
        # A version holds its connection: those on a changed one are rebound (not read
        # again; nothing else of theirs changed). A connection change is rare; this walks
        # the queries once.
        for name, query in list(queries.items()):
            if any(v.connection.id in moved and v.connection is not connection_ids.get(v.connection.id)
                   for v in query.versions.values()):
                queries[name] = query.rebound(connection_ids)
    return queries, query_ids, rows


def _changed_keys(cur: psycopg2.extensions.cursor, current: Catalog, changed: set[int]
                  ) -> tuple[dict[str, ApiKey], dict[int, str], dict[int, dict], int]:
    """The changed keys read again, each indexed by its prefix (and its previous secret's, in
    its grace period); their plan memos dropped."""
    keys, key_ids, plans = current.keys, current.key_ids, current.plans
    if not changed:
        return keys, key_ids, plans, 0
    ids = sorted(changed)
    fresh_keys = [ApiKey(r) for r in reads.keys(cur, ids)]
    # dict.copy(), not dict(): once an entry was deleted (every key change deletes and
    # re-adds), dict() rebuilds the table entry by entry, about twice the time of copy()
    # at 10,000 keys (0.33 against 0.16 ms a dict, measured here on a loaded machine).
    keys, key_ids, plans = keys.copy(), key_ids.copy(), plans.copy()
    for kid in ids:
        prefix = key_ids.pop(kid, None)
        if prefix is not None and (old_key := keys.get(prefix)) is not None and old_key.id == kid:
            del keys[prefix]
            if old_key.previous_prefix and keys.get(old_key.previous_prefix) is old_key:
                del keys[old_key.previous_prefix]
        plans.pop(kid, None)
    for api_key in fresh_keys:
        keys[api_key.prefix] = api_key
        if api_key.previous_prefix:
            keys.setdefault(api_key.previous_prefix, api_key)
        key_ids[api_key.id] = api_key.prefix
    return keys, key_ids, plans, len(fresh_keys)
