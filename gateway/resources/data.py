"""``GET /q/<name>`` and ``POST /q/<name>``: the hot path.

Per call: one dict lookup for the key (then a constant-time digest compare), one for the
query, the grants check, binding typed parameters, one round trip to the data database,
serialisation, and one append to the history queue. No store read, no lock shared with
other requests beyond the pool's, no logging.
"""
from __future__ import annotations

import time


from .. import crypto, governance
from ..errors import GatewayError, bad_request, forbidden, not_found, unauthorized
from ..execution import runner
from ..execution.formats import CONTENT_TYPES, FORMATS, RENDERERS, STREAM_FORMATS, stream_chunks
from .common import client_ip, read_json, request_id

RESERVED = frozenset(("format", "page", "page_size", "version", "timeout", "stream"))
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def _positive_int(value, code: str, field: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.isdigit() and len(value) < 10:
        number = int(value)
    else:
        raise bad_request(code, f"{field} must be a positive integer")
    if number < 1:
        raise bad_request(code, f"{field} must be a positive integer")
    return number


class CallArgs:
    """The reserved arguments of one call, parsed and checked."""

    __slots__ = ("fmt", "page", "page_size", "version", "timeout_ms", "stream")

    def __init__(self, raw: dict, settings):
        fmt = raw.get("format") or "json"
        if fmt not in FORMATS:
            fmt = str(fmt).lower()
            if fmt not in FORMATS:
                raise bad_request("invalid_format", f"format must be one of {', '.join(FORMATS)}")
        self.fmt = fmt
        page = raw.get("page")
        self.page = 1 if page in (None, "") else _positive_int(page, "invalid_paging", "page")
        size = raw.get("page_size")
        self.page_size = settings.default_page_size if size in (None, "") else \
            _positive_int(size, "invalid_paging", "page_size")
        if self.page_size > settings.max_page_size:
            raise bad_request("invalid_paging", f"page_size must not exceed {settings.max_page_size}")
        version = raw.get("version")
        self.version = None if version in (None, "") else _positive_int(version, "invalid_version", "version")
        self.timeout_ms = self._timeout(raw.get("timeout"), settings.statement_timeout_ms)
        stream = raw.get("stream")
        if stream is None or stream is False or (isinstance(stream, str) and stream.lower() in _FALSE):
            self.stream = False
        elif stream is True or (isinstance(stream, str) and stream.lower() in _TRUE):
            if fmt not in STREAM_FORMATS:
                raise bad_request("invalid_stream", "only csv and ndjson can be streamed")
            self.stream = True
        else:
            raise bad_request("invalid_stream", "stream must be true or false")

    @staticmethod
    def _timeout(raw, server_ms: int):
        """A caller may lower the server's statement timeout, never raise it."""
        if raw in (None, ""):
            return None
        try:
            seconds = float(raw)
        except (TypeError, ValueError):
            raise bad_request("invalid_timeout", "timeout must be a number of seconds") from None
        if not 0 < seconds < 1e9 or isinstance(raw, bool):
            raise bad_request("invalid_timeout", "timeout must be a positive number of seconds")
        wanted = max(1, int(seconds * 1000))
        return wanted if wanted < server_ms else None


def lower_timeout(asked_ms, key_limit_s, server_ms: int):
    """The statement timeout of a call: the lowest of the caller's, the key's and the
    server's; None when it is the server's own (set once per session)."""
    if key_limit_s is not None:
        key_ms = max(1, int(key_limit_s * 1000))
        asked_ms = key_ms if asked_ms is None else min(asked_ms, key_ms)
    return asked_ms if asked_ms is not None and asked_ms < server_ms else None


def send_page(resp, args, size: int, plan, result, write: bool) -> int:
    """One page of a result, masked, in the asked format, with the paging headers; returns
    the rows sent. (``result.rows`` holds up to size + 1 rows: the extra one only tells
    that there is more.)"""
    rows = result.rows
    has_more = len(rows) > size
    if has_more:
        rows = rows[:size]
    columns, rows = plan.apply(result.columns, rows)
    resp.data = RENDERERS[args.fmt](columns, rows)
    resp.content_type = CONTENT_TYPES[args.fmt]
    resp.set_header("X-Page", str(args.page))
    resp.set_header("X-Page-Size", str(size))
    resp.set_header("X-Row-Count", str(len(rows)))
    resp.set_header("X-Has-More", "true" if has_more else "false")
    if write:
        resp.set_header("X-Rows-Affected", str(max(result.rowcount, 0)))
    return len(rows)


def _metered(batches, limit: int | None, charge):
    """A stream capped at ``limit`` rows (None: no cap; the key's ``max_rows`` and what is
    left of its rows quota), each batch charged to the quota as it is sent; the cursor is
    closed early when the cap is reached."""
    left = limit
    try:
        for batch in batches:
            if left is not None:
                if len(batch) >= left:
                    batch = batch[:left]
                    left = 0
                else:
                    left -= len(batch)
            if batch:
                charge(len(batch))
                yield batch
            if left == 0:
                return
    finally:
        batches.close()


def _split(raw: dict) -> tuple[dict, dict]:
    reserved = {k: raw[k] for k in RESERVED if k in raw}
    if not reserved:
        return raw, reserved
    return {k: v for k, v in raw.items() if k not in RESERVED}, reserved


def call_plan(catalog, key, qv, settings, mask_key: bytes):
    """What this key gets from this query version (``gateway.governance.plan``), computed
    on first use and kept with the catalog snapshot; a refusal is kept too."""
    cache_key = (key.id, qv.statement)
    got = catalog.plans.get(cache_key)
    if got is None:
        try:
            if qv.analysis is None:
                raise bad_request("analysis_failed", "this version was saved without an analysis; save it again")
            got = governance.plan(qv.analysis, key.governance, qv.masks, hash_key=mask_key,
                                  server_allows_writes=settings.allow_writes)
        except GatewayError as exc:
            got = (exc.status, exc.code, exc.message, exc.extra, exc.headers)
        catalog.plans[cache_key] = got
    if type(got) is tuple:  # a fresh exception each time: one raised twice would grow its traceback
        raise GatewayError(got[0], got[1], got[2], extra=got[3], headers=got[4])
    return got


class QueryResource:
    __slots__ = ("_holder", "_pools", "_history", "_settings", "_admission", "_hops", "_defaults", "_mask_key")

    def __init__(self, holder, pools, history, settings, admission):
        self._holder = holder
        self._pools = pools
        self._history = history
        self._settings = settings
        self._admission = admission
        self._hops = settings.trust_proxy
        self._defaults = CallArgs({}, settings)  # most calls pass no reserved argument: parse once
        self._mask_key = settings.mask_key_bytes()

    def on_get(self, req, resp, name):
        params, reserved = _split(req.params)
        for key, value in reserved.items():
            if isinstance(value, list):
                raise bad_request("invalid_body" if key == "format" else f"invalid_{'paging' if 'page' in key else key}",
                                  f"{key} was given more than once")
        self._serve(req, resp, name, params, reserved, from_text=True)

    def on_post(self, req, resp, name):
        body = read_json(req, self._settings.max_body_bytes)
        params = body.get("params", {})
        if not isinstance(params, dict):
            raise bad_request("invalid_body", "params must be an object", errors={"params": "must be an object"})
        reserved = {k: v for k, v in req.params.items() if k in RESERVED}
        reserved.update((k, body[k]) for k in RESERVED if k in body)
        unknown = set(body) - RESERVED - {"params"}
        if unknown:
            raise bad_request("invalid_body", f"unknown field(s): {', '.join(sorted(unknown))}")
        self._serve(req, resp, name, params, reserved, from_text=False)

    def _serve(self, req, resp, name, params, reserved, from_text):
        started = time.perf_counter()
        rid = request_id(req)
        key = qv = None
        admission = self._admission
        env = req.env
        try:
            ip = client_ip(env, self._hops)
            limits = admission.admit_ip(ip)
            catalog = self._holder.current()
            key = self._authenticate(env.get("HTTP_X_API_KEY"), catalog)
            if key.governance.allowed_ips is not None:
                key.governance.check_ip(ip)
            qv = self._resolve(catalog, key, name, reserved.get("version"))
            plan = call_plan(catalog, key, qv, self._settings, self._mask_key)
            limits += admission.admit_key(key)
            args = CallArgs(reserved, self._settings) if reserved else self._defaults
            bound = qv.binder.bind(params, from_text)
            pool = self._pools.get(qv.connection, qv.kind == "write")
            timeout_ms = lower_timeout(args.timeout_ms, plan.query_timeout, self._settings.statement_timeout_ms)
            if args.stream:
                rows = self._stream(resp, pool, qv, bound, args, plan, timeout_ms, key)
            else:
                rows = self._page(resp, pool, qv, bound, args, plan, timeout_ms)
            for header, value in limits:
                resp.set_header(header, value)
            if rows:
                admission.settle(key, rows)
            self._history.record(rid, key.id, qv.name, qv.version, 200, None, rows,
                                 (time.perf_counter() - started) * 1000)
        except GatewayError as exc:
            self._history.record(rid, key.id if key else None, qv.name if qv else name,
                                 qv.version if qv else None, exc.status, exc.code, None,
                                 (time.perf_counter() - started) * 1000)
            raise

    @staticmethod
    def _authenticate(secret, catalog):
        if not secret:
            raise unauthorized("missing API key (send it as X-API-Key)")
        record = catalog.keys.get(crypto.secret_prefix(secret))
        if record is None or not crypto.matches(secret, record.digest) or not record.active:
            raise unauthorized()
        if record.expires_at is not None and record.expired(time.time()):
            raise GatewayError(401, "key_expired", "this API key has expired")
        return record

    @staticmethod
    def _resolve(catalog, key, name, version_arg):
        query = catalog.queries.get(name)
        qv = query.published if query is not None else None
        # Unknown and not-granted look alike to a caller who is not granted the query.
        if qv is None or (name not in key.queries and "*" not in key.queries):
            if qv is not None or query is not None and name in key.queries:
                raise not_found("query_not_found", f"query '{name}' is not published") if qv is None else \
                    forbidden("query_not_allowed", f"this key is not granted query '{name}'")
            raise not_found("query_not_found", f"no published query '{name}'")
        if version_arg not in (None, ""):
            wanted = _positive_int(version_arg, "invalid_version", "version")
            qv = query.versions.get(wanted)
            if qv is None or qv.published_at is None:
                raise not_found("version_not_found", f"query '{name}' has no published version {wanted}")
        connection = qv.connection
        if connection.name not in key.connections and "*" not in key.connections:
            raise forbidden("connection_not_allowed", f"this key is not granted connection '{connection.name}'")
        if not connection.active:
            raise GatewayError(503, "connection_inactive", f"connection '{connection.name}' is inactive",
                               headers={"Retry-After": "60"})
        return qv

    def _page(self, resp, pool, qv, bound, args, plan, timeout_ms) -> int:
        size = args.page_size
        if plan.max_rows is not None and plan.max_rows < size:
            size = plan.max_rows   # the key's max_rows: pages of that size
        values = qv.values(bound)
        if qv.kind == "read":
            values += (size + 1, (args.page - 1) * size)
        result = runner.execute(pool, qv, values, timeout_ms)
        return send_page(resp, args, size, plan, result, qv.kind == "write")

    def _stream(self, resp, pool, qv, bound, args, plan, timeout_ms, key) -> None:
        if qv.kind != "read" or qv.stream_template is None:
            raise bad_request("invalid_stream", "only reads can be streamed")
        columns, batches = runner.stream(pool, qv.stream_text(bound), timeout_ms,
                                         self._settings.stream_fetch_rows)
        if not plan.identity:
            out = plan.columns(columns)
            batches = (plan.apply(columns, batch)[1] for batch in batches)
            columns = out
        limit = self._admission.rows_left(key)
        if plan.max_rows is not None:
            limit = plan.max_rows if limit is None else min(limit, plan.max_rows)
        batches = _metered(batches, limit, lambda rows: self._admission.settle(key, rows))
        resp.stream = stream_chunks(args.fmt, columns, batches)
        resp.content_type = CONTENT_TYPES[args.fmt]
        resp.set_header("X-Stream", "true")
        return None
