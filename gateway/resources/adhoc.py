"""``POST /execute_sql``: ad-hoc SQL for keys whose ``connections`` grant covers the target.

Read by PostgreSQL's own parser and analysed exactly like a saved query (the worker's copy
of the connection's schema), once per distinct statement text and schema read: the
analysis is cached (``GATEWAY_ADHOC_CACHE`` entries; a refusal too, until the schema is read
again), and the key's plan for it is kept with the catalog snapshot like a saved query's.
Each value becomes a typed literal at a position PostgreSQL's parser reported as a
parameter, and the text is parsed again to prove it (``gateway.sql.Template``); sessions
are read-only unless the key (and the server) allow the write.
"""
from __future__ import annotations

import collections
import hashlib
import threading
import time

from .. import governance, sql
from ..errors import GatewayError, bad_request, forbidden, not_found
from ..execution import runner
from .common import client_ip, read_json, request_id
from .data import CallArgs, QueryResource, lower_timeout, send_page

FIELDS = {"sql", "params", "connection_name", "format", "page", "page_size", "timeout"}
_SCALARS = (str, int, float, bool, type(None))


class _Statement:
    __slots__ = ("template", "names", "analysis", "digest")

    def __init__(self, template, names, analysis, digest):
        self.template = template      # reads: the paged form (two more values: limit, offset)
        self.names = names
        self.analysis = analysis
        self.digest = digest


class AdHoc:
    def __init__(self, holder, pools, history, settings, admission, schemas):
        self._holder = holder
        self._pools = pools
        self._history = history
        self._settings = settings
        self._admission = admission
        self._schemas = schemas
        self._hops = settings.trust_proxy
        self._mask_key = settings.mask_key_bytes()
        self._cache: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def on_post(self, req, resp):
        started = time.perf_counter()
        rid = request_id(req)
        key = None
        try:
            ip = client_ip(req.env, self._hops)
            limits = self._admission.admit_ip(ip)
            catalog = self._holder.current()
            key = QueryResource._authenticate(req.env.get("HTTP_X_API_KEY"), catalog)
            if key.governance.allowed_ips is not None:
                key.governance.check_ip(ip)
            body = read_json(req, self._settings.max_body_bytes)
            unknown = set(body) - FIELDS
            if unknown:
                raise bad_request("invalid_body", f"unknown field(s): {', '.join(sorted(unknown))}")
            connection = self._connection(catalog, key, body.get("connection_name"))
            params = self._params(body.get("params"))
            statement = self._statement(connection, body.get("sql"))
            plan = self._plan(catalog, key, statement)
            limits += self._admission.admit_key(key)
            missing = [n for n in statement.names if n not in params]
            if missing:
                raise bad_request("param_required", "missing parameters",
                                  errors={n: "is required" for n in missing})
            extra = set(params) - set(statement.names)
            if extra:
                raise bad_request("param_invalid", "unknown parameters",
                                  errors={n: "is not a placeholder of the statement" for n in extra})
            args = CallArgs({k: body[k] for k in ("format", "page", "page_size", "timeout") if k in body},
                            self._settings)
            rows = self._run(resp, connection, statement, params, args, plan)
            for header, value in limits:
                resp.set_header(header, value)
            if rows:
                self._admission.settle(key, rows)
            self._history.record(rid, key.id, "execute_sql", None, 200, None, rows,
                                 (time.perf_counter() - started) * 1000)
        except GatewayError as exc:
            self._history.record(rid, key.id if key else None, "execute_sql", None, exc.status, exc.code,
                                 None, (time.perf_counter() - started) * 1000)
            raise

    @staticmethod
    def _connection(catalog, key, name):
        if not isinstance(name, str):
            raise bad_request("invalid_body", "connection_name is required", errors={"connection_name": "is required"})
        connection = catalog.connections.get(name)
        if connection is None or (name not in key.connections and "*" not in key.connections):
            if connection is None:
                raise not_found("connection_not_found", f"connection '{name}' not found")
            raise forbidden("connection_not_allowed", f"this key is not granted connection '{name}'")
        if not connection.active:
            raise GatewayError(503, "connection_inactive", f"connection '{name}' is inactive",
                               headers={"Retry-After": "60"})
        return connection

    @staticmethod
    def _params(params) -> dict:
        if params is None:
            return {}
        if not isinstance(params, dict):
            raise bad_request("invalid_body", "params must be an object", errors={"params": "must be an object"})
        bad = {k: "must be a string, number, boolean or null" for k, v in params.items()
               if not isinstance(v, _SCALARS) or (isinstance(v, str) and "\x00" in v)}
        if bad:
            raise bad_request("param_invalid", "invalid parameters", errors=bad)
        return params

    def _statement(self, connection, text) -> _Statement:
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
        if type(got) is tuple:
            raise GatewayError(got[0], got[1], got[2], extra=got[3])
        return got

    def _analyse(self, schema, text):
        """The statement's analysis, or the refusal to keep (so a bad statement is not
        analysed again on every call)."""
        try:
            statement = sql.read(text)
            analysis = governance.analyze(statement, schema, self._settings.search_path_tuple(),
                                          denied_functions=self._settings.denied_functions(),
                                          allowed_functions=self._settings.allowed_functions(),
                                          allowed_catalog_relations=self._settings.allowed_catalog_relations())
            template = sql.Template(sql.paged(statement) if statement.kind == "read" else statement)
            digest = hashlib.sha256(text.encode()).hexdigest()[:16]
            return _Statement(template, statement.order, analysis, f"adhoc:{digest}")
        except GatewayError as exc:
            if exc.status >= 500:  # the schema could not be read: not the statement's fault
                raise
            return (exc.status, exc.code, exc.message, exc.extra)

    def _plan(self, catalog, key, statement):
        cache_key = (key.id, statement.digest)
        got = catalog.plans.get(cache_key)
        if got is None:
            try:
                got = governance.plan(statement.analysis, key.governance, None, hash_key=self._mask_key,
                                      server_allows_writes=self._settings.allow_writes)
            except GatewayError as exc:
                got = (exc.status, exc.code, exc.message, exc.extra, exc.headers)
            catalog.plans[cache_key] = got
        if type(got) is tuple:
            raise GatewayError(got[0], got[1], got[2], extra=got[3], headers=got[4])
        return got

    def _run(self, resp, connection, statement, params, args, plan) -> int:
        write = statement.analysis.kind == "write"
        size = args.page_size if plan.max_rows is None else min(args.page_size, plan.max_rows)
        values = [params[name] for name in statement.names]
        if not write:
            values += [size + 1, (args.page - 1) * size]
        text = statement.template.render(values)
        timeout_ms = lower_timeout(args.timeout_ms, plan.query_timeout, self._settings.statement_timeout_ms)
        result = runner.execute_text(self._pools.get(connection, write), text, timeout_ms, write)
        return send_page(resp, args, size, plan, result, write)
