"""The one middleware: every response carries ``X-Request-Id`` (errors, management,
health and data-plane alike), set in one place."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .common import request_id

if TYPE_CHECKING:
    import falcon


class RequestId:
    __slots__ = ()

    def process_response(self, req: falcon.Request, resp: falcon.Response, resource: object,
                         req_succeeded: bool) -> None:
        resp.set_header("X-Request-Id", request_id(req))
