"""The worker that makes a change serves it as soon as its call returns (fleet/shared/bus.py
``announce``), even when its own bus thread is late past the sync timeout: on a loaded
machine a key created through a worker was refused by that same worker (401) until its bus
thread caught up. One in-process app on the session's PostgreSQL and Redis, its bus thread
held back by hand."""
from __future__ import annotations

import threading
import time

import falcon.testing

from gateway.model.state import CatalogHolder
from helpers.api import Api
from helpers.util import wait_until


def test_a_key_created_through_a_worker_whose_bus_thread_is_late_is_served_by_it(make_app, services, monkeypatch):
    app = make_app(sync_timeout_ms=300)
    holder = app.parts.holder
    wait_until(lambda: holder.fresh() is not None, 10, what="the catalog bus")
    api = Api.in_process(falcon.testing.TestClient(app), services)
    connection = api.connection()
    query = api.query("SELECT 1 AS one", connection=connection)
    reload, released = CatalogHolder.reload, threading.Event()

    def late_on_its_bus_thread(self, at_least: int = 0) -> int:
        if self is holder and threading.current_thread().name == "gateway-bus":
            released.wait(10)          # a starved bus thread: the change reaches it late
        return reload(self, at_least=at_least)
    monkeypatch.setattr(CatalogHolder, "reload", late_on_its_bus_thread)
    try:
        started = time.monotonic()
        name, secret = api.named_key([query], [connection])
        assert time.monotonic() - started < 5, "the call waited for its own bus thread"
        got = api.call(query, secret)
        assert got.status == 200 and got.json == [{"one": 1}], got
    finally:
        released.set()
