"""Live events (``GET /events``, ``fleet/shared/events.py``) through the session's gunicorn master
(2 workers): a stream served by one worker carries the runs served by the other worker and
the management changes, and ``Last-Event-ID`` resumes with what was missed and nothing
earlier.

The stream is opened on a keep-alive connection that first made a call: the run history's
``worker`` field of that call says which worker holds the connection, hence the stream.
"""
from __future__ import annotations

import json

import requests

from helpers.events import Connection, EventStream, run_ids
from helpers.history import wait_history_workers
from helpers.util import ADMIN_KEY, unique


def stream_id(text: str) -> tuple[int, int]:
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def call(base: str, ep, close: bool = True) -> str:
    reply = requests.get(f"{base}/q/{ep.query}", headers={"X-API-Key": ep.secret,
                                                            **({"Connection": "close"} if close else {})},
                         timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.headers["X-Request-Id"]


def changes(events) -> list[dict]:
    return [json.loads(e.data) for e in events if e.kind == "change"]


def test_events_cross_workers_changes_and_resume(gunicorn, http, http_endpoint, superuser):
    ep = http_endpoint("SELECT 1 AS one")
    pinned = Connection(gunicorn.base)
    status, headers, _ = pinned.get(f"/q/{ep.query}", {"X-API-Key": ep.secret})
    assert status == 200
    first = headers["X-Request-Id"]
    stream_worker = wait_history_workers(superuser, [first])[first]
    stream = EventStream(pinned)   # the same socket: served by `stream_worker`
    resumed = None
    try:
        assert stream.status == 200 and stream.response.getheader("Content-Type").startswith("text/event-stream")
        # Calls on new connections until one is served by the other worker.
        ids, other = [], None
        while other is None:
            assert len(ids) < 200, "every call was served by the stream's own worker"
            batch = [call(gunicorn.base, ep) for _ in range(6)]
            ids += batch
            served = wait_history_workers(superuser, batch)
            assert len(served) == len(batch)
            other = next((rid for rid in batch if served[rid] != stream_worker), None)
        stream.wait(lambda events: set(ids) <= set(run_ids(events)), what="the runs of both workers")
        runs = {json.loads(e.data)["request_id"]: json.loads(e.data) for e in stream.snapshot() if e.kind == "run"}
        assert runs[other]["worker"] != stream_worker and runs[other]["query"] == ep.query
        assert runs[other]["status"] == 200 and runs[other]["rows"] == 1
        assert first not in runs   # before the stream opened: "$" means from now on

        # A management change arrives as `event: change`.
        key = unique("key")
        http.manage("POST", "/api-keys", {"name": key, "queries": [ep.query], "connections": [ep.connection]})
        stream.wait(lambda events: any(c["name"] == key for c in changes(events)), what="the change")
        change = next(c for c in changes(stream.snapshot()) if c["name"] == key)
        assert (change["action"], change["kind"], change["actor"]) == ("create", "key", "admin")
        assert change["generation"] > 0 and change["request_id"]
        assert "secret" not in json.dumps(change)

        # Resume: the last id received, then close; what happens meanwhile arrives on the
        # new stream, and nothing up to that id does.
        seen = stream.snapshot()
        last = max(i for i, e in enumerate(seen) if e.id is not None)
        last_id = seen[last].id
        delivered = set(run_ids(seen[:last + 1])) | {c["name"] for c in changes(seen[:last + 1])}
        stream.close()
        missed = [call(gunicorn.base, ep) for _ in range(5)]
        later_key = unique("key")
        http.manage("POST", "/api-keys", {"name": later_key, "queries": [ep.query], "connections": [ep.connection]})
        resumed = EventStream(Connection(gunicorn.base), last_event_id=last_id)
        assert resumed.status == 200
        events = resumed.wait(lambda events: set(missed) <= set(run_ids(events))
                              and any(c["name"] == later_key for c in changes(events)), what="the missed events")
        again = (set(run_ids(events)) | {c["name"] for c in changes(events)}) & delivered
        assert not again, f"resumed stream repeated {len(again)} events delivered before {last_id}"
        assert all(stream_id(e.id) > stream_id(last_id) for e in events if e.id is not None)
        assert key not in {c["name"] for c in changes(events)}
    finally:
        stream.close()
        if resumed is not None:
            resumed.close()


def test_last_event_id_as_a_query_argument_and_zero(gunicorn, http_endpoint):
    """``?last_event_id=`` does what the header does (for EventSource clients that cannot set
    headers on the first connection); ``0`` replays what the bounded stream still holds."""
    ep = http_endpoint("SELECT 1 AS one")
    rid = call(gunicorn.base, ep)
    connection = Connection(gunicorn.base)
    connection.conn.request("GET", "/events?last_event_id=0", headers={"X-API-Key": ADMIN_KEY})
    response = connection.conn.getresponse()
    try:
        assert response.status == 200
        buffer = b""
        while rid.encode() not in buffer:
            chunk = response.read1(65536)
            assert chunk, "the stream ended"
            buffer += chunk
    finally:
        connection.conn.sock.shutdown(2)
        connection.close()
