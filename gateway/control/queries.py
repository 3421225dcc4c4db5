"""Saved queries and their versions. A version is read by PostgreSQL's parser and analysed
against its connection's schema first, outside any write transaction (reading a schema and
running the analysis can take a while; no lock is held meanwhile); then one short
transaction stores it, after checking that the connection is still the one analysed against."""
from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import psycopg2.errors
import psycopg2.extras

from .. import sql
from ..errors import GatewayError, bad_request, conflict, not_found
from ..governance import Analysis, compile_masks
from ..governance.policy import analyze_under
from ..model.catalog import Connection
from ..model.params import compile_specs
from ..store import statements as store
from .changes import Changes
from .validate import (
    A_STRING,
    REQUIRED,
    TRUE_OR_FALSE,
    Fields,
    Problem,
    invalid_field,
    iso,
    require_fields,
    rule,
    str_list,
    valid_name,
)

if TYPE_CHECKING:
    from ..governance.schema_cache import SchemaCache
    from ..settings import Settings

FIELDS = {"name", "connection_name", "sql", "parameters", "publish", "description", "tags",
          "max_affected_rows", "mask", "cache_ttl", "author", "columns", "query_type"}


def _an_integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# A version's body, checked where the analysis has passed (its SQL, parameters and masks are
# checked by their readers): these tables in the order the fields are met.
VERSION = Fields({"description": A_STRING, "publish": TRUE_OR_FALSE})
DESCRIBED = Fields({   # QueryAPIGate's descriptive fields: every problem named at once
    "author": rule(lambda v: isinstance(v, str) and len(v) <= 200, "must be a string of at most 200 characters"),
    "columns": rule(lambda v: isinstance(v or {}, dict) and all(isinstance(d, (str, dict)) for d in (v or {}).values()),
                    "must be an object of column descriptions"),
    "query_type": rule(lambda v: v == "sql", "must be 'sql'"),
}, invalid="invalid query")
LIMITS = Fields({"max_affected_rows": rule(lambda v: _an_integer(v) and v >= 0, "must be a non-negative integer")})
PUBLISH = Fields({"version": rule(_an_integer, "must be an integer")})
_READS_ONLY = Problem("is for reads only", "cache_ttl applies to reads only: this statement writes")
_NAME_DIFFERS = Problem("must match", "the body's name differs from the URL's")
_ATTEMPTS = 3


def values_kind(values: dict) -> str:
    """The kind of a version about to be stored (its analysis, in ``extra``)."""
    return values["extra"].adapted["analysis"]["kind"]


def _qag_version_fields(query_id: int, v: dict) -> dict:
    """The fields of a version that QueryAPIGate's OpenAPI document requires and this gateway has no
    other use for: a stable ``uuid`` (from the query's id and the version), ``author``, ``placeholders``..."""
    extra = v["extra"]
    return {"uuid": str(uuid.uuid5(_VERSION_NS, f"{query_id}:{v['version']}")),
            "author": extra.get("author", "admin"), "query_type": "sql", "mongo": None,
            "placeholders": list(dict.fromkeys(extra["analysis"].get("order", ()))),
            "columns": extra.get("columns", {}), "agent_writes": None, "mask": extra.get("mask") or [],
            "mcp": False, "last_modified_at": iso(v["created_at"])}


_VERSION_NS = uuid.UUID("6b1d3a8e-5f0c-4e36-9d8a-2f4c1e7b9a10")


class _Moved(Exception):
    """The connection changed between the analysis and the write."""


