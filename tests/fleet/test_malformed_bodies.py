"""Malformed request bodies against a real gunicorn master, byte by byte on a raw socket: the
application reads no body before the key is known, an error reading one is a typed 400
``malformed_request`` (never a 500; the worker's front, fleet/server/front.py, answers it before the application), and each such request gets exactly one answer, which says
``Connection: close``, and then the connection closes (where the next request would start is
unknown). A refusal answered before a chunked body was read closes too: the server must not
parse a stranger's chunks to find the next request, and answer them a second time."""
from __future__ import annotations

import re
import socket
import time
from urllib.parse import urlsplit

import orjson
import pytest

BAD_SIZE = b"zz\r\n{}\r\n0\r\n\r\n"                          # not a hexadecimal chunk size
BARE_LF_EXTENSION = b"2;ext=a\nb\r\n{}\r\n0\r\n\r\n"         # a chunk extension holding a bare LF
NO_TERMINATOR = b"2\r\n{}XX0\r\n\r\n"                        # chunk data not followed by CRLF


def _exchange(gunicorn, head: str, body: bytes, half_close: bool = False) -> tuple[bytes, bool]:
    """Send one request; everything the server sent back, and whether it closed the connection
    (versus keeping it open for a next request, seen as a read that times out)."""
    host = urlsplit(gunicorn.base)
    with socket.create_connection((host.hostname, host.port), timeout=10) as sock:
        sock.sendall(head.encode() + body)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        received, closed, deadline = b"", False, time.monotonic() + 5
        sock.settimeout(1.5)
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break                      # still open: kept alive
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            received += chunk
    return received, closed


def _one_answer(received: bytes) -> tuple[int, dict, dict]:
    statuses = re.findall(rb"(?:^|\r\n)HTTP/1\.[01] (\d{3}) ", received)
    assert len(statuses) == 1, f"{len(statuses)} answers: {received[:1500]!r}"
    head, _, body = received.partition(b"\r\n\r\n")
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        headers[name.decode().strip().lower()] = value.decode().strip()
    return int(statuses[0]), headers, orjson.loads(body) if body else {}


def _chunked(method_path: str, key: str | None) -> str:
    auth = f"X-API-Key: {key}\r\n" if key else ""
    return (f"{method_path} HTTP/1.1\r\nHost: h\r\n{auth}Content-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n")


@pytest.fixture
def saved(http, http_endpoint, demo_connection):
    ep = http_endpoint("SELECT 1 AS one")
    ep.adhoc_key = http.key([], [demo_connection])
    return ep


@pytest.mark.parametrize("body", [BAD_SIZE, BARE_LF_EXTENSION, NO_TERMINATOR], ids=["size", "bare-lf", "terminator"])
@pytest.mark.parametrize("route", ["saved", "adhoc"])
def test_a_body_that_cannot_be_read_is_400_and_closes(gunicorn, saved, route, body):
    head = _chunked(f"POST /q/{saved.query}", saved.secret) if route == "saved" \
        else _chunked("POST /execute_sql", saved.adhoc_key)
    received, closed = _exchange(gunicorn, head, body)
    status, headers, doc = _one_answer(received)
    assert (status, doc.get("code")) == (400, "malformed_request"), received[:1000]
    assert headers.get("connection") == "close" and closed, received[:1000]
    assert doc["request_id"] == headers["x-request-id"]


def test_a_body_that_ends_early_is_400(gunicorn, saved):
    head = (f"POST /q/{saved.query} HTTP/1.1\r\nHost: h\r\nX-API-Key: {saved.secret}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n")
    received, closed = _exchange(gunicorn, head, b'{"params"', half_close=True)
    status, headers, doc = _one_answer(received)
    assert (status, doc.get("code")) == (400, "malformed_request"), received[:1000]
    assert headers.get("connection") == "close" and closed


@pytest.mark.parametrize("route", ["saved", "adhoc"])
def test_without_a_key_no_body_is_read_one_answer_and_the_connection_closes(gunicorn, saved, route):
    """Today's worst cases: a 500 (the body was read before the key), or a 401 kept alive and
    then a second, unsolicited 400 once the server parsed the chunks nobody read."""
    path = f"POST /q/{saved.query}" if route == "saved" else "POST /execute_sql"
    received, closed = _exchange(gunicorn, _chunked(path, None), BAD_SIZE)
    status, headers, doc = _one_answer(received)
    assert (status, doc.get("code")) == (400, "malformed_request"), received[:1000]   # the framing, first
    assert headers.get("connection") == "close" and closed
    received, closed = _exchange(gunicorn, _chunked(path, None), b"2\r\n{}\r\n0\r\n\r\n")
    status, headers, doc = _one_answer(received)
    assert (status, doc.get("code")) == (401, "unauthorized"), received[:1000]
    assert headers.get("connection") == "close" and closed


def test_a_good_chunked_body_still_works_and_keeps_the_connection(gunicorn, saved):
    body = b'{"params": {}}'
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    received, closed = _exchange(gunicorn, _chunked(f"POST /q/{saved.query}", saved.secret), chunked)
    status, headers, doc = _one_answer(received)
    assert status == 200 and doc == [{"one": 1}], received[:1000]
    assert headers.get("connection") == "keep-alive" and not closed
