"""What every resource shares: request ids, arrival times, JSON bodies, the admin check."""
from __future__ import annotations

import hmac
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

import falcon
import orjson

from ..errors import GatewayError, bad_request, unauthorized
from ..pipeline.identify import identify
from ..request_ids import new_request_id

if TYPE_CHECKING:
    from ..model.state import CatalogHolder

# The WSGI environ key under which the server puts when the request arrived: a
# ``time.monotonic()`` float taken when the request was whole on its loop, before it waited
# for a thread. A call's timeout counts from it (``gateway.execution.deadline``).
ARRIVED = "gateway.arrived"


def arrived(env: Mapping[str, object]) -> float:
    """When the request arrived: the server's stamp (``ARRIVED``), else now, the first the
    application saw of it (a server that sets none, falcon.testing)."""
    stamp = env.get(ARRIVED)
    return stamp if isinstance(stamp, float) else time.monotonic()


def request_id(req: falcon.Request) -> str:
    rid = req.context.get("request_id")
    if rid is None:
        rid = req.context["request_id"] = new_request_id()
    return rid


def client_ip(env: Mapping[str, str], trusted_hops: int) -> str:
    """The caller's address: the socket's peer, or the address ``trusted_hops`` proxies
    back in ``X-Forwarded-For`` (entries further left are the client's to forge)."""
    if trusted_hops:
        forwarded = env.get("HTTP_X_FORWARDED_FOR")
        if forwarded:
            hops = forwarded.split(",")
            return hops[-min(trusted_hops, len(hops))].strip()
    return env.get("REMOTE_ADDR", "")


# The server's start_response, put in the environ by ``GatewayApp`` (see ``close_after``).
SERVER_START = "gateway.start_response"
_BODY_READ = "gateway.body_read"   # set once the application began reading the request's body


def check_body_head(req: falcon.Request, max_bytes: int) -> None:
    """What the head says of a JSON body, checked without reading a byte of it: its declared
    length and its media type."""
    length = req.content_length
    if length is not None and length > max_bytes:
        raise GatewayError(413, "payload_too_large", f"the body is larger than {max_bytes} bytes")
    ctype = (req.content_type or "application/json").split(";", 1)[0].strip().lower()
    if ctype != "application/json":
        raise GatewayError(415, "unsupported_media_type", "the body must be application/json")


def read_json(req: falcon.Request, max_bytes: int) -> dict:
    check_body_head(req, max_bytes)
    req.env[_BODY_READ] = True
    length = req.content_length
    try:
        if length is None and req.env.get("wsgi.input_terminated"):
            # A chunked body has no Content-Length (bounded_stream would read nothing); the
            # server marks where it ends, so read it up to the limit.
            raw = req.stream.read(max_bytes + 1)
        else:
            raw = req.bounded_stream.read(max_bytes + 1)
    except Exception as exc:
        # The server's framing errors (gunicorn's InvalidChunkSize, ChunkMissingTerminator,
        # NoMoreData, ...), a client gone mid-body: the body is the caller's fault, and where
        # the next request would start on this connection is unknown, so it closes.
        raise _malformed().with_detail(f"{type(exc).__name__}: {exc}") from None
    if length is not None and len(raw) < length:   # the client stopped before its Content-Length
        raise _malformed().with_detail(f"{len(raw)} of {length} bytes")
    if len(raw) > max_bytes:
        raise GatewayError(413, "payload_too_large", f"the body is larger than {max_bytes} bytes")
    if not raw.strip():
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise bad_request("invalid_body", "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise bad_request("invalid_body", "the body must be a JSON object")
    return body


def _malformed() -> GatewayError:
    # The worker's front refuses malformed framing before the application (fleet/server/front.py), with
    # the same code; this is for what reaches it anyway (another server, TLS, a body cut short).
    return GatewayError(400, "malformed_request", "the request body could not be read (its framing is malformed "
                        "or it ended early)", headers={"Connection": "close"})


def chunked_body_left_unread(env: Mapping) -> bool:
    """Whether the request has a chunked body the application did not begin to read: an error
    answered before it (a stranger's 401, a rate limit) closes the connection, rather than
    have the server parse the chunks of a body refused unread to find the next request (their
    framing may be malformed, which the server would answer a second time). A body of a
    declared length is drained as before: its end is known without parsing it."""
    return bool(env.get("HTTP_TRANSFER_ENCODING")) and not env.get(_BODY_READ)


def close_after(env: Mapping) -> None:
    """Have the server close the connection after this answer. A server that reads the
    application's headers does so for ``Connection: close`` (set by the caller); gunicorn drops
    an application's hop-by-hop headers, and is told through its Response, whose bound method
    its ``start_response`` is (``force_close``: it then answers ``Connection: close`` and
    closes after the answer)."""
    force_close = getattr(getattr(env.get(SERVER_START), "__self__", None), "force_close", None)
    if callable(force_close):
        force_close()


class AdminCheck:
    """Constant-time comparison of ``X-API-Key`` with the admin key. A data key (known to the
    worker's catalog, from ``holder``) answers 403 ``admin_only``, as QueryAPIGate's: it is a
    real key, only not one that may manage; anything else 401."""

    __slots__ = ("_expected", "_holder")

    def __init__(self, admin_key: str, holder: CatalogHolder | None = None) -> None:
        self._expected = admin_key.encode() if admin_key else None
        self._holder = holder

    def __call__(self, req: falcon.Request) -> None:
        given = req.env.get("HTTP_X_API_KEY", "")
        if self._expected is None or not hmac.compare_digest(given.encode(), self._expected):
            if given and self._holder is not None and self._is_data_key(given):
                raise GatewayError(403, "admin_only", "this API key may not use the Management API; send the "
                                   "admin key")
            raise unauthorized("the Management API needs the admin key in X-API-Key")

    def _is_data_key(self, given: str) -> bool:
        try:
            identify(given, self._holder.current(), ip="")   # type: ignore[union-attr]
        except GatewayError as exc:
            return exc.code == "ip_not_allowed"   # a data key, refused here for its address
        return True
