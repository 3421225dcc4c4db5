"""``GET /events``: server-sent events of runs and management changes from the whole fleet
(admin key). ``Last-Event-ID`` resumes after an entry still held by the bounded stream."""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import GatewayError, bad_request

if TYPE_CHECKING:
    import falcon

    from ..ports import Events as EventSource

_EVENT_ID = re.compile(r"\$|\d{1,20}(-\d{1,20})?")


class Events:
    def __init__(self, source: EventSource | None, admin_check: Callable[[falcon.Request], None]) -> None:
        self._source = source
        self._check = admin_check

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        self._check(req)
        if self._source is None:
            raise GatewayError(503, "events_unavailable", "live events need Redis (GATEWAY_REDIS_URL)",
                               headers={"Retry-After": "60"})
        last = req.get_header("Last-Event-ID") or req.params.get("last_event_id") or "$"
        if not isinstance(last, str) or not _EVENT_ID.fullmatch(last):
            raise bad_request("invalid_event_id", "Last-Event-ID must be a stream id such as 1700000000000-0")
        if not self._source.acquire_reader():
            raise GatewayError(503, "too_many_streams", "this worker serves its maximum of event streams",
                               headers={"Retry-After": "5"})
        resp.content_type = "text/event-stream"
        resp.set_header("Cache-Control", "no-cache")
        resp.set_header("X-Accel-Buffering", "no")
        resp.stream = self._source.read(last)
