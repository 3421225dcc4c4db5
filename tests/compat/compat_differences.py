"""The differences from QueryAPIGate 0.43.0 that this project keeps on purpose, each with its
reason. The differential suite (``test_compat.py``) consults this list: a call marked with a
difference must show exactly that difference (``check(peer, ours)``), so the suite fails both
when an undocumented difference appears and when a documented one goes away unnoticed. The
page docs/compatibility.md lists the same names and reasons (a test checks that it does).

``peer`` and ``ours`` are ``helpers.api.Reply`` values.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Difference:
    name: str
    reason: str
    check: Callable


def _json(reply):
    try:
        return json.loads(reply.content)
    except ValueError:
        return None


def _code(reply):
    body = _json(reply)
    return body.get("code") if isinstance(body, dict) else None


def _is(reply, status, code=None):
    return reply.status == status and (code is None or _code(reply) == code)


def _own_paths(doc) -> set:
    return {p for p in doc["paths"] if p.startswith("/q/") and p != "/q/{name}"}


def _params(doc, path) -> dict:
    """A saved query's own parameters in an OpenAPI document: name -> (required, JSON type)."""
    reserved = {"format", "page", "page_size", "timeout", "stream", "version", "cache", "connection_name"}
    return {p["name"]: (p.get("required", False), p["schema"].get("type"))
            for p in doc["paths"][path]["get"]["parameters"] if p["name"] not in reserved}


