"""End to end over real HTTP: a gunicorn master with 2 workers on the shared store and Redis."""
from __future__ import annotations

import threading
import time

import pytest
import requests

from helpers.history import wait_for_history
from helpers.util import ADMIN_KEY, wait_until

pytestmark = pytest.mark.slow


def test_the_whole_flow_over_http(http, http_endpoint):
    ep = http_endpoint("SELECT id, status FROM orders WHERE id <= :n ORDER BY id",
                       {"n": {"type": "int", "required": True, "max": 100}})
    got = http.call(ep.query, ep.secret, {"n": "3"})
    assert got.status == 200, got
    assert got.json == [{"id": 1, "status": "paid"}, {"id": 2, "status": "paid"}, {"id": 3, "status": "shipped"}]
    assert got.headers["X-Request-Id"] and got.headers["X-Has-More"] == "false"
    posted = http.post(ep.query, ep.secret, {"params": {"n": 2}, "format": "csv"})
    assert posted.status == 200 and posted.text == "id,status\n1,paid\n2,paid\n"
    bad = http.call(ep.query, ep.secret, {"n": "1000"})
    assert bad.status == 400 and bad.json["code"] == "param_invalid"
    assert bad.json["request_id"] == bad.headers["X-Request-Id"]
    assert http.request("GET", "/nope").json["code"] == "not_found"
    assert http.request("GET", "/ready").json["status"] == "ready"


def test_chunked_body_is_read(http, http_endpoint):
    ep = http_endpoint("SELECT :n AS n", {"n": {"type": "int", "default": 0}})
    got = http.request("POST", f"/q/{ep.query}", body=iter([b'{"params": ', b'{"n": 42}}']),
                       headers={"X-API-Key": ep.secret, "Content-Type": "application/json"})
    assert got.status == 200 and got.json == [{"n": 42}], got


def test_chunked_body_over_the_limit(http, http_endpoint):
    ep = http_endpoint("SELECT 1 AS one")

    def body():  # no Content-Length: the limit is enforced while reading
        yield b'{"params": {}, "x": "'
        for _ in range(40):
            yield b"y" * 32768
        yield b'"}'
    got = http.request("POST", f"/q/{ep.query}", body=body(),
                       headers={"X-API-Key": ep.secret, "Content-Type": "application/json"})
    assert got.status == 413 and got.json["code"] == "payload_too_large", got


def test_changes_from_another_process_apply_at_once(api, http, gunicorn, demo_connection):
    """A change made by the in-process app (another member of the fleet) returns only once
    every gunicorn worker serves it."""
    query = api.query("SELECT 1 AS one", connection=demo_connection)
    for _ in range(5):
        key = api.key([query], [demo_connection])
        assert http.call(query, key).status == 200  # a new key works at once, on any worker
    name = f"k-{query}"
    secret = api.key([query], [demo_connection], name=name)
    assert http.call(query, secret).status == 200
    assert api.manage("DELETE", f"/api-keys/{name}").status == 204
    for _ in range(10):  # whichever worker answers
        assert requests.get(f"{gunicorn.base}/q/{query}", headers={"X-API-Key": secret},
                            timeout=10).status_code == 401


def test_history_from_workers(http, http_endpoint, superuser):
    ep = http_endpoint("SELECT 1 AS one")
    ids = [http.call(ep.query, ep.secret).headers["X-Request-Id"] for _ in range(6)]
    found = wait_for_history(superuser, ids)
    assert set(found) == set(ids)
    assert {row[2] for row in found.values()} == {200}


