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
from datetime import datetime

import psycopg2.extensions
import psycopg2.extras

from .. import sql
from ..errors import GatewayError
from ..governance import Analysis, Grants
from ..store import catalog as reads
from .drivers import driver_options
from .limits import Quota, Rate
from .params import SQL_TYPES, ParamBinder, ParamSpec, compile_specs


class Connection:
    __slots__ = ("id", "name", "db", "host", "port", "database", "username", "password",
                 "active", "driver", "identity")

    def __init__(self, row: dict) -> None:
        self.id = row["id"]
        self.name = row["name"]
        self.db = row["db"]
        self.host = row["host"]
        self.port = row["port"]
        self.database = row["database"]
        self.username = row["username"]
        self.password = row["password"]          # sealed; opened only when a session is made
        self.active = row["active"]
        # libpq parameters (sslmode, ...) of its stored options, passed to every connect.
        self.driver = driver_options(row.get("options"))
        # A pool is reused across reloads only while everything that shapes a session is unchanged.
        self.identity = (self.id, self.host, self.port, self.database, self.username, self.password,
                         tuple(sorted(self.driver.items())))


class QueryVersion:
    __slots__ = ("query_id", "name", "version", "connection", "sql", "kind", "binder",
                 "value_order", "statement", "plan_id", "prepare_sql", "execute_sql", "positional", "order", "casts",
                 "stream_template",
                 "published_at", "description", "tags", "parameters", "max_affected_rows",
                 "analysis", "masks", "cache_ttl", "signature", "saved_at")

    def __init__(self, name: str, row: dict, connection: Connection) -> None:
        analysis = row["extra"]["analysis"]
        specs = compile_specs(row["parameters"], stored=True)
        by_name = {s.name: i for i, s in enumerate(specs)}
        self.query_id = row["query_id"]
        self.name = name
        self.version = row["version"]
        self.connection = connection
        self.sql = row["sql"]
        self.kind = analysis["kind"]
        self.binder = ParamBinder(specs)
        # bind() returns values in declaration order; the statement wants first-use order.
        self.value_order = tuple(by_name[n] for n in analysis["order"])
        self.statement = f"gw_q{self.query_id}_v{self.version}"   # the prepared statement's name
        # The stored row's digest: a later snapshot keeps this object (and the key plans
        # memoised by ``plan_id``) only while the row is the same.
        self.signature = row.get("signature") or ""
        self.plan_id = f"{self.statement}:{self.signature}"          # what a key's plan is memoised by
        self.parameters = row["parameters"]
        self.description = row["description"]
        self.tags = row["tags"]
        self.published_at = row["published_at"]
        # When the version was stored (its analysis was made just before): wall clock, seconds.
        created = row.get("created_at")
        self.saved_at = created.timestamp() if created is not None else 0.0
        self.max_affected_rows = row["extra"].get("max_affected_rows")
        self.masks = row["extra"].get("mask")
        # Seconds an answer may be served from the cache (gateway.cache); reads only.
        self.cache_ttl = (row.get("cache_ttl") or 0) if self.kind == "read" else 0
        self.positional = analysis["positional"]
        self.order = tuple(analysis["order"])
        self.casts: tuple[str, ...] = ()
        self.stream_template: sql.Template | None = None     # made on the first stream (see stream_text)
        self.prepare_sql = self.execute_sql = ""
        try:
            self._prepare(analysis, specs, by_name)
            # One document (gateway.control.queries): the reading above, the governance here.
            self.analysis: Analysis | None = Analysis.from_doc(analysis)
        except (GatewayError, ValueError, KeyError):
            # Saved by an older release (before governance, or an analysis or reading this
            # release no longer accepts): refused at plan time until it is saved again.
            self.analysis = None

    def _prepare(self, analysis: dict, specs: list[ParamSpec], by_name: dict) -> None:
        # Everything here was read by PostgreSQL's parser when the version was saved (the
        # paged form too): a catalog load, which every change makes every worker do, parses
        # nothing. A version saved before the paged form was stored is read again here.
        order = self.order
        self.casts = tuple(SQL_TYPES[specs[by_name[n]].kind] for n in order)
        types = ", ".join(self.casts)
        n = len(order)
        if self.kind == "read":
            # Reads are paged inside the statement: LIMIT/OFFSET are two extra parameters.
            body = analysis.get("paged") or self._read_paged(order)
            types = ", ".join(filter(None, (types, "bigint, bigint")))
            args = n + 2
        else:
            body = self.positional
            args = n
        # psycopg2 interpolates %s in the whole string, so literal % in the SQL is doubled.
        # The newline ends a trailing "-- comment" of the saved SQL before the next statement.
        self.prepare_sql = (f"PREPARE {self.statement} ({types}) AS {body}\n" if types
                            else f"PREPARE {self.statement} AS {body}\n").replace("%", "%%")
        self.execute_sql = f"EXECUTE {self.statement}({', '.join(['%s'] * args)})" if args \
            else f"EXECUTE {self.statement}"

    def _read_paged(self, order: tuple[str, ...]) -> str:
        text = sql.read_positional(self.positional, order)
        if text.kind != self.kind:
            raise ValueError("the stored kind is not the statement's")
        return sql.paged(text).text

    def rebound(self, connection: Connection) -> QueryVersion:
        """This version on ``connection`` (a changed copy of its own): nothing is read again."""
        copy = object.__new__(QueryVersion)
        for slot in QueryVersion.__slots__:
            object.__setattr__(copy, slot, getattr(self, slot))
        copy.connection = connection
        return copy

    def values(self, bound: tuple) -> tuple:
        return tuple(bound[i] for i in self.value_order)

    def stream_text(self, bound: tuple) -> str:
        """The statement with the call's values as checked literals: a server-side cursor
        cannot take parameters, so stream=true binds typed literals at the parser's parameter
        positions, checked by parsing again (gateway.sql.binding). The template is made on a
        version's first stream and kept (a memo: the same for every thread that makes it);
        only reads stream (``SavedCall.stream_text`` refuses the others first)."""
        if self.kind != "read":
            raise ValueError(f"{self.name} v{self.version} is not a read: it cannot be streamed")
        template = self.stream_template
        if template is None:
            template = self.stream_template = sql.Template(sql.read_positional(self.positional, self.order),
                                                           self.casts)
        return template.render(self.values(bound))


