"""Helpers of the observability tests (metrics, access log, run history, live events,
graceful stops): extra gunicorn masters on the session's PostgreSQL and Redis (the
``services`` fixture of ``conftest.py``, so no second database server is started), a load
generator that keeps every answer's request id, and a server-sent events reader on a
raw keep-alive connection (so the test knows which worker serves the stream).
"""
from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import redis
import requests

from conftest import ADMIN_KEY, PASSWORD_ENV, SECRET_KEY
from fleet_helpers import ROOT, Master


class SessionServices:
    """What ``fleet_helpers.Master`` needs (``env``, ``redis_client``), on conftest's servers."""

    def __init__(self, services, settings):
        self.services = services
        self.store_url = settings.database_url
        self.redis_url = settings.redis_url

    def env(self, home, **settings) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        env.update({"GATEWAY_DATABASE_URL": self.store_url, "GATEWAY_REDIS_URL": self.redis_url,
                    "GATEWAY_ADMIN_KEY": ADMIN_KEY, "GATEWAY_SECRET_KEY": SECRET_KEY,
                    "GATEWAY_HOME": str(home), "GATEWAY_LOG_LEVEL": "warning",
                    "GATEWAY_ALLOW_FUNCTIONS": "pg_sleep",  # as conftest's settings
                    PASSWORD_ENV: self.services.pg.password()})
        env.update({"GATEWAY_" + k.upper(): str(v) for k, v in settings.items()})
        return env

    def redis_client(self, timeout: float = 2.0) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url, socket_timeout=timeout, socket_connect_timeout=timeout)


def start_masters(services, settings, home_factory, *configs: dict) -> list[Master]:
    """Start one master per ``configs`` entry (``workers`` and GATEWAY_* settings), all at
    once, and wait until every one is ready."""
    shared = SessionServices(services, settings)
    masters = []
    try:
        for config in configs:
            config = dict(config)
            master = Master(shared, home_factory(), workers=config.pop("workers", 2), **config)
            masters.append(master)
            with open(master.log_path, "ab") as log:
                master.proc = subprocess.Popen(
                    [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "fleet" / "gunicorn_conf.py"),
                     "--bind", f"127.0.0.1:{master.port}", "gateway.app:create_app()"],
                    cwd=ROOT, env=master.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True)
        for master in masters:
            master.wait_ready(90)
    except BaseException:
        for master in masters:
            master.stop()
        raise
    return masters


# --- calls that keep their request ids ------------------------------------------------------
@dataclass
class Answer:
    status: int                 # 0: no HTTP answer (connection refused, reset, timeout)
    request_id: str | None
    error: str | None = None


class Callers:
    """``threads`` clients calling ``url`` in a loop until ``stop()``, each on its own
    keep-alive ``requests.Session`` (``close=True``: a new connection per call). Every call
    is recorded with its ``X-Request-Id``; a connection error is an answer of status 0."""

    def __init__(self, url: str, secret: str, threads: int = 4, close: bool = False, pause_s: float = 0.0):
        self.url = url
        self.headers = {"X-API-Key": secret, **({"Connection": "close"} if close else {})}
        self.pause_s = pause_s
        self._stop = threading.Event()
        self._answers: list[list[Answer]] = [[] for _ in range(threads)]
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def __enter__(self) -> "Callers":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> list[Answer]:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        return self.answers

    @property
    def answers(self) -> list[Answer]:
        return [a for out in self._answers for a in list(out)]

    def wait_for(self, count: int, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.answers) < count:
            assert time.monotonic() < deadline, f"only {len(self.answers)} of {count} calls answered"
            time.sleep(0.05)

    def _run(self, index: int) -> None:
        out = self._answers[index]
        session = requests.Session()
        while not self._stop.is_set():
            try:
                reply = session.get(self.url, headers=self.headers, timeout=15)
                out.append(Answer(reply.status_code, reply.headers.get("X-Request-Id")))
            except requests.RequestException as exc:
                out.append(Answer(0, None, type(exc).__name__))
                session.close()
                session = requests.Session()
            if self.pause_s:
                time.sleep(self.pause_s)
        session.close()


def history_workers(superuser, request_ids) -> dict:
    """{request_id: worker} for the runs already in the store."""
    rows = superuser("SELECT request_id, worker FROM gw_run_history WHERE request_id = ANY(%s)",
                     (list(request_ids),))
    return dict(rows)


def wait_history_workers(superuser, request_ids, timeout_s: float = 10) -> dict:
    request_ids = set(request_ids)
    deadline = time.monotonic() + timeout_s
    while True:
        found = history_workers(superuser, request_ids)
        if len(found) == len(request_ids) or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


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
