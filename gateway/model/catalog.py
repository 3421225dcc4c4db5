"""The worker's in-memory catalog: keys, connections and saved queries, ready to serve.

A catalog is immutable once built. A reload builds a whole new one from the store and
swaps the reference, so a request reads one consistent snapshot with no lock. Everything
a call needs (the parameter binder, the statement text, the grants) was prepared at save
time and is only looked up here.
"""
from __future__ import annotations

import time
from datetime import datetime

import psycopg2.extensions
import psycopg2.extras

from .. import sql
from ..errors import GatewayError
from ..governance import Analysis, Grants
from .limits import Quota, Rate
from .params import SQL_TYPES, ParamBinder, ParamSpec, compile_specs


class Connection:
    __slots__ = ("id", "name", "db", "host", "port", "database", "username", "password",
                 "active", "identity")

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
        # A pool is reused across reloads only while everything that shapes a session is unchanged.
        self.identity = (self.id, self.host, self.port, self.database, self.username, self.password)


class QueryVersion:
    __slots__ = ("query_id", "name", "version", "connection", "sql", "kind", "binder",
                 "value_order", "statement", "plan_id", "prepare_sql", "execute_sql", "positional", "order", "casts",
                 "stream_template",
                 "published_at", "description", "tags", "parameters", "max_affected_rows",
                 "analysis", "masks")

    def __init__(self, name: str, row: dict, connection: Connection) -> None:
        analysis = row["extra"]["analysis"]
        specs = compile_specs(row["parameters"])
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
        self.plan_id = self.statement                                 # what a key's plan is memoised by
        self.parameters = row["parameters"]
        self.description = row["description"]
        self.tags = row["tags"]
        self.published_at = row["published_at"]
        self.max_affected_rows = row["extra"].get("max_affected_rows")
        self.masks = row["extra"].get("mask")
        self.positional = analysis["positional"]
        self.order = tuple(analysis["order"])
        self.casts: tuple[str, ...] = ()
        self.stream_template: sql.Template | None = None     # made on the first stream (see stream_text)
        self.prepare_sql = self.execute_sql = ""
        try:
            self._prepare(analysis, specs, by_name)
            governance = row["extra"].get("governance")
            self.analysis = Analysis.from_doc(governance) if governance else None
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


class ApiKey:
    __slots__ = ("id", "name", "prefix", "digest", "queries", "connections", "expires_at", "active",
                 "rate", "quota", "governance", "grants")

    def __init__(self, row: dict) -> None:
        grants = row["grants"] or {}
        self.id = row["id"]
        self.name = row["name"]
        self.prefix = row["prefix"]
        self.digest = bytes(row["secret_hash"])
        self.queries = frozenset(grants.get("queries") or ())
        self.connections = frozenset(grants.get("connections") or ())
        expires: datetime | None = row["expires_at"]
        self.expires_at = expires.timestamp() if expires else None
        self.active = grants.get("active", True) is not False
        self.rate = Rate.parse(grants["rate_limit"], grants.get("rate_limit_burst")) \
            if grants.get("rate_limit") else None
        self.quota = Quota.parse(grants["quota"]) if grants.get("quota") else None
        self.governance = Grants.from_doc(grants)
        self.grants = grants

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


class Catalog:
    __slots__ = ("generation", "keys", "queries", "connections", "loaded_at", "plans")

    def __init__(self, generation: int, keys: dict[str, ApiKey], queries: dict[str, Query],
                 connections: dict[str, Connection]) -> None:
        self.generation = generation
        self.keys = keys                  # prefix -> ApiKey
        self.queries = queries            # name -> Query
        self.connections = connections    # name -> Connection
        self.loaded_at = time.monotonic()
        # The snapshot above never changes. ``plans`` is its memo, not its data: (key id,
        # plan id) -> CallPlan or the refusal, derived from the snapshot alone, filled on first
        # use (``setdefault``: two threads deriving the same plan keep one) and dropped with
        # the catalog on reload, so grants and plans never disagree.
        self.plans: dict = {}

    @classmethod
    def empty(cls) -> Catalog:
        return cls(0, {}, {}, {})


def load(conn: psycopg2.extensions.connection) -> Catalog:
    """Read the whole catalog, and the generation it is, in one repeatable-read snapshot."""
    with conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
        cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            cur.execute("SELECT generation FROM gw_catalog_state")
            generation = cur.fetchone()["generation"]
            cur.execute("SELECT * FROM gw_connections")
            connections = {r["name"]: Connection(r) for r in cur.fetchall()}
            by_id = {c.id: c for c in connections.values()}
            cur.execute("""SELECT q.name AS query_name, q.published_version, v.*
                             FROM gw_queries q JOIN gw_query_versions v ON v.query_id = q.id
                            ORDER BY q.id, v.version""")
            queries: dict[str, Query] = {}
            for r in cur.fetchall():
                query = queries.get(r["query_name"])
                if query is None:
                    query = queries[r["query_name"]] = Query(r["query_id"], r["query_name"])
                version = QueryVersion(r["query_name"], r, by_id[r["connection_id"]])
                query.versions[version.version] = version
                if r["published_version"] == version.version:
                    query.published = version
            cur.execute("SELECT * FROM gw_api_keys")
            keys = {r["prefix"]: ApiKey(r) for r in cur.fetchall()}
        finally:
            cur.execute("COMMIT")
    return Catalog(generation, keys, queries, connections)

