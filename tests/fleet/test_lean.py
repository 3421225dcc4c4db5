"""fleet/server/lean.py against gunicorn's own code: the same bytes on the wire, the same refusals.

Each case answers one real request (parsed by gunicorn's parser from a socket pair) twice,
once through gunicorn's ``Response`` and once through ``LeanResponse``, and compares what
the client receives (the Date line aside, which only has to be a valid date)."""
from __future__ import annotations

import configparser
import re
import socket
from email.utils import parsedate_to_datetime
from pathlib import Path

import gunicorn
import pytest
from gunicorn.config import Config
from gunicorn.http import get_parser
from gunicorn.http.errors import InvalidResponseHeader, InvalidResponseHeaderName
from gunicorn.http.wsgi import Response

from fleet.server.lean import GUNICORN_VERSION, FrozenConfig, LeanResponse, http_date, require_gunicorn


def _answer(response_class: type, request: bytes, status: str, headers: list, body: list[bytes]) -> bytes:
    cfg = Config()
    server, client = socket.socketpair()
    try:
        client.sendall(request)
        req = next(get_parser(cfg, server, ("127.0.0.1", 1)))
        resp = response_class(req, server, cfg)
        resp.start_response(status, headers)
        for piece in body:
            resp.write(piece)
        resp.close()
        server.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := client.recv(65536):
            received += chunk
        return received
    finally:
        server.close()
        client.close()


def _without_date(raw: bytes) -> bytes:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    dates = [line for line in lines if line.startswith(b"Date: ")]
    assert len(dates) == 1
    parsedate_to_datetime(dates[0][6:].decode())          # a valid HTTP date
    return b"\r\n".join(line for line in lines if not line.startswith(b"Date: ")) + b"\r\n\r\n" + body


GET = b"GET /q/x HTTP/1.1\r\nHost: h\r\n\r\n"
CASES = [
    ("a usual answer", GET, "200 OK", [("Content-Type", "application/json"), ("Content-Length", "2"),
                                       ("X-Page", "1"), ("ETag", '"ab"')], [b"[]"]),
    ("values with spaces and tabs around", GET, "200 OK", [("X-A", "  v \t"), ("Content-Length", " 1 ")], [b"x"]),
    ("hop-by-hop names dropped", GET, "200 OK", [("Connection", "close"), ("Keep-Alive", "timeout=5"),
                                                 ("Server", "other"), ("Date", "x"), ("Content-Length", "1")],
     [b"x"]),
    ("a body in pieces", GET, "200 OK", [("Content-Length", "6")], [b"abc", b"def"]),
    ("a body longer than announced", GET, "200 OK", [("Content-Length", "2")], [b"abcdef"]),
    ("a body shorter than announced", GET, "200 OK", [("Content-Length", "9")], [b"abc"]),
    ("no length: chunked", GET, "200 OK", [("Content-Type", "text/csv")], [b"a,b\n", b"1,2\n"]),
    ("a 304 carries no body", GET, "304 Not Modified", [("ETag", '"x"')], [b""]),
    ("a HEAD carries no body", b"HEAD /q/x HTTP/1.1\r\nHost: h\r\n\r\n", "200 OK", [("Content-Length", "2")],
     [b"[]"]),
    ("HTTP/1.0 without keep-alive", b"GET / HTTP/1.0\r\n\r\n", "200 OK", [("Content-Length", "2")], [b"ok"]),
    ("the client asks to close", b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", "200 OK",
     [("Content-Length", "2")], [b"ok"]),
    ("an empty body", GET, "204 No Content", [], [b""]),
]


@pytest.mark.parametrize("name, request_bytes, status, headers, body", CASES, ids=[c[0] for c in CASES])
def test_the_same_bytes_as_gunicorn(name, request_bytes, status, headers, body):
    theirs = _answer(Response, request_bytes, status, list(headers), body)
    ours = _answer(LeanResponse, request_bytes, status, list(headers), body)
    assert _without_date(ours) == _without_date(theirs)


@pytest.mark.parametrize("headers, error", [
    ([("X-Bad\r\nInjected", "v")], InvalidResponseHeaderName),
    ([("X Space", "v")], InvalidResponseHeaderName),
    ([("X-A", "v\r\nX-Injected: 1")], InvalidResponseHeader),
    ([("X-A", "v\nw")], InvalidResponseHeader),
    ([("X-A", "v\x00")], InvalidResponseHeader),
    ([("X-A", 5)], TypeError),
    ([(b"X-A", "v")], TypeError),
])
def test_the_same_refusals_as_gunicorn(headers, error):
    for response_class in (Response, LeanResponse):
        # twice each: a name remembered from the first call must not skip a check in the second
        for _ in range(2):
            with pytest.raises(error):
                _answer(response_class, GET, "200 OK", list(headers), [b""])


def test_a_name_checked_once_still_has_every_value_checked():
    assert _answer(LeanResponse, GET, "200 OK", [("X-Once", "fine"), ("Content-Length", "0")], [b""])
    with pytest.raises(InvalidResponseHeader):
        _answer(LeanResponse, GET, "200 OK", [("X-Once", "bad\r\nX-Injected: 1")], [b""])


def test_frozen_config_reads_what_gunicorn_reads():
    cfg = Config()
    cfg.set("keepalive", 7)
    cfg.set("limit_request_line", 1234)
    frozen = FrozenConfig(cfg)
    for name in cfg.settings:
        assert getattr(frozen, name) == getattr(cfg, name), name
    assert frozen.is_ssl == cfg.is_ssl and frozen.sendfile == cfg.sendfile and frozen.worker_class is cfg.worker_class
    assert frozen.forwarded_allow_networks() == cfg.forwarded_allow_networks()   # methods: from the real one
    with pytest.raises(AttributeError):
        frozen.no_such_setting  # noqa: B018


def test_http_date_is_now():
    from gunicorn import util
    assert http_date() in (util.http_date(), http_date())


@pytest.mark.parametrize("request_bytes, read, expected", [
    (b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", 0, True),                                   # no body
    (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello", 0, False),         # unread
    (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello", 2, False),         # partly read
    (b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello", 5, True),          # read to its end
    (b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 0, False),
])
def test_nothing_to_drain_only_when_gthread_would_drain_nothing(request_bytes, read, expected):
    from fleet.server.lean import nothing_to_drain
    cfg = Config()
    server, client = socket.socketpair()
    try:
        client.sendall(request_bytes)
        parser = get_parser(cfg, server, ("127.0.0.1", 1))
        req = next(parser)
        if read:
            req.body.read(read)
        assert nothing_to_drain(req) is expected
        if expected:   # gthread's drain finds nothing either
            server.setblocking(False)
            assert req.body.read(1024) == b""
    finally:
        server.close()
        client.close()


def test_the_worker_is_pinned_to_the_gunicorn_it_was_written_against():
    """setup.cfg installs the version the overrides copy, and a worker refuses any other."""
    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).resolve().parents[2] / "setup.cfg")
    requires = [line.strip() for line in cfg["options"]["install_requires"].splitlines()]
    assert f"gunicorn=={GUNICORN_VERSION}" in requires, requires
    assert gunicorn.__version__ == GUNICORN_VERSION
    require_gunicorn(GUNICORN_VERSION)
    with pytest.raises(RuntimeError, match=f"written against gunicorn {re.escape(GUNICORN_VERSION)} and 0\\.0\\.1 is installed"):
        require_gunicorn("0.0.1")