def test_revocation_across_workers(gunicorn, http, http_endpoint):
    """Callers hammer a key on both workers; once DELETE returns, no call that starts
    afterwards succeeds."""
    ep = http_endpoint("SELECT 1 AS one")
    url = f"{gunicorn.base}/q/{ep.query}"
    headers = {"X-API-Key": ep.secret}
    calls: list[tuple[float, float, int]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def caller(keep_alive: bool):
        session = requests.Session() if keep_alive else None
        try:
            while not stop.is_set():
                started = time.monotonic()
                if session is not None:
                    status = session.get(url, headers=headers, timeout=10).status_code
                else:  # a fresh connection each time: lands on either worker
                    status = requests.get(url, headers=headers, timeout=10).status_code
                with lock:
                    calls.append((started, time.monotonic(), status))
        finally:
            if session is not None:
                session.close()

    threads = [threading.Thread(target=caller, args=(i % 2 == 0,)) for i in range(6)]
    for thread in threads:
        thread.start()
    def made(since: float, status: int | None = None) -> int:
        with lock:
            return sum(1 for c in calls if c[0] > since and (status is None or c[2] == status))
    try:
        wait_until(lambda: made(0, 200) > 30, 30, 0.02, lambda: f"30 calls answered before the delete: {made(0, 200)}")
        deleted = requests.delete(f"{gunicorn.base}/api/v1/api-keys/{ep.key}",
                                  headers={"X-API-Key": ADMIN_KEY}, timeout=10)
        returned = time.monotonic()
        assert deleted.status_code == 204, deleted.text
        wait_until(lambda: made(returned) > 30, 30, 0.02, lambda: f"30 calls after the delete: {made(returned)}")
    finally:
        stop.set()
        for thread in threads:
            thread.join()

    before = [c for c in calls if c[1] < returned]
    after = [c for c in calls if c[0] > returned]
    assert sum(1 for c in before if c[2] == 200) > 20, "the key was never in use before the delete"
    assert len(after) > 20, "too few calls after the delete to say anything"
    assert {c[2] for c in calls} <= {200, 401}
    successes_after = [c for c in after if c[2] != 401]
    assert not successes_after, f"{len(successes_after)} calls started after the delete returned and succeeded"


def test_one_connection_carries_unread_bodies_and_pipelined_requests(http, http_endpoint, gunicorn):
    """The worker keeps a connection without draining when a request left no body to drain
    (fleet/server/worker.py ``_keepalive_after``); a body the application never read is still drained
    before the next request is read, and pipelined requests are answered in order."""
    import re
    import socket
    from urllib.parse import urlsplit

    ep = http_endpoint("SELECT :n AS n", {"n": {"type": "int", "default": 0}})
    host = urlsplit(gunicorn.base)
    unread = b'{"params": {"n": 7}, "pad": "' + b"x" * 20000 + b'"}'
    wire = (
        # no such route: answered without reading the body, which must not be taken for a request
        "POST /nope HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(unread)}\r\n\r\n".encode() + unread
        + f"GET /q/{ep.query}?n=1 HTTP/1.1\r\nHost: h\r\nX-API-Key: {ep.secret}\r\n\r\n".encode()
        + f"GET /q/{ep.query}?n=2 HTTP/1.1\r\nHost: h\r\nX-API-Key: {ep.secret}\r\n\r\n".encode()
        + f"GET /q/{ep.query}?n=3 HTTP/1.1\r\nHost: h\r\nX-API-Key: {ep.secret}\r\nConnection: close\r\n\r\n".encode()
    )
    with socket.create_connection((host.hostname, host.port), timeout=10) as sock:
        sock.sendall(wire)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", received)
    assert statuses == [b"404", b"200", b"200", b"200"], received[:2000]
    assert received.count(b'[{"n":1}]') == 1 and received.count(b'[{"n":2}]') == 1
    assert received.index(b'[{"n":1}]') < received.index(b'[{"n":2}]') < received.index(b'[{"n":3}]')


def test_no_client_sets_the_path_or_scheme_through_forwarding_headers(gunicorn):
    """fleet/server/gunicorn_conf.py: every peer is "trusted" by gunicorn (so it skips parsing the peer's
    address per request) only because nothing is left to trust: no forwarder or scheme header.
    A client on the loopback (a trusted proxy by gunicorn's own default) sending SCRIPT_NAME,
    PATH_INFO or X-Forwarded-Proto still gets the route it asked for."""
    import socket
    from urllib.parse import urlsplit

    host = urlsplit(gunicorn.base)
    wire = (b"GET /health HTTP/1.1\r\nHost: h\r\nPATH_INFO: /nope\r\nSCRIPT_NAME: /health\r\n"
            b"X-Forwarded-Proto: https\r\nConnection: close\r\n\r\n")
    with socket.create_connection((host.hostname, host.port), timeout=10) as sock:
        sock.sendall(wire)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    assert received.startswith(b"HTTP/1.1 200 "), received[:300]
    assert b'"status"' in received, received[:300]
