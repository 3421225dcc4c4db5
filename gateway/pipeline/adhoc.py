"""The ad-hoc entry point's part of the pipeline (``POST /execute_sql``): the statement,
read by PostgreSQL's own parser and analysed like a saved query once per distinct text and
schema read, and how it runs (each value a checked literal, see ``gateway.sql.binding``).

The analysis is cached (``GATEWAY_ADHOC_CACHE`` entries), a refusal too, until the worker
reads the connection's schema again; the key's plan for it is memoised with the catalog
like a saved query's, by the text and its analysis (a new analysis is planned anew).
"""
from __future__ import annotations

import collections
import hashlib
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from .. import governance, sql
from ..errors import GatewayError, bad_request, not_found
from ..execution import runner
from ..governance.policy import analyze_under
from .args import RESERVED, CallArgs, reserved_args
from .call import Target
from .grants import check_connection

if TYPE_CHECKING:
    from ..execution.pool import SessionPool
    from ..governance.schema_cache import SchemaCache
    from ..model.catalog import ApiKey, Catalog, Connection
    from ..settings import Settings

# A refusal kept in the cache: (status, code, message, extra) of the GatewayError to raise.
_Refusal = tuple[int, str, str, dict | None]

FIELDS = frozenset({"sql", "params", "connection_name"}) | (RESERVED - {"version"})
_RESERVED = FIELDS & RESERVED   # an ad-hoc statement has no version: ?version= is ignored
_SCALARS = (str, int, float, bool, type(None))


class AdHocStatement:
    """An analysed ad-hoc statement: what the pipeline plans from and runs."""

    __slots__ = ("whole", "paged", "names", "analysis", "kind", "plan_id")
    masks = None     # ad-hoc statements carry no query masks: the key's apply
    cache_ttl = 0    # never cached

    def __init__(self, statement: sql.Statement, analysis: governance.Analysis, digest: str) -> None:
        self.whole = sql.Template(statement)
        self.paged = sql.Template(sql.paged(statement)) if statement.kind == "read" else None
        self.names = statement.order
        self.analysis = analysis
        self.kind = analysis.kind
        self.plan_id = f"adhoc:{digest}"


class AdHocStatements:
    """This worker's analysed ad-hoc statements (LRU, bounded)."""

    def __init__(self, settings: Settings, schemas: SchemaCache) -> None:
        self._settings = settings
        self._schemas = schemas
        self._cache: collections.OrderedDict[tuple, tuple[governance.Schema, AdHocStatement | _Refusal]] = \
            collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, connection: Connection, text: object) -> AdHocStatement:
        if not isinstance(text, str) or not text.strip():
            raise bad_request("invalid_body", "sql must be a non-empty string", errors={"sql": "is required"})
        schema = self._schemas.for_adhoc(connection)
        cache_key = (connection.identity, text)
        with self._lock:
            held = self._cache.get(cache_key)
            if held is not None:
                self._cache.move_to_end(cache_key)
        if held is None or held[0] is not schema:   # analysed against an older read of the schema
            held = (schema, self._analyse(schema, text))
            with self._lock:
                self._cache[cache_key] = held
                while len(self._cache) > self._settings.adhoc_cache:
                    self._cache.popitem(last=False)
        got = held[1]
        if isinstance(got, tuple):   # a kept refusal
            raise GatewayError(got[0], got[1], got[2], extra=got[3])
        return got

    def _analyse(self, schema: governance.Schema, text: str) -> AdHocStatement | _Refusal:
        """The statement's analysis, or the refusal to keep (so a bad statement is not
        analysed again on every call)."""
        try:
            statement = sql.read(text)
            analysis = analyze_under(statement, schema, self._settings)
            # The key's plan is memoised by this digest: of the text AND its analysis, so that
            # once the schema is read again and the text means something else there (a table
            # that now has children, a new operator), no plan made from the old analysis is used.
            doc = orjson.dumps(analysis.to_doc(), option=orjson.OPT_SORT_KEYS)
            digest = hashlib.sha256(text.encode() + b"\0" + doc).hexdigest()[:32]
            return AdHocStatement(statement, analysis, digest)
        except GatewayError as exc:
            if exc.status >= 500:  # the schema could not be read: not the statement's fault
                raise
            return (exc.status, exc.code, exc.message, exc.extra)


