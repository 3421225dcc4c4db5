"""Typed errors: every failure a caller can cause has a status and a stable code.

The codes are a public contract (listed in docs/api.md's error table); the messages are
for people and may change.
"""
from __future__ import annotations

from typing import Any


class GatewayError(Exception):
    __slots__ = ("status", "code", "message", "extra", "headers", "detail")

    def __init__(self, status: int, code: str, message: str, *, extra: dict | None = None,
                 headers: dict | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra
        self.headers = headers
        self.detail = detail      # for the log only (with the request id), never for the caller

    def with_detail(self, detail: str) -> GatewayError:
        self.detail = detail
        return self

    def body(self, request_id: str) -> dict:
        doc = {"error": self.message, "code": self.code, "request_id": request_id}
        if self.extra:
            doc.update(self.extra)
        return doc


def bad_request(code: str, message: str, **extra: Any) -> GatewayError:
    return GatewayError(400, code, message, extra=extra or None)


def not_found(code: str, message: str) -> GatewayError:
    return GatewayError(404, code, message)


def conflict(code: str, message: str) -> GatewayError:
    return GatewayError(409, code, message)


def unauthorized(message: str = "missing or unknown API key") -> GatewayError:
    return GatewayError(401, "unauthorized", message)


def forbidden(code: str, message: str) -> GatewayError:
    return GatewayError(403, code, message)


def unavailable(code: str, message: str, retry_after: int = 1) -> GatewayError:
    return GatewayError(503, code, message, headers={"Retry-After": str(retry_after)})


# Every stable code, with its status and meaning: docs/api.md's error table is generated
# from this, and a test checks that each code raised anywhere is listed here.
CODES: dict[str, tuple[int, str]] = {
    "unknown_field": (400, "A management body has a field this resource does not know; `errors` names it."),
    "connection_required": (400, "`/execute_sql` was sent without `connection_name`."),
    "sql_required": (400, "`/execute_sql` was sent without `sql`."),
    "invalid_body": (400, "The body is not JSON, not an object, or a field is missing, of the wrong type or out of "
                          "range; `errors` names the fields where it can."),
    "param_invalid": (400, "A query parameter failed validation; `errors` maps each field to its problem."),
    "param_required": (400, "A required query parameter is missing; `errors` names it."),
    "pattern_unsupported": (400, "A parameter's `pattern` cannot run on RE2, the linear-time engine patterns are "
                                 "matched with: a backreference, a lookaround, a possessive quantifier, `\\Z`, "
                                 "more than 1000 repetitions, or more than 2,000 compiled instructions; `errors` "
                                 "names the parameter and RE2's reason."),
    "invalid_paging": (400, "`page` or `page_size` is not a positive integer, or `page_size` is above "
                            "`GATEWAY_MAX_PAGE_SIZE`."),
    "malformed_request": (400, "The request's framing is malformed (RFC 9112): a bare LF, a header line that is not "
                               "`name: value`, both or several Content-Length or Transfer-Encoding fields, a bad chunk "
                               "size or chunk extension. Answered by the worker's front with `Connection: close`."),
    "invalid_format": (400, "`format` is not one of `json`, `ndjson`, `csv`, `tsv`, `xml`, `yaml`."),
    "invalid_timeout": (400, "`timeout` is not a positive number of seconds."),
    "invalid_stream": (400, "`stream` is not a boolean, or asks to stream `json` (stream `csv`, `tsv` or `ndjson`)."),
    "invalid_version": (400, "`version` is not a positive integer."),
    "invalid_cache": (400, "`cache` is not true or false."),
    "invalid_filter": (400, "A filter of a management listing (`/api/v1/history`, `/api/v1/audit`) is unknown or "
                            "malformed."),
    "invalid_event_id": (400, "`Last-Event-ID` is not a stream id."),
    "invalid_sql": (400, "The saved SQL cannot be served: it does not parse, has more than one statement, an "
                         "undeclared placeholder, or a statement kind that is refused."),
    "query_failed": (400, "The data database rejected the statement (a data error such as a bad cast, a missing table "
                          "or a constraint). The answer carries the `sqlstate` and its condition name only: the "
                          "server's own message can echo values (a masked column's among them), so it goes to the log "
                          "with the request id."),
    "too_many_rows_affected": (400, "A write touched more rows than its query's `max_affected_rows`; it was rolled "
                                    "back."),
    "unauthorized": (401, "No API key, an unknown key, or a wrong admin key; on `/metrics`, a missing or wrong "
                          "metrics token."),
    "key_expired": (401, "The API key has passed its `expires_at`."),
    "admin_only": (403, "A data key was sent to the Management API, which needs the admin key."),
    "connection_forbidden": (403, "The key is granted neither the query (by name, or `\"*\"`) nor its connection "
                             "(grants are additive); for `/execute_sql`, the key is not granted the connection."),
    "metrics_disabled": (403, "`GET /metrics` with no `GATEWAY_METRICS_TOKEN` configured: it is off for every "
                              "caller (its series name the queries called); set the token and scrape with "
                              "`Authorization: Bearer <token>`."),
    "connection_inactive": (403, "The connection is marked inactive."),
    "write_not_allowed": (403, "The query writes, or calls a function with side effects (`nextval`, advisory locks, "
                               "`txid_current`, ...), and the key or the server does not allow writes."),
    "not_published": (404, "The query exists but has no published version (a draft is not served); a key that "
                      "reaches it is told so, others get `query_not_found`."),
    "query_not_found": (404, "No published query by that name (drafts are not served)."),
    "version_not_found": (404, "The query has no such version, or that version was never published."),
    "connection_not_found": (404, "No connection by that name."),
    "previous_secret_not_found": (404, "The key has no previous secret still working (never rotated, rotated "
                                  "without grace, or its grace is over)."),
    "key_not_found": (404, "No API key by that name."),
    "cache_entry_not_found": (404, "No cached answer by that key (missing, expired, purged or evicted)."),
    "not_found": (404, "No such route."),
    "method_not_allowed": (405, "The route exists but not for this HTTP method."),
    "connection_exists": (409, "A connection by that name already exists."),
    "query_exists": (409, "A query by that name already exists."),
    "key_rotation_pending": (409, "The key's previous secret still works (its rotation's grace period): end it "
                             "first (`DELETE /api/v1/api-keys/<name>/previous`) or wait until `previous_expires_at`."),
    "key_exists": (409, "An API key by that name already exists."),
    "concurrent_change": (409, "The query's connection changed three times while the query was being analysed; retry."),
    "connection_in_use": (409, "Saved queries use the connection; delete them or move them first."),
    "connection_password_unreadable": (409, "The connection's stored password was sealed under another "
                                            "`GATEWAY_SECRET_KEY` (or is damaged): set it again with "
                                            "`PATCH /api/v1/connections/<name>`."),
    "request_timeout": (408, "The request's head did not arrive within `GATEWAY_HEAD_TIMEOUT_S` of its first byte, "
                             "or its body within `GATEWAY_BODY_TIMEOUT_S`; the connection is closed."),
    "precondition_failed": (412, "A `POST /q/<name>` sent `If-None-Match` naming the ETag of the answer it would get "
                                 "(RFC 9110, 13.1.2: a GET is answered 304 then, any other method 412)."),
    "payload_too_large": (413, "The body is larger than `GATEWAY_MAX_BODY_BYTES`."),
    "unsupported_media_type": (415, "The body must be `application/json`."),
    "rate_limited": (429, "The client IP's or the key's rate limit is spent; `Retry-After` says when to retry."),
    "too_many_concurrent": (429, "The key already has `max_concurrent` calls running (a stream runs until its last row "
                                 "is sent), across the fleet; `Retry-After: 1`."),
    "quota_exceeded": (429, "The key's calls or rows quota for this day or month is used up; `Retry-After` says when "
                            "it resets."),
    "headers_too_large": (431, "The request head is larger than `GATEWAY_MAX_HEAD_BYTES`."),
    "internal_error": (500, "A bug: reported with its request id, never with internals."),
    "unsupported_transfer_coding": (501, "The request's Transfer-Encoding is not `chunked` alone (no other coding "
                                         "is supported)."),
    "value_unrenderable": (502, "The result holds a value this gateway has no rendering for in the asked format (a "
                                "gap in the Values table of docs/formats.md, reported with the request id); nothing of "
                                "the page was sent. A stream that meets one after its first rows is cut instead (no "
                                "clean end of the chunked body)."),
    "database_unavailable": (503, "The data database cannot be reached; retry after `Retry-After`."),
    "store_unavailable": (503, "The gateway's store cannot be reached; retry after `Retry-After`."),
    "admission_unavailable": (503, "Redis is unreachable and `GATEWAY_REDIS_FAILURE=closed`; retry after "
                                   "`Retry-After`."),
    "events_unavailable": (503, "Live events need Redis, and none is configured."),
    "too_many_streams": (503, "This worker already serves `GATEWAY_EVENTS_MAX_STREAMS` event streams."),
    "catalog_stale": (503, "This worker lost contact with the fleet's bus and could not reload its catalog; retry "
                           "after `Retry-After`."),
    "connection_busy": (503, "The calls of this worker to the query's connection already hold their share of its "
                             "threads (`GATEWAY_CONNECTION_THREAD_SHARE`) and none of them started or finished in the "
                             "last `GATEWAY_CONNECTION_STALL_MS`: the database is not answering them. Nothing was run; "
                             "retry after `Retry-After`."),
    "pool_exhausted": (503, "Every pooled session of this worker stayed busy past the wait limit; retry after "
                            "`Retry-After`."),
    "query_timeout": (504, "The statement ran past its timeout and was cancelled."),
    "deadline_exceeded": (504, "The call's timeout (the caller's `timeout`, the key's `query_timeout` or "
                               "`GATEWAY_STATEMENT_TIMEOUT_MS`, counted from when the request arrived, time spent "
                               "waiting for a thread or for a place on its connection included) ran out before its "
                               "statement could start. Nothing was run."),
}


# The codes governance adds (analysis: 400, planning: 403), kept here with the rest so that
# this module imports nothing of the gateway (everything raises through it);
# ``gateway.governance.codes`` names them.
GOVERNANCE_CODES: dict[str, tuple[int, str]] = {
    "sql_not_allowed": (400, "The statement kind is refused: only SELECT, VALUES, set operations, WITH (without "
                             "data-modifying parts), INSERT, UPDATE, DELETE and MERGE are served; DDL, COPY, "
                             "SET/RESET, DO, CALL, EXPLAIN, transaction control, LOCK, LISTEN/NOTIFY, SELECT ... "
                             "INTO, row locks (FOR UPDATE) and writable CTEs are not."),
    "multiple_statements": (400, "The SQL holds more than one statement."),
    "function_not_allowed": (400, "The SQL calls a function on the deny list (file, large-object, session, lock, "
                                  "replication, statistics, dynamic-SQL or remote-connection functions such as "
                                  "`pg_read_file`, `lo_import`, `set_config`, `pg_stat_get_activity`, `dblink`, "
                                  "`query_to_xml`), by name or through an operator."),
    "catalog_not_allowed": (400, "The SQL reads a relation of `pg_catalog` or `information_schema`, or one an "
                                 "extension owns (statistics hold column values, `pg_stat_activity` and "
                                 "`pg_stat_statements` other callers' statements, `pg_authid` password hashes); "
                                 "refused for every key unless `GATEWAY_ALLOW_CATALOG_RELATIONS` names it."),
    "unknown_table": (400, "The SQL names a relation that does not resolve, through the search path, to a table or "
                           "view of the connection's schema."),
    "unknown_column": (400, "The SQL names a column that does not resolve to a column of a relation in scope."),
    "analysis_failed": (400, "The SQL could not be analysed with certainty (it does not parse, two SQL readers "
                             "disagree on where its code is, it is ambiguous, or it uses a construct the analysis "
                             "does not follow), so it is refused rather than served ungoverned."),
    "table_not_allowed": (403, "The query touches a table or view outside the key's `allowed_tables`."),
    "write_op_not_allowed": (403, "One of the query's write operations (insert, update, delete, merge) is not in the "
                                  "key's `allowed_write_ops` (`INSERT ... ON CONFLICT DO UPDATE` needs insert and "
                                  "update; `MERGE` needs merge and each of its actions' operations)."),
    "mask_unresolvable": (403, "A mask rule applies, but masking cannot be guaranteed: a whole row of a masked table "
                               "is used (`row_to_json(t)`, `t.*` in a function), a view is read that no mask rule "
                               "names, masked values would be written into a table, or the result no longer has the "
                               "analysed shape."),
    "function_opaque": (403, "The query calls a user-defined function (by name, or through an operator it backs), "
                             "whose reads the gateway cannot see, and the key has table or mask restrictions."),
    "ip_not_allowed": (403, "The client address is not in the key's `allowed_ips`."),
}

CODES.update(GOVERNANCE_CODES)


def markdown_table() -> str:
    rows = ["| Status | Code | Meaning |", "| --- | --- | --- |"]
    for code, (status, meaning) in sorted(CODES.items(), key=lambda kv: (kv[1][0], kv[0])):
        rows.append(f"| {status} | `{code}` | {meaning} |")
    return "\n".join(rows)