class Query:
    __slots__ = ("id", "name", "published", "versions")

    def __init__(self, query_id: int, name: str) -> None:
        self.id = query_id
        self.name = name
        self.published: QueryVersion | None = None
        self.versions: dict[int, QueryVersion] = {}

    def rebound(self, connections: dict[int, Connection]) -> Query:
        """A copy whose versions hold the connections of ``connections`` (by id): after a
        connection changed, its versions must carry the new one, and nothing else changed."""
        query = Query(self.id, self.name)
        for number, version in self.versions.items():
            connection = connections.get(version.connection.id)
            if connection is None:
                raise _Gap(f"query {self.id} is on connection {version.connection.id}, which the snapshot lacks")
            copy = version if version.connection is connection else version.rebound(connection)
            query.versions[number] = copy
            if version is self.published:
                query.published = copy
        return query


def _reach(value: str | list[str] | None) -> frozenset[str]:
    """A key's ``queries`` or ``connections`` grant: ``"*"`` (everything) or names."""
    if value == "*":
        return frozenset(("*",))
    return frozenset(value or ())


class ApiKey:
    __slots__ = ("id", "name", "prefix", "digest", "queries", "connections", "expires_at", "active",
                 "rate", "quota", "governance", "grants", "query_governance", "previous_prefix",
                 "previous_digest", "previous_until", "max_concurrent")

    def __init__(self, row: dict) -> None:
        grants = row["grants"] or {}
        self.id = row["id"]
        self.name = row["name"]
        self.prefix = row["prefix"]
        self.digest = bytes(row["secret_hash"])
        # Additive grants (QueryAPIGate's rule): a query is reached by its name (or "*") in ``queries``
        # or by its connection (or "*") in ``connections``; ad-hoc SQL by ``connections`` alone.
        self.queries = _reach(grants.get("queries"))
        self.connections = _reach(grants.get("connections"))
        expires: datetime | None = row["expires_at"]
        self.expires_at = expires.timestamp() if expires else None
        self.active = grants.get("active", True) is not False
        self.rate = Rate.parse(grants["rate_limit"], grants.get("rate_limit_burst")) \
            if grants.get("rate_limit") else None
        self.quota = Quota.parse(grants["quota"]) if grants.get("quota") else None
        self.max_concurrent: int | None = grants.get("max_concurrent")   # calls running at once, fleet-wide
        self.governance = Grants.from_doc(grants)
        # Per-query write grants ({"name": ..., "allow_writes": true} in ``queries``): those queries are
        # planned with writes allowed (the server's GATEWAY_ALLOW_WRITES still applies).
        writes = grants.get("query_writes") or ()
        self.query_governance = {name: Grants.from_doc(dict(grants, allow_writes=True)) for name in writes} \
            if writes else None
        # The secret before the last rotation works until its grace period ends (indexed by its own prefix).
        previous = grants.get("previous")
        self.previous_prefix = previous["prefix"] if previous else None
        self.previous_digest = bytes.fromhex(previous["digest"]) if previous else b""
        self.previous_until = datetime.fromisoformat(previous["until"]).timestamp() if previous else 0.0
        self.grants = grants

    def reaches(self, query: str, connection: str) -> bool:
        """May this key run saved query ``query`` on ``connection``?"""
        queries, connections = self.queries, self.connections
        return query in queries or connection in connections or "*" in queries or "*" in connections

    @classmethod
    def admin(cls) -> ApiKey:
        """The admin key on the data plane (QueryAPIGate's admin key runs everything): every query and
        connection, writes where the server allows them, no limits; id 0 in the history."""
        return cls({"id": 0, "name": "admin", "prefix": "", "secret_hash": b"", "expires_at": None,
                    "grants": {"queries": "*", "connections": "*", "allow_writes": True}})

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


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


