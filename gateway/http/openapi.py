"""Self-description for the calling key, as QueryAPIGate serves it: ``GET /openapi.json`` (an
OpenAPI 3.1 document: every published query the key may run is a typed endpoint ``/q/<name>``,
its parameters as JSON Schemas; ``/execute_sql`` when the key has a connection) and
``GET /catalog`` (the same queries as plain data, and what the caller may do).

Both read the worker's catalog snapshot and the key's memoised plans (no store read). "May
run" is the pipeline's own answer: the additive grant, then the key's plan for the published
version (a query the key's table or write grants refuse is left out). Without a key,
``/openapi.json`` describes the routes only; a wrong key answers 401 on both.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from .. import __version__
from ..errors import GatewayError, unauthorized
from ..execution.formats import FORMATS
from ..pipeline.identify import AdminIdentity, identify
from ..pipeline.plans import plan_for
from .common import client_ip

if TYPE_CHECKING:
    import falcon

    from ..model.catalog import ApiKey, Catalog, QueryVersion
    from ..model.state import CatalogHolder
    from ..settings import Settings

OPENAPI_VERSION = "3.1.0"
# A parameter's type as a JSON Schema.
_SCHEMAS = {"int": {"type": "integer", "format": "int64"}, "float": {"type": "number"}, "str": {"type": "string"},
            "bool": {"type": "boolean"}, "date": {"type": "string", "format": "date"},
            "datetime": {"type": "string", "format": "date-time"}}
_RULES = {"min": "minimum", "max": "maximum", "min_length": "minLength", "max_length": "maxLength",
          "pattern": "pattern", "enum": "enum", "default": "default", "description": "description"}
_ERROR = {"$ref": "#/components/responses/Error"}
_PAGE_HEADERS = {h: {"schema": {"type": t}, "description": d} for h, t, d in (
    ("X-Page", "integer", "The page number."), ("X-Page-Size", "integer", "Rows per page."),
    ("X-Row-Count", "integer", "Rows in this page."),
    ("X-Has-More", "string", "`true` when another page follows."))}


def reachable(catalog: Catalog, key: ApiKey, settings: Settings, mask_key: bytes) -> list[QueryVersion]:
    """The published versions ``key`` may run, by name."""
    found = []
    for name in sorted(catalog.queries):
        qv = catalog.queries[name].published
        if qv is None or not key.reaches(name, qv.connection.name):
            continue
        try:
            plan_for(catalog, key, qv, settings, mask_key)
        except GatewayError:
            continue
        found.append(qv)
    return found


def param_schema(doc: dict) -> dict:
    """A saved parameter rule (``ParamSpec.to_doc()``) as a JSON Schema."""
    kind = {"integer": "int", "number": "float", "string": "str", "boolean": "bool"}.get(doc["type"], doc["type"])
    schema: dict[str, Any] = dict(_SCHEMAS[kind])
    for rule, keyword in _RULES.items():
        if rule in doc:
            schema[keyword] = doc[rule]
    return schema


class Describer:
    """Builds both documents for a caller."""

    def __init__(self, holder: CatalogHolder, settings: Settings, admin: AdminIdentity | None) -> None:
        self._holder = holder
        self._settings = settings
        self._admin = admin
        self._mask_key = settings.mask_key_bytes()
        self.hops = settings.trust_proxy

    def caller(self, secret: str | None, ip: str, required: bool) -> tuple[Catalog, ApiKey | None]:
        catalog = self._holder.current()
        if not secret:
            if required:
                raise unauthorized("missing API key (send it as X-API-Key)")
            return catalog, None
        return catalog, identify(secret, catalog, self._admin, ip=ip)

    def openapi(self, secret: str | None, ip: str) -> dict:
        catalog, key = self.caller(secret, ip, required=False)
        paths: dict[str, Any] = {
            "/q/{name}": {"parameters": [{"name": "name", "in": "path", "required": True,
                                          "schema": {"type": "string"}}],
                          "get": self._operation("Run a saved query; other query-string arguments are its "
                                                 "parameters", "q_by_name", self._reserved(None)),
                          "post": self._operation("Run a saved query with its parameters in a JSON body",
                                                  "q_by_name_post", [], self._post_body({}, []))},
            "/health": {"get": {"summary": "Liveness", "operationId": "health", "security": [],
                                "responses": {"200": {"description": "Alive."}}}},
            "/catalog": {"get": {"summary": "The saved queries this key may run, and what it may do",
                                 "operationId": "catalog",
                                 "responses": {"200": {"description": "The caller's catalog.",
                                                       "content": {"application/json": {
                                                           "schema": {"type": "object"}}}},
                                               "401": _ERROR}}},
        }
        if key is None or key.connections:
            paths["/execute_sql"] = {"post": self._operation(
                "Run ad-hoc SQL on a connection the key is granted", "execute_sql", self._reserved(None),
                {"required": True, "content": {"application/json": {"schema": {
                    "type": "object", "required": ["sql", "connection_name"],
                    "properties": {"sql": {"type": "string"}, "connection_name": {"type": "string"},
                                   "params": {"type": "object"}}}}}})}
        if key is not None:
            for qv in reachable(catalog, key, self._settings, self._mask_key):
                paths[f"/q/{qv.name}"] = self._query_path(qv)
        return {"openapi": OPENAPI_VERSION,
                "info": {"title": "gateway-fleet", "version": __version__,
                         "description": "Saved SQL as governed HTTP endpoints"
                                        + (f", as the key '{key.name}' may call them." if key else ".")},
                "security": [{"ApiKey": []}],
                "paths": paths,
                "components": {
                    "securitySchemes": {"ApiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"}},
                    "schemas": {"Error": {"type": "object", "required": ["error", "code", "request_id"],
                                          "properties": {"error": {"type": "string"}, "code": {"type": "string"},
                                                         "request_id": {"type": "string"},
                                                         "errors": {"type": "object",
                                                                    "additionalProperties": {"type": "string"}}}}},
                    "responses": {"Error": {"description": "A typed error.", "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/Error"}}}}}}}

    def catalog(self, secret: str | None, ip: str) -> dict:
        catalog, key = self.caller(secret, ip, required=True)
        assert key is not None
        grants = key.grants
        return {"queries": [{"name": qv.name, "version": qv.version, "description": qv.description,
                             "tags": qv.tags, "collection": None, "connection_name": qv.connection.name,
                             "parameters": qv.parameters, "cache_ttl": qv.cache_ttl or None,
                             "can_write": qv.kind == "write"}
                            for qv in reachable(catalog, key, self._settings, self._mask_key)],
                "caller": {"name": key.name, "admin": key.id == 0, "allow_writes": key.governance.allow_writes,
                           "allowed_write_ops": grants.get("allowed_write_ops"),
                           "allowed_tables": grants.get("allowed_tables"), "mask": grants.get("mask"),
                           "rate_limit": grants.get("rate_limit"), "server_rate_limit": None}}

    # --- the parts of a path --------------------------------------------------------------
    def _reserved(self, qv: QueryVersion | None) -> list[dict]:
        settings = self._settings
        reserved = [
            {"name": "format", "in": "query", "schema": {"type": "string", "enum": list(FORMATS), "default": "json"}},
            {"name": "page", "in": "query", "schema": {"type": "integer", "minimum": 1, "default": 1}},
            {"name": "page_size", "in": "query", "schema": {"type": "integer", "minimum": 1,
                                                              "maximum": settings.max_page_size,
                                                              "default": settings.default_page_size}},
            {"name": "timeout", "in": "query", "schema": {"type": "number", "exclusiveMinimum": 0},
             "description": "Seconds; lowers the server's statement timeout, never raises it."},
            {"name": "stream", "in": "query", "schema": {"type": "boolean", "default": False},
             "description": "The whole result as csv, tsv or ndjson, streamed."},
        ]
        if qv is not None:
            reserved += [
                {"name": "version", "in": "query", "schema": {"type": "integer", "minimum": 1},
                 "description": f"A published version (default: the one served, {qv.version})."},
                {"name": "cache", "in": "query", "schema": {"type": "boolean", "default": True}},
                {"name": "connection_name", "in": "query",
                 "schema": {"type": "string", "enum": [qv.connection.name], "default": qv.connection.name}}]
        return reserved

    @staticmethod
    def _post_body(properties: dict, required: list[str]) -> dict:
        params: dict[str, Any] = {"type": "object", "properties": properties}
        if properties:
            params["additionalProperties"] = False
        if required:
            params["required"] = required
        schema: dict[str, Any] = {"type": "object", "properties": {"params": params}}
        if required:
            schema["required"] = ["params"]
        return {"required": bool(required), "content": {"application/json": {"schema": schema}}}

    @staticmethod
    def _operation(summary: str, operation_id: str, parameters: list, body: dict | None = None,
                   description: str | None = None) -> dict:
        rows = {"type": "array", "items": {"type": "object"}}
        operation: dict[str, Any] = {
            "summary": summary, "operationId": operation_id, "parameters": parameters,
            "responses": {"200": {"description": "A page of rows (or the whole result, streamed).",
                                  "headers": _PAGE_HEADERS,
                                  "content": {"application/json": {"schema": rows},
                                              "application/x-ndjson": {"schema": {"type": "string"}},
                                              "text/csv": {"schema": {"type": "string"}},
                                              "text/tab-separated-values": {"schema": {"type": "string"}}}},
                          **{status: _ERROR for status in ("400", "401", "403", "404", "429", "503", "504")}}}
        if description:
            operation["description"] = description
        if body is not None:
            operation["requestBody"] = body
        return operation

    def _query_path(self, qv: QueryVersion) -> dict:
        docs = qv.parameters or {}
        params = [{"name": name, "in": "query", "required": bool(doc.get("required")), "schema": param_schema(doc),
                   **({"description": doc["description"]} if doc.get("description") else {})}
                  for name, doc in docs.items()]
        required = [name for name, doc in docs.items() if doc.get("required")]
        summary = qv.description or f"Run the saved query '{qv.name}'"
        description = f"Runs version {qv.version} of the saved query '{qv.name}' ({qv.kind})."
        return {"get": self._operation(summary, f"run_{qv.name}", params + self._reserved(qv),
                                       description=description),
                "post": self._operation(f"{summary} (parameters in a JSON body)", f"run_{qv.name}_post",
                                        self._reserved(qv),
                                        self._post_body({n: param_schema(d) for n, d in docs.items()}, required),
                                        description=description)}


class OpenApiResource:
    def __init__(self, describer: Describer) -> None:
        self._describer = describer

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        describer = self._describer
        resp.data = orjson.dumps(describer.openapi(req.env.get("HTTP_X_API_KEY"), client_ip(req.env, describer.hops)))
        resp.content_type = "application/json"
        resp.set_header("Cache-Control", "no-store")   # it depends on the key


class CatalogResource:
    def __init__(self, describer: Describer) -> None:
        self._describer = describer

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        describer = self._describer
        resp.data = orjson.dumps(describer.catalog(req.env.get("HTTP_X_API_KEY"), client_ip(req.env, describer.hops)))
        resp.content_type = "application/json"
        resp.set_header("Cache-Control", "no-store")