class AdHocCall:
    __slots__ = ("name", "_read_body", "_query_args", "_statements", "_settings", "_body", "_params")
    admit_before_plan = True   # its statement is read and analysed per distinct text (Pipeline.run)

    def __init__(self, read_body: Callable[[], dict], query_args: Mapping[str, Any], statements: AdHocStatements,
                 settings: Settings) -> None:
        self.name = "execute_sql"
        self._read_body = read_body      # reads and checks the JSON body (http's job)
        self._query_args = query_args
        self._statements = statements
        self._settings = settings
        self._body: dict = {}
        self._params: dict = {}

    def resolve(self, catalog: Catalog, key: ApiKey) -> Target[AdHocStatement]:
        # The body is read once the caller is known (a stranger's body is not parsed).
        body = self._body = self._read_body()
        unknown = set(body) - FIELDS
        if unknown:
            raise bad_request("invalid_body", f"unknown field(s): {', '.join(sorted(unknown))}")
        if body.get("sql") in (None, ""):   # before the grant, as QueryAPIGate checks it
            raise bad_request("sql_required", "sql is missing", errors={"sql": "is required"})
        connection = self._connection(catalog, key, body.get("connection_name"))
        self._params = self._checked_params(body.get("params"))
        # No version to record, and never cached.
        return Target(self._statements.get(connection, body.get("sql")), connection, None)

    @staticmethod
    def _connection(catalog: Catalog, key: ApiKey, name: object) -> Connection:
        if name is None or name == "":
            raise bad_request("connection_required", "connection_name is missing",
                              errors={"connection_name": "is required"})
        if not isinstance(name, str):
            raise bad_request("invalid_body", "connection_name must be a string",
                              errors={"connection_name": "must be a string"})
        connection = catalog.connections.get(name)
        if connection is None:
            raise not_found("connection_not_found", f"connection '{name}' not found")
        check_connection(key, connection)
        return connection

    @staticmethod
    def _checked_params(params: object) -> dict:
        if params is None:
            return {}
        if not isinstance(params, dict):
            raise bad_request("invalid_body", "params must be an object", errors={"params": "must be an object"})
        bad = {k: "must be a string, number, boolean or null" for k, v in params.items()
               if not isinstance(v, _SCALARS) or (isinstance(v, str) and "\x00" in v)}
        if bad:
            raise bad_request("param_invalid", "invalid parameters", errors=bad)
        return params

    def call_args(self) -> CallArgs:
        return CallArgs(reserved_args(self._query_args, self._body, _RESERVED), self._settings)

    def bind(self, statement: AdHocStatement) -> list:
        params = self._params
        missing = [n for n in statement.names if n not in params]
        if missing:
            raise bad_request("param_required", "missing parameters", errors={n: "is required" for n in missing})
        extra = set(params) - set(statement.names)
        if extra:
            raise bad_request("param_invalid", "unknown parameters",
                              errors={n: "is not a placeholder of the statement" for n in extra})
        return [params[name] for name in statement.names]

    @staticmethod
    def page(pool: SessionPool, statement: AdHocStatement, values: list, size: int, page: int,
             timeout_ms: int | None) -> runner.Result:
        if statement.kind == "write":
            return runner.execute_text(pool, statement.whole.render(values), timeout_ms, True)
        paged = statement.paged
        if paged is None:   # a read always has its paged form (its kind is the reader's)
            raise ValueError("an ad-hoc read without its paged form")
        text = paged.render(values + [size + 1, (page - 1) * size])
        return runner.execute_text(pool, text, timeout_ms, False)

    @staticmethod
    def stream_text(statement: AdHocStatement, values: list) -> str:
        if statement.kind != "read":
            raise bad_request("invalid_stream", "only reads can be streamed")
        return statement.whole.render(values)
