"""How errors leave: every failure is a typed JSON body with its stable code, and an
unexpected one is logged (bounded) under the request id and answered 500 ``internal_error``."""
from __future__ import annotations

import logging
import traceback

import falcon
import orjson

from ..errors import GatewayError
from .common import chunked_body_left_unread, close_after, request_id

log = logging.getLogger("gateway")

FALCON_CODES = {400: "invalid_body", 401: "unauthorized", 404: "not_found", 405: "method_not_allowed",
                413: "payload_too_large", 415: "unsupported_media_type"}
MAX_LOGGED = 2000


def send_error(req: falcon.Request, resp: falcon.Response, error: GatewayError) -> None:
    resp.status = error.status
    resp.data = orjson.dumps(error.body(request_id(req)))
    resp.content_type = "application/json"
    if error.headers:
        for name, value in error.headers.items():
            resp.set_header(name, value)
    env = req.env
    if (error.headers and error.headers.get("Connection") == "close") or chunked_body_left_unread(env):
        resp.set_header("Connection", "close")
        close_after(env)


def on_gateway_error(req: falcon.Request, resp: falcon.Response, ex: GatewayError, params: dict) -> None:
    if ex.detail:
        log.warning("request %s: %s: %s", request_id(req), ex.code, ex.detail[:MAX_LOGGED])
    send_error(req, resp, ex)


def on_http_error(req: falcon.Request, resp: falcon.Response, ex: falcon.HTTPError, params: dict) -> None:
    status = ex.status_code
    message = ex.title if not ex.description else f"{ex.title}: {ex.description}"
    # e.g. a 405's Allow; falcon allows a list of (name, value) pairs too, so always a dict here
    send_error(req, resp, GatewayError(status, FALCON_CODES.get(status, "invalid_body"), message,
                                       headers=dict(ex.headers) if ex.headers else None))


def on_unexpected(req: falcon.Request, resp: falcon.Response, ex: BaseException, params: dict) -> None:
    # Bounded: a hostile input must not buy a megabyte of log per request.
    text = "".join(traceback.format_exception(ex))
    if len(text) > 2 * MAX_LOGGED:
        text = f"{text[:MAX_LOGGED]}\n[... {len(text) - 2 * MAX_LOGGED} characters left out ...]\n{text[-MAX_LOGGED:]}"
    log.error("unhandled error in request %s\n%s", request_id(req), text)
    send_error(req, resp, GatewayError(500, "internal_error", "internal error; quote the request id"))


def install(app: falcon.App) -> None:
    app.add_error_handler(Exception, on_unexpected)
    app.add_error_handler(falcon.HTTPError, on_http_error)
    app.add_error_handler(GatewayError, on_gateway_error)
