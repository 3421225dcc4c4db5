"""``/health`` (liveness, no I/O) and ``/ready`` (store and shared state reachable)."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    import falcon

    from ..ports import Sync

_OK = orjson.dumps({"status": "ok"})


class Health:
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.data = _OK
        resp.content_type = "application/json"


class Ready:
    """Not ready while draining (gunicorn sets ``draining`` in ``post_worker_init``), so a
    load balancer stops sending before the worker goes away."""

    def __init__(self, store_check: Callable[[], bool], sync: Sync) -> None:
        self._store_check = store_check
        self._sync = sync
        self.draining: Callable[[], bool] = lambda: False

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        if self.draining():
            resp.status = 503
            resp.data = orjson.dumps({"status": "draining", "checks": {}})
            resp.content_type = "application/json"
            resp.set_header("Connection", "close")
            return
        checks = {"store": self._store_check(), "redis": self._sync.ready()}
        ok = all(checks.values())
        resp.status = 200 if ok else 503
        resp.data = orjson.dumps({"status": "ready" if ok else "not_ready", "checks": checks})
        resp.content_type = "application/json"