class Queries:
    def __init__(self, changes: Changes, settings: Settings, schemas: SchemaCache) -> None:
        self._changes = changes
        self._settings = settings
        self._schemas = schemas

    # --- a version, checked and analysed before any write ---------------------------------
    def _version(self, body: dict) -> tuple[dict, dict]:
        """The version's stored values and the connection row it was analysed against."""
        require_fields(body, FIELDS)
        connection_name = body.get("connection_name")
        if not isinstance(connection_name, str):
            raise invalid_field("connection_name", REQUIRED)
        with self._changes.cursor() as cur:
            row = store.connection(cur, connection_name)
        if row is None:
            raise not_found("connection_not_found", f"connection '{connection_name}' not found")
        specs = compile_specs(body.get("parameters"))
        text = sql.read(body.get("sql"), frozenset(s.name for s in specs))
        masks = body.get("mask")
        compile_masks(masks)  # checked now; applied per key at plan time
        governance = self._analyze(Connection(row), text)   # fails closed with its code
        description = body.get("description") or ""
        VERSION.check({**body, "description": description})
        # One analysis document per version: the governance analysis (kind, tables, output
        # columns, functions, ...) and PostgreSQL's reading it was made from (the positional
        # text, the parameters' first-use order, the paged form). The two kinds are one: the
        # analysis refuses a statement they disagree on.
        stored: dict[str, Any] = governance.to_doc()
        stored.update({"positional": text.text, "order": list(text.order), "kind": text.kind})
        if text.kind == "read":   # the paged form, read and checked now: a catalog load parses nothing
            stored["paged"] = sql.paged(text).text
        extra: dict[str, Any] = {"analysis": stored}
        if masks:
            extra["mask"] = masks
        extra.update(self._described(body))
        max_rows = body.get("max_affected_rows")
        if max_rows is not None:
            LIMITS.check(body)
            extra["max_affected_rows"] = max_rows
        cache_ttl = self._cache_ttl(body, text.kind)
        values = {"connection_id": row["id"], "sql": body["sql"],
                  "parameters": psycopg2.extras.Json({s.name: s.to_doc() for s in specs}),
                  "description": description, "tags": psycopg2.extras.Json(str_list(body, "tags")),
                  "extra": psycopg2.extras.Json(extra)}
        if cache_ttl is not None:
            values["cache_ttl"] = cache_ttl
        return values, row

    @staticmethod
    def _described(body: dict) -> dict:
        """QueryAPIGate's descriptive fields: ``author`` (default: the caller), ``columns`` (a
        description per output column) and ``query_type`` (``sql``, the only one here)."""
        DESCRIBED.check(body)
        author = body.get("author", "admin")
        columns = body.get("columns") or {}
        described: dict[str, Any] = {"author": author}
        if columns:
            described["columns"] = columns
        return described

    def _cache_ttl(self, body: dict, kind: str) -> int | None:
        """``cache_ttl`` (seconds; QueryAPIGate's field): reads only, never a write."""
        ttl = body.get("cache_ttl")
        if ttl is None:
            return None
        limit = self._settings.cache_max_ttl
        if isinstance(ttl, bool) or not isinstance(ttl, int) or not 0 <= ttl <= limit:
            # The message names the unit; ``errors`` has said it without, since QueryAPIGate's form.
            raise invalid_field("cache_ttl", Problem(f"must be an integer from 0 to {limit}",
                                                     f"cache_ttl must be an integer from 0 to {limit} seconds"))
        if ttl and kind != "read":
            raise invalid_field("cache_ttl", _READS_ONLY)
        return ttl

    def _analyze(self, connection: Connection, statement: sql.Statement) -> Analysis:
        """Save-time analysis against the connection's schema, read afresh."""
        return analyze_under(statement, self._schemas.fresh(connection), self._settings)

    def _saved(self, action: str, name: str, body: dict, write: Callable[[store.Cursor, dict], None]) -> None:
        """Analyse, then store in one short transaction; if the connection changed in
        between, analyse again (the analysis must be against what is stored)."""
        for _ in range(_ATTEMPTS):
            values, analysed = self._version(body)
            try:
                with self._changes.change(action, "query", name) as cur:
                    current = store.connection(cur, analysed["name"])
                    if current is None or current["id"] != analysed["id"] or \
                            current["updated_at"] != analysed["updated_at"]:
                        raise _Moved   # rolls the transaction back: no generation, no audit entry
                    write(cur, values)
                return
            except _Moved:
                continue
        raise GatewayError(409, "concurrent_change", f"connection '{analysed['name']}' kept changing while the "
                           "query was analysed; retry")

    # --- changes --------------------------------------------------------------------------
    def create(self, body: dict) -> dict:
        name = valid_name(body, "query")
        publish = body.get("publish") is True

        def write(cur, values):
            query_id = store.insert_query(cur, name)
            if values.get("cache_ttl") is not None:   # the default of the query's later versions
                store.set_query_cache_ttl(cur, query_id, values["cache_ttl"])
            self._insert_version(cur, query_id, 1, values, publish)
        try:
            self._saved("create", name, body, write)
        except psycopg2.errors.UniqueViolation:
            raise conflict("query_exists", f"query '{name}' already exists") from None
        return self.get(name)

    def add_version(self, name: str, body: dict) -> dict:
        body = dict(body)
        if body.setdefault("name", name) != name:
            raise invalid_field("name", _NAME_DIFFERS)
        with self._changes.cursor() as cur:
            self._row(cur, name)      # a missing query answers 404 before any analysis

        def write(cur, values):
            query = self._row(cur, name, lock=True)
            if "cache_ttl" not in values and query.get("cache_ttl") and values_kind(values) == "read":
                values = dict(values, cache_ttl=query["cache_ttl"])   # the query's default
            self._insert_version(cur, query["id"], store.last_version(cur, query["id"]) + 1, values,
                                 body.get("publish") is True)
        self._saved("add_version", name, body, write)
        return self.get(name)

    @staticmethod
    def _insert_version(cur: store.Cursor, query_id: int, version: int, values: dict, publish: bool) -> None:
        store.insert_version(cur, dict(values, query_id=query_id, version=version), publish)
        if publish:
            store.serve_version(cur, query_id, version)

    def publish(self, name: str, body: dict) -> dict:
        version = body.get("version")
        with self._changes.change("publish", "query", name) as cur:
            query = self._row(cur, name, lock=True)
            if version is None:
                version = store.last_version(cur, query["id"])
            PUBLISH.check({"version": version})
            if not store.mark_published(cur, query["id"], version):
                raise not_found("version_not_found", f"query '{name}' has no version {version}")
            store.serve_version(cur, query["id"], version)
        return self.get(name)

    def set_cache_ttl(self, name: str, version: int, body: dict) -> dict:
        """``PATCH /queries/<name>/versions/<n>`` ``{"cache_ttl": N|null}``: the one thing of a version
        that changes in place (QueryAPIGate's rule); its cached answers go with the change."""
        require_fields(body, {"cache_ttl"})
        if "cache_ttl" not in body:
            raise invalid_field("cache_ttl", REQUIRED)
        with self._changes.change("set_cache_ttl", "query", name) as cur:
            query = self._row(cur, name, lock=True)
            row = next((v for v in store.versions_of(cur, query["id"]) if v["version"] == version), None)
            if row is None:
                raise not_found("version_not_found", f"query '{name}' has no version {version}")
            ttl = self._cache_ttl(body, row["extra"]["analysis"]["kind"])
            store.set_version_cache_ttl(cur, query["id"], version, ttl)
        return self.get(name)

    def unpublish(self, name: str) -> dict:
        with self._changes.change("unpublish", "query", name) as cur:
            store.serve_version(cur, self._row(cur, name, lock=True)["id"], None)
        return self.get(name)

    def delete(self, name: str) -> None:
        with self._changes.change("delete", "query", name) as cur:
            if not store.delete_query(cur, name):
                raise not_found("query_not_found", f"query '{name}' not found")

    # --- reads ----------------------------------------------------------------------------
    @staticmethod
    def _row(cur: store.Cursor, name: str, lock: bool = False) -> dict:
        row = store.query(cur, name, lock)
        if row is None:
            raise not_found("query_not_found", f"query '{name}' not found")
        return row

    @staticmethod
    def _doc(query: dict, versions: list[dict], detail: bool) -> dict:
        latest = versions[-1] if versions else {}
        published = query["published_version"]
        shown = next((v for v in versions if v["version"] == published), latest)
        doc = {"name": query["name"], "description": shown.get("description", ""), "query_type": "sql",
               "connection_name": shown.get("connection_name"), "tags": shown.get("tags", []),
               "published_version": published, "latest_version": latest.get("version"),
               "has_draft": (latest.get("version") or 0) > (published or 0), "version_count": len(versions),
               "endpoint": f"/q/{query['name']}", "cache_ttl": shown.get("cache_ttl") or 0,
               "created_at": iso(query["created_at"]),
               "updated_at": iso(query["updated_at"]), "collection": None, "example": False,
               "last_used_at": None}
        if detail:
            doc["versions"] = [{"version": v["version"], "connection_name": v["connection_name"], "sql": v["sql"],
                                "parameters": v["parameters"], "description": v["description"],
                                "tags": v["tags"], "kind": v["extra"]["analysis"]["kind"],
                                "max_affected_rows": v["extra"].get("max_affected_rows"),
                                "cache_ttl": v.get("cache_ttl") or 0,
                                "status": "published" if v["version"] == published else
                                ("draft" if v["published_at"] is None else "previously_published"),
                                "published_at": iso(v["published_at"]), "created_at": iso(v["created_at"]),
                                **_qag_version_fields(query["id"], v)}
                               for v in versions]
        return doc

    def get(self, name: str) -> dict:
        with self._changes.cursor() as cur:
            query = self._row(cur, name)
            return self._doc(query, store.versions_of(cur, query["id"]), detail=True)

    def list(self, args: Mapping[str, Any] | None = None) -> dict:
        """Every query's summary by name; QueryAPIGate's filters: ``search`` (in the name, the
        description or a tag), ``status`` (``published``, ``unpublished``, ``draft``: has a version
        newer than the published one), ``connection`` and ``collection`` (none here)."""
        args = args or {}
        unknown = set(args) - {"search", "status", "connection", "collection"}
        if unknown or any(isinstance(v, list) for v in args.values()):
            raise bad_request("invalid_filter", f"unknown or repeated filter(s): {', '.join(sorted(args))}")
        status = args.get("status") or None
        if status not in (None, "published", "unpublished", "draft"):
            raise bad_request("invalid_filter", "status must be 'published', 'unpublished' or 'draft'")
        needle = (args.get("search") or "").strip().lower()
        with self._changes.cursor() as cur:
            queries = store.queries(cur)
            by_query: dict[int, list] = {}
            for v in store.all_versions(cur):
                by_query.setdefault(v["query_id"], []).append(v)
        items = []
        for q in queries:
            doc = self._doc(q, by_query.get(q["id"], []), detail=False)
            if args.get("collection") or (args.get("connection") and doc["connection_name"] != args["connection"]):
                continue
            if needle and needle not in doc["name"].lower() and needle not in (doc["description"] or "").lower() \
                    and not any(needle in str(t).lower() for t in doc["tags"]):
                continue
            published = doc["published_version"] is not None
            if (status == "published" and not published) or (status == "unpublished" and published) or \
                    (status == "draft" and not doc["has_draft"]):
                continue
            items.append(doc)
        return {"items": items}
