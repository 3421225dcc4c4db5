"""``/health`` (liveness, no I/O) and ``/ready`` (store and shared state reachable).

Both are answered on the server's loop when it asks (``LoopAnswers``, fleet/server/worker.py), never
behind the request threads: a liveness probe that waited for a thread would restart a worker
whose threads are all held by a slow database, the moment it most needs to keep its place.
``/ready`` is then answered from what its watcher saw at most ``READY_WATCH_S`` ago (a thread the
server starts with its loop, looking once per interval: one store ping a second per worker);
any call while the watcher has fallen behind is answered by a thread that looks itself.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import orjson

from ..pipeline.from_memory import Answer
from ..request_ids import new_request_id

if TYPE_CHECKING:
    import falcon

    from ..pipeline.from_memory import FromMemory
    from ..ports import Sync

_OK = orjson.dumps({"status": "ok"})
READY_WATCH_S = 1.0
_STATUS_LINES = {200: "200 OK", 503: "503 Service Unavailable"}


def _json_answer(status: int, body: bytes) -> Answer:
    """The answer as Falcon and the request-id middleware make it (the same headers, in order)."""
    return Answer(_STATUS_LINES[status], [("content-type", "application/json"), ("x-request-id", new_request_id()),
                                          ("content-length", str(len(body)))], body)


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
        self._seen: tuple[float, dict] | None = None     # (when, checks): the watcher's last look
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        if self.draining():
            resp.status = 503
            resp.data = orjson.dumps({"status": "draining", "checks": {}})
            resp.content_type = "application/json"
            resp.set_header("Connection", "close")
            return
        status, resp.data = self._render(self._look())
        resp.status = status
        resp.content_type = "application/json"

    def on_loop(self) -> Answer | None:
        """The watcher's last look, when it is recent and the worker is not draining; else None
        (a thread answers, as ``on_get``)."""
        seen = self._seen
        if seen is None or time.monotonic() - seen[0] > 2 * READY_WATCH_S or self.draining():
            return None
        return _json_answer(*self._render(seen[1]))

    def watch(self) -> None:
        """Look once per ``READY_WATCH_S`` from now on (the server's loop answers from the looks)."""
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watching, name="ready-watch", daemon=True)
            self._watcher.start()

    def close(self) -> None:
        self._stop.set()

    def _look(self) -> dict:
        checks = {"store": self._store_check(), "redis": self._sync.ready()}
        self._seen = (time.monotonic(), checks)
        return checks

    @staticmethod
    def _render(checks: dict) -> tuple[int, bytes]:
        ok = all(checks.values())
        return 200 if ok else 503, orjson.dumps({"status": "ready" if ok else "not_ready", "checks": checks})

    def _watching(self) -> None:
        self._look()
        while not self._stop.wait(READY_WATCH_S):
            self._look()


class LoopAnswers:
    """What the server's loop may answer without a thread (fleet/server/worker.py asks with each whole,
    plain GET): ``/health``, ``/ready`` (``Ready.on_loop``), and calls answered from memory
    (gateway/pipeline/from_memory.py). None: a thread answers."""

    __slots__ = ("_from_memory", "_ready")

    def __init__(self, from_memory: FromMemory, ready: Ready) -> None:
        self._from_memory = from_memory
        self._ready = ready

    def serve_on_loop(self) -> None:
        """The server answers on its loop from now on: ``/ready``'s watcher starts looking."""
        self._ready.watch()

    def __call__(self, target: str, fields: tuple, peer: str, secret: str | None) -> Answer | None:
        if target == "/health":
            return _json_answer(200, _OK)
        if target == "/ready":
            return self._ready.on_loop()
        return self._from_memory(target, fields, peer, secret)
