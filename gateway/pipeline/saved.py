"""The saved-query entry point's part of the pipeline (``/q/<name>``): which version runs,
its declared parameters, and how it runs (a prepared statement; a stream binds checked
literals, see ``gateway.sql.binding``)."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import bad_request, forbidden, not_found
from ..execution import runner
from .args import CallArgs, positive_int
from .call import Target
from .grants import check_active

if TYPE_CHECKING:
    from ..execution.pool import SessionPool
    from ..model.catalog import ApiKey, Catalog, QueryVersion
    from ..settings import Settings


class SavedCall:
    __slots__ = ("name", "_params", "_reserved", "_from_text", "_settings", "_defaults", "_arguments")
    admit_before_plan = False   # a saved version was analysed when it was saved

    def __init__(self, name: str, params: Mapping[str, Any], reserved: dict, from_text: bool, settings: Settings,
                 defaults: CallArgs, arguments: Callable[[], tuple[Mapping[str, Any], dict]] | None = None) -> None:
        """``arguments``: where ``params`` and ``reserved`` come from a request body (a POST),
        what reads them (http's job), called once the caller is known, before anything else."""
        self.name = name
        self._params = params
        self._reserved = reserved
        self._from_text = from_text      # query-string text (parsed strictly) or typed JSON values
        self._settings = settings
        self._defaults = defaults        # most calls pass no reserved argument: parsed once
        self._arguments = arguments

    def resolve(self, catalog: Catalog, key: ApiKey) -> Target[QueryVersion]:
        if self._arguments is not None:   # the body is read once the caller is known (a stranger's is not)
            self._params, self._reserved = self._arguments()
        query = catalog.queries.get(self.name)
        if query is None:
            raise not_found("query_not_found", f"no published query '{self.name}'")
        qv = query.published
        if qv is None:
            # A draft is not served. Only a key that would reach the query learns that it exists.
            latest = query.versions[max(query.versions)] if query.versions else None
            if latest is not None and key.reaches(self.name, latest.connection.name):
                raise not_found("not_published", f"query '{self.name}' has no published version")
            raise not_found("query_not_found", f"no published query '{self.name}'")
        reserved = self._reserved   # most calls pass no reserved argument: one test for both below
        if reserved:
            asked = reserved.get("version")
            if asked not in (None, ""):
                wanted = positive_int(asked, "invalid_version", "version")
                qv = query.versions.get(wanted)
                if qv is None or qv.published_at is None:
                    raise not_found("version_not_found", f"query '{self.name}' has no published version {wanted}")
        connection = qv.connection
        # Additive grants: the query by name (or "*"), or its connection (or "*").
        if not key.reaches(self.name, connection.name):
            raise forbidden("connection_forbidden", f"this key is granted neither query '{self.name}' nor its "
                            f"connection '{connection.name}'")
        if reserved:
            other = reserved.get("connection_name")
            if other not in (None, "", connection.name):
                # QueryAPIGate runs the SQL on another connection; here a statement runs only where it was
                # analysed and governed.
                raise bad_request("invalid_body", f"query '{self.name}' runs on its own connection "
                                  f"'{connection.name}' only", errors={"connection_name": "must be the query's own"})
        if not connection.active:
            check_active(connection)   # raises: the rule and its answer stay in grants.py
        return Target(qv, connection, qv.version, qv if qv.cache_ttl else None)

    def call_args(self) -> CallArgs:
        return CallArgs(self._reserved, self._settings) if self._reserved else self._defaults

    def bind(self, qv: QueryVersion) -> tuple:
        return qv.binder.bind(self._params, self._from_text)

    @staticmethod
    def page(pool: SessionPool, qv: QueryVersion, bound: tuple, size: int, page: int,
             timeout_ms: int | None) -> runner.Result:
        values = qv.values(bound)
        if qv.kind == "read":
            values += (size + 1, (page - 1) * size)
        return runner.execute(pool, qv, values, timeout_ms)

    @staticmethod
    def stream_text(qv: QueryVersion, bound: tuple) -> str:
        if qv.kind != "read":
            raise bad_request("invalid_stream", "only reads can be streamed")
        return qv.stream_text(bound)