DIFFERENCES = {d.name: d for d in (
    Difference(
        "no_connections_means_none",
        "A key created without `connections` reaches no connection here (QueryAPIGate: all of them, `\"*\"`). "
        "A key made for one query must not silently reach every connection and ad-hoc SQL; grant `\"*\"` to "
        "ask for that.",
        lambda peer, ours: (peer.status == 201 and ours.status == 201
                            and _json(peer).get("connections") == "*" and _json(ours).get("connections") == [])
        or (peer.status == 200 and _is(ours, 403))),
    Difference(
        "empty_result_is_a_list",
        "A result without rows is `[]` (QueryAPIGate: `{\"message\": \"No results returned\"}`): a client "
        "iterates the rows of every answer the same way.",
        lambda peer, ours: peer.status == ours.status == 200
        and _json(peer) == {"message": "No results returned"} and _json(ours) == []),
    Difference(
        "unknown_parameter_refused",
        "A parameter the query does not declare answers 400 `param_invalid` (QueryAPIGate ignores it): a "
        "misspelt filter must not silently return unfiltered rows.",
        lambda peer, ours: peer.status == 200 and _is(ours, 400, "param_invalid")),
    Difference(
        "unknown_body_field_refused",
        "A field that is not an argument in the body of `POST /q/<name>` or `/execute_sql` answers 400 "
        "`invalid_body` (QueryAPIGate ignores it): a misspelt `page_size` or a bare `{\"aid\": 1}` must not run "
        "with defaults.",
        lambda peer, ours: peer.status in (200, 400) and _is(ours, 400, "invalid_body")),
    Difference(
        "unknown_filter_refused",
        "A filter a management listing does not know (`/api/v1/queries?stauts=draft`) answers 400 "
        "`invalid_filter` (QueryAPIGate ignores it), as `/api/v1/history` and `/api/v1/audit` do here: a "
        "misspelt filter must not return everything.",
        lambda peer, ours: peer.status == 200 and _is(ours, 400, "invalid_filter")),
    Difference(
        "versions_kept",
        "`DELETE /api/v1/queries/<name>/versions/<n>` is not served (405; QueryAPIGate deletes the version): a "
        "version number is never reused, because every worker's sessions hold prepared statements by it; "
        "publish another version, or delete the query.",
        lambda peer, ours: peer.status in (200, 204) and (_is(ours, 405, "method_not_allowed")
                                                         or _is(ours, 404, "not_found"))),
    Difference(
        "database_error_is_400",
        "A statement the database rejects answers 400 `query_failed` with the SQLSTATE and its condition name "
        "(QueryAPIGate: 500 with the server's message in `detail`): it is the statement's fault, not the "
        "server's, and the server's message can echo values, a masked column's among them.",
        lambda peer, ours: _is(peer, 500, "query_failed") and _is(ours, 400, "query_failed")
        and "detail" not in _json(ours) and "sqlstate" in _json(ours)),
    Difference(
        "write_code",
        "A write by a key or server that does not allow writes answers 403 `write_not_allowed` (QueryAPIGate: "
        "`read_only`), the code the governance table of this gateway uses for every write refusal (saved or "
        "ad hoc, and functions with side effects).",
        lambda peer, ours: _is(peer, 403, "read_only") and _is(ours, 403, "write_not_allowed")),
    Difference(
        "expired_key_code",
        "An expired key answers 401 `key_expired` (QueryAPIGate: 401 `unauthorized`): same status, and the "
        "code tells its owner to renew the key rather than look for a typo.",
        lambda peer, ours: _is(peer, 401, "unauthorized") and _is(ours, 401, "key_expired")),
    Difference(
        "description_optional",
        "A query's `description` is optional here (QueryAPIGate: 400 \"Description is missing\"): a script "
        "that sends one works the same.",
        lambda peer, ours: _is(peer, 400, "invalid_body") and ours.status == 201),
    Difference(
        "other_connection_refused",
        "`connection_name` on `/q/<name>` may only name the query's own connection (QueryAPIGate runs the SQL "
        "on another connection the key may use): the statement was analysed and governed against its own "
        "connection's schema, and is not served ungoverned elsewhere.",
        lambda peer, ours: peer.status == 200 and _is(ours, 400, "invalid_body")),
    Difference(
        "unknown_connection_404",
        "`/execute_sql` on a connection that does not exist answers 404 `connection_not_found` for every key "
        "(QueryAPIGate: 404 for the admin key, 403 `connection_forbidden` for others), as every other route of "
        "this gateway does for a missing connection.",
        lambda peer, ours: _is(peer, 403, "connection_forbidden") and _is(ours, 404, "connection_not_found")),
    Difference(
        "formats_subset",
        "Formats are `json`, `ndjson`, `csv`, `tsv`, `xml` and `yaml` (QueryAPIGate also has `xlsx` and "
        "`parquet`): those answer 400 `invalid_format`; binary spreadsheets and columnar files are not served "
        "yet.",
        lambda peer, ours: peer.status == 200 and _is(ours, 400, "invalid_format")),
    Difference(
        "body_paging",
        "`page` and `page_size` in the body of `/execute_sql` page the result (QueryAPIGate reads them from the "
        "query string only and pages the body's call by 10): the body's arguments are the caller's, all of them.",
        lambda peer, ours: peer.status == ours.status == 200 and peer.headers.get("X-Page-Size") == "10"
        and ours.headers.get("X-Page-Size") == "2"),
    Difference(
        "history_status",
        "A run's `status` in `/api/v1/history` is its HTTP status, with `code` for a refusal (QueryAPIGate: "
        "`\"success\"` or `\"error\"`): the `status=` and `code=` filters select by them.",
        lambda peer, ours: peer.status == ours.status == 200
        and _json(peer)["items"][0]["status"] in ("success", "error")
        and isinstance(_json(ours)["items"][0]["status"], int)),
    Difference(
        "openapi_31",
        "`/openapi.json` is OpenAPI 3.1 (QueryAPIGate: 3.0.3) and describes the data plane only, not the "
        "Management API; the saved queries it lists for a key are the same (checked here), each with the "
        "same typed parameters.",
        lambda peer, ours: peer.status == ours.status == 200
        and _json(peer)["openapi"].startswith("3.0") and _json(ours)["openapi"] == "3.1.0"
        and _own_paths(_json(peer)) == _own_paths(_json(ours)) != set()
        and all(_params(_json(peer), p) == _params(_json(ours), p) for p in _own_paths(_json(ours)))),
    Difference(
        "stream_value_checked",
        "`stream` must be true or false (400 `invalid_stream`); QueryAPIGate treats any other word as false.",
        lambda peer, ours: peer.status == 200 and _is(ours, 400, "invalid_stream")),
)}
