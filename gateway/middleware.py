"""The one middleware: every response carries ``X-Request-Id`` (errors, management,
health and data-plane alike), set in one place."""
from __future__ import annotations

from .resources.common import request_id


class RequestId:
    __slots__ = ()

    def process_response(self, req, resp, resource, req_succeeded):
        resp.set_header("X-Request-Id", request_id(req))
