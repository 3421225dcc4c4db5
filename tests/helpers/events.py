"""Live events (``GET /events``) read as a client does: a server-sent events reader on one raw
keep-alive connection (one socket, so one gunicorn worker serves every request it sends: the
test knows which worker holds the stream)."""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from dataclasses import dataclass

from helpers.util import ADMIN_KEY


# --- server-sent events on one keep-alive connection ----------------------------------------
class Connection:
    """One HTTP/1.1 keep-alive connection (one socket: every request it sends reaches the
    same gunicorn worker)."""

    def __init__(self, base: str, timeout: float = 30):
        host, port = base.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=timeout)

    def get(self, path: str, headers: dict | None = None):
        self.conn.request("GET", path, headers=headers or {})
        resp = self.conn.getresponse()
        return resp.status, resp.headers, resp.read()

    def close(self) -> None:
        self.conn.close()


@dataclass
class Event:
    kind: str           # the `event:` field ("run", "change")
    data: bytes
    id: str | None      # the `id:` field, on the last event of each stream entry


class EventStream:
    """``GET /events`` read by a thread on ``connection``; events land in ``events``."""

    def __init__(self, connection: Connection, last_event_id: str | None = None):
        self.connection = connection
        headers = {"X-API-Key": ADMIN_KEY, "Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        connection.conn.request("GET", "/events", headers=headers)
        self.response = connection.conn.getresponse()
        self.status = self.response.status
        self.events: list[Event] = []
        self.connected = threading.Event()
        self._lock = threading.Lock()
        self._thread = None
        if self.status == 200:
            self._thread = threading.Thread(target=self._read, daemon=True)
            self._thread.start()
            assert self.connected.wait(15), "no ': connected' comment on the stream"

    def _read(self) -> None:
        fields: dict = {}
        try:
            while True:
                line = self.response.readline()
                if not line:
                    return
                line = line.rstrip(b"\r\n")
                if line.startswith(b": connected"):
                    self.connected.set()
                if not line:
                    if "event" in fields:
                        with self._lock:
                            self.events.append(Event(fields["event"].decode(), fields.get("data", b""),
                                                     fields["id"].decode() if "id" in fields else None))
                    fields = {}
                elif not line.startswith(b":"):
                    name, _, value = line.partition(b":")
                    fields[name.decode()] = value.removeprefix(b" ")
        except (OSError, ValueError, AttributeError, http.client.HTTPException):
            return   # the connection was closed

    def snapshot(self) -> list[Event]:
        with self._lock:
            return list(self.events)

    def wait(self, predicate, timeout_s: float = 15, what: str = "events"):
        deadline = time.monotonic() + timeout_s
        while True:
            events = self.snapshot()
            if predicate(events):
                return events
            assert time.monotonic() < deadline, f"timed out waiting for {what} ({len(events)} events seen)"
            time.sleep(0.05)

    def close(self) -> None:
        """Shut the socket down (the reader sees the end), then close the connection."""
        try:
            self.connection.conn.sock.shutdown(socket.SHUT_RDWR)
        except (OSError, AttributeError):
            pass
        if self._thread is not None:
            self._thread.join(5)
        self.connection.close()


def run_ids(events: list[Event]) -> list[str]:
    return [json.loads(e.data)["request_id"] for e in events if e.kind == "run"]
