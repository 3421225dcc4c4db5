"""What a catalog snapshot holds, each built from its stored row once: a ``Connection``, a
saved ``Query`` and its versions (``QueryVersion``: the parameter binder, the prepared and
paged statement texts and the governance analysis, all read at save time), an ``ApiKey``
(its reach, limits and compiled grants). Nothing here reads the store or parses SQL, except a
version saved before its paged form was stored."""
from __future__ import annotations

from datetime import datetime

from .. import sql
from ..errors import GatewayError
from ..governance import Analysis, Grants
from .drivers import driver_options
from .limits import Quota, Rate
from .params import SQL_TYPES, ParamBinder, ParamSpec, compile_specs


class Gap(Exception):
    """The changes do not fit the snapshot they would apply to (a version on a connection
    the snapshot does not hold): read everything instead."""

    @classmethod
    def no_connection(cls, query_id: int, connection_id: int) -> Gap:
        return cls(f"query {query_id} is on connection {connection_id}, which the snapshot lacks")


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
                raise Gap.no_connection(self.id, version.connection.id)
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
