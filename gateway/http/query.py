"""``GET /q/<name>`` and ``POST /q/<name>``: a saved query, through the call pipeline.

The resource only reads the request (query string or JSON body); every rule is the
pipeline's (``gateway.pipeline``). Per call: no store read, no lock shared with other
requests beyond the pool's, no logging.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ..errors import bad_request
from ..pipeline import RESERVED, CallArgs, SavedCall, split_reserved
from ..pipeline.args import MAX_AGE, NO_STORE, reserved_args
from ..pipeline.from_memory import REPLAYABLE, FromMemory
from .common import arrived, check_body_head, client_ip, read_json, request_id

if TYPE_CHECKING:
    import falcon

    from ..pipeline import Pipeline
    from ..settings import Settings

# A request's max-age directive (RFC 9111, 5.2.1.1: delta-seconds, ASCII digits).
_MAX_AGE = re.compile(r"(?:^|[,\s])max-age\s*=\s*\"?([0-9]+)")


class QueryResource:
    __slots__ = ("_pipeline", "_settings", "_hops", "_defaults")

    def __init__(self, pipeline: Pipeline, settings: Settings) -> None:
        self._pipeline = pipeline
        self._settings = settings
        self._hops = settings.trust_proxy
        self._defaults = CallArgs({}, settings)  # most calls pass no reserved argument: parse once

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        arrival = arrived(req.env)
        params, reserved = split_reserved(req.params)
        for key, value in reserved.items():
            if isinstance(value, list):
                code = "invalid_body" if key in ("format", "connection_name") else \
                    f"invalid_{'paging' if 'page' in key else key}"
                raise bad_request(code, f"{key} was given more than once")
        env = req.env
        control = env.get("HTTP_CACHE_CONTROL")
        if control is not None:   # most calls send none: no call for it
            reserved = _no_cache(control, reserved)
        # The server's (fleet/server/worker.py): the head as received, for a GET it may ask for again.
        head = env.get(REPLAYABLE)
        request = None if head is None or control is not None else \
            FromMemory.request(head[0], head[1], env.get("REMOTE_ADDR", ""), env.get("HTTP_X_API_KEY"))
        self._run(req, resp, SavedCall(name, params, reserved, True, self._settings, self._defaults), request, arrival)

    def on_post(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        arrival = arrived(req.env)   # before the body is read: reading it is part of the call's time
        # The head's checks only (declared length, media type): the body is read once the key
        # is known (SavedCall.resolve), so a stranger's body is never read, nor parsed.
        check_body_head(req, self._settings.max_body_bytes)
        call = SavedCall(name, {}, {}, False, self._settings, self._defaults, arguments=lambda: self._body_args(req))
        self._run(req, resp, call, None, arrival)

    def _body_args(self, req: falcon.Request) -> tuple[dict, dict]:
        """A POST's parameters and reserved arguments, from its JSON body (and query string)."""
        body = read_json(req, self._settings.max_body_bytes)
        params = body.get("params", {})
        if not isinstance(params, dict):
            raise bad_request("invalid_body", "params must be an object", errors={"params": "must be an object"})
        reserved = reserved_args(req.params, body)
        unknown = set(body) - RESERVED - {"params"}
        if unknown:
            raise bad_request("invalid_body", f"unknown field(s): {', '.join(sorted(unknown))}")
        control = req.env.get("HTTP_CACHE_CONTROL")
        if control is not None:
            reserved = _no_cache(control, reserved)
        return params, reserved

    def _run(self, req: falcon.Request, resp: falcon.Response, call: SavedCall, request: tuple | None,
             arrival: float) -> None:
        env = req.env
        self._pipeline.run(resp, call, request_id=request_id(req), ip=client_ip(env, self._hops),
                           secret=env.get("HTTP_X_API_KEY"), if_none_match=env.get("HTTP_IF_NONE_MATCH"),
                           request=request, safe=req.method == "GET", arrived=arrival)


def _no_cache(control: str, reserved: dict) -> dict:
    """``Cache-Control: no-cache`` asks what ``cache=false`` asks; ``no-store`` that too, and that
    the cache keeps nothing of the answer; ``max-age=N`` for no cached answer older than N
    seconds (a browser's reload sends ``max-age=0``)."""
    lowered = control.lower()
    if "no-store" in lowered:
        reserved = dict(reserved, **{NO_STORE: True})
    max_age = _MAX_AGE.search(lowered)
    if max_age is not None:
        reserved = dict(reserved, **{MAX_AGE: int(max_age.group(1)[:10])})
    if "cache" not in reserved and ("no-cache" in lowered or "no-store" in lowered):
        reserved = dict(reserved, cache="false")
    return reserved