class _Gap(Exception):
    """The changes do not fit the snapshot they would apply to (a version on a connection
    the snapshot does not hold): read everything instead."""


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
                    except _Gap:
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
            raise _Gap(f"query {r['query_id']} is on connection {r['connection_id']}, which the snapshot lacks")
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
    see it whole."""
    changed: dict[str, set[int]] = {"connection": set(), "query": set(), "key": set()}
    for r in logged:
        changed[r["kind"]].add(r["id"])
    rows = 0
    connections, connection_ids = current.connections, current.connection_ids
    if changed["connection"]:
        ids = sorted(changed["connection"])
        fresh = [Connection(r) for r in reads.connections(cur, ids)]
        rows += len(fresh)
        connections, connection_ids = connections.copy(), connection_ids.copy()
        for cid in ids:                      # every old entry out first: a name may move
            old = connection_ids.pop(cid, None)
            if old is not None and connections.get(old.name) is old:
                del connections[old.name]
        for connection in fresh:
            connections[connection.name] = connection_ids[connection.id] = connection

    queries, query_ids = current.queries, current.query_ids
    if changed["query"] or changed["connection"]:
        queries, query_ids = queries.copy(), query_ids.copy()
        previous: dict[int, Query] = {}
        ids = sorted(changed["query"])
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
        if changed["connection"]:
            # A version holds its connection: those on a changed one are rebound (not read
            # again; nothing else of theirs changed). A connection change is rare; this walks
            # the queries once.
            moved = changed["connection"]
            for name, query in list(queries.items()):
                if any(v.connection.id in moved and v.connection is not connection_ids.get(v.connection.id)
                       for v in query.versions.values()):
                    queries[name] = query.rebound(connection_ids)

    keys, key_ids, plans = current.keys, current.key_ids, current.plans
    if changed["key"]:
        ids = sorted(changed["key"])
        fresh_keys = [ApiKey(r) for r in reads.keys(cur, ids)]
        rows += len(fresh_keys)
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
    return Catalog(generation, keys, queries, connections, key_ids, query_ids, connection_ids, plans), rows
