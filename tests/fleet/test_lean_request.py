"""fleet/server/lean_request.py against gunicorn's own parser: the same request, or the same refusal.

Every case is read twice from the same bytes, by gunicorn's ``RequestParser`` and by
``LeanParser``, and everything the worker and the application use is compared: the fields
(method, target, path, query, fragment, version, headers, scheme), whether the connection
closes, whether a 100 Continue is owed, the body, the request after it on the same connection, and the WSGI environ. Heads
come from a generator that mixes the plain kind with everything that must not take the short
way (smuggling shapes, odd bytes, limits), cut into reads at random points."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from gunicorn.config import Config
from gunicorn.http import wsgi
from gunicorn.http.parser import RequestParser
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.server import lean_request
from fleet.server.lean import FrozenConfig
from fleet.server.lean_request import (
    REPLAYABLE,
    LeanParser,
    LeanRequest,
    plain_environ,
    plain_heads_allowed,
    replayable,
)
from gateway.pipeline import from_memory

CLIENT = ("10.1.2.3", 40000)
SERVER = ("127.0.0.1", 8000)


def _config(**overrides: object) -> FrozenConfig:
    cfg = Config()
    for name, value in {"forwarded_allow_ips": "*", "secure_scheme_headers": {}, "forwarder_headers": "",
                        **overrides}.items():
        cfg.set(name, value)
    return FrozenConfig(cfg)


CFG = _config()


def _read(parser_class: type, chunks: list[bytes], cfg: FrozenConfig = CFG) -> list:
    """What the application would see of each request on one connection, in order, and how the
    connection ends (a refusal's class, or the end of the requests)."""
    parser = parser_class(cfg, iter(chunks), CLIENT)
    seen: list = []
    try:
        for _ in range(3):
            req = next(parser)
            seen.append((req.method, req.uri, req.path, req.query, req.fragment, req.version, req.headers,
                         req.scheme, req.should_close(), req._expected_100_continue, req.body.read()))
    except StopIteration:
        seen.append("end")
    except Exception as exc:   # gunicorn's refusals (InvalidHeader, LimitRequestLine, ...)
        seen.append(type(exc).__name__)
    return seen


def _plain_taken(chunks: list[bytes]) -> bool:
    req = next(LeanParser(CFG, iter(chunks), CLIENT))
    return isinstance(req, LeanRequest) and req.plain


# --- generated heads ---------------------------------------------------------------------
METHODS = st.sampled_from(["GET", "HEAD", "POST", "get", "OPTIONS", "CONNECT", "G ET", "GET\t"])
TARGET_CHARS = st.sampled_from(list("/abcAZ09-._~%?=&+#;:@!$'()*,") + ["%2F", "%00", " ", "\t", "\x7f", "\xe9",
                                                                         "\r", "\n", "//", "?x=1", "http://h/"])
TARGETS = st.one_of(st.just("/"), st.builds("".join, st.lists(TARGET_CHARS, min_size=1, max_size=12)),
                    st.sampled_from(["/q/x?aid=42", "//q/x", "*", "http://h/q", "h:80", "/q/%7e?a=%20&b=c#f"]))
VERSIONS = st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/1.1", "HTTP/2.0", "http/1.1", "HTTP/1.10", "HTTP/1.1 "])
NAMES = st.sampled_from(["Host", "X-API-Key", "Accept", "If-None-Match", "Cache-Control", "Connection",
                         "Content-Length", "Transfer-Encoding", "Expect", "Upgrade", "Content-Type",
                         "X_Forwarded_For", "SCRIPT_NAME", "X-Forwarded-Proto", "Bad Name", "", "X!", "ÿ",
                         "host", "CONTENT-length"])
VALUE_CHARS = st.sampled_from(list("abc 019-=,;:/\"'") + ["\t", " ", "\x00", "\x01", "\r", "\n", "\x7f", "\xe9",
                                                          "close", "keep-alive", "chunked", "100-continue", "5",
                                                          "0", "-1", " 3 "])
VALUES = st.builds("".join, st.lists(VALUE_CHARS, max_size=8))
FIELDS = st.lists(st.tuples(NAMES, st.sampled_from([": ", ":", " : ", ":\t"]), VALUES), max_size=6)
ENDINGS = st.sampled_from(["\r\n", "\r\n", "\r\n", "\n", "\r", "\r\n "])


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    line = f"{draw(METHODS)} {draw(TARGETS)} {draw(VERSIONS)}"
    ending = draw(ENDINGS)
    head = line + "".join(f"\r\n{n}{sep}{v}" for n, sep, v in draw(FIELDS)) + ending + "\r\n"
    if draw(st.booleans()):
        head = "\r\n" + head            # an empty line before the request line
    body = draw(st.sampled_from(["", "", "hello", "0\r\n\r\n", "GET /next HTTP/1.1\r\nHost: h\r\n\r\n"]))
    return (head + body).encode("latin-1")


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=requests(), cut=st.integers(min_value=0, max_value=200))
def test_every_head_reads_as_gunicorn_reads_it(raw: bytes, cut: int) -> None:
    chunks = [raw] if cut == 0 or cut >= len(raw) else [raw[:cut], raw[cut:]]
    assert _read(LeanParser, chunks) == _read(RequestParser, chunks)


PLAIN = [
    b"GET /q/account?aid=42 HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nX-API-Key: gw_abc\r\n\r\n",
    b"HEAD / HTTP/1.1\r\n\r\n",
    b"GET /q/x?a=%20b&c=d&c=e HTTP/1.1\r\nHost: h\r\nAccept:\t*/*  \r\nIf-None-Match: \"a\", W/\"b\"\r\n"
    b"Connection: close\r\nX-A: 1\r\nX-A: 2\r\n\r\n",
    b"GET /q/caf%C3%A9 HTTP/1.1\r\nHost: h\r\nX-Note: caf\xe9\r\n\r\n",
]


@pytest.mark.parametrize("raw", PLAIN)
def test_plain_heads_take_the_short_way_with_the_same_result(raw: bytes) -> None:
    assert _plain_taken([raw])            # or the comparison below would only test gunicorn against itself
    assert _read(LeanParser, [raw]) == _read(RequestParser, [raw])


HOSTILE = [
    b"GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    b"GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhelloGET /smuggled HTTP/1.1\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost : a\r\n\r\n",
    b"GET / HTTP/1.1\r\nX-A: 1\r\n folded\r\n\r\n",
    b"GET / HTTP/1.1\nHost: a\r\n\r\n",
    b"GET / HTTP/1.1\r\nX-A: a\rb\r\n\r\n",
    b"GET / HTTP/1.1\r\nX-A: a\x00b\r\n\r\n",
    b"GET / HTTP/1.1\r\nX_Forwarded_For: 1.2.3.4\r\nSCRIPT_NAME: /x\r\n\r\n",
    b"GET http://evil/q HTTP/1.1\r\n\r\n",
    b"GET //evil/q HTTP/1.1\r\n\r\n",
    b"GET /q#frag HTTP/1.1\r\n\r\n",
    b"GET /q HTTP/1.0\r\n\r\n",
    b"get /q HTTP/1.1\r\n\r\n",
    b"GET /q HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
    b"GET /q HTTP/1.1\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAA\r\n\r\n",
    b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\n\r\n",
    b"GET / HTTP/1.1\r\nX-A: " + b"a" * 9000 + b"\r\n\r\n",
    b"GET / HTTP/1.1\r\n" + b"X-A: 1\r\n" * 101 + b"\r\n",
    b"\r\nGET / HTTP/1.1\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: h\r\n\r\nGET /second HTTP/1.1\r\nConnection: close\r\n\r\nGET /third HTTP/1.1\r\n\r\n",
]


@pytest.mark.parametrize("raw", HOSTILE)
def test_hostile_heads_get_gunicorns_answer(raw: bytes) -> None:
    assert _read(LeanParser, [raw]) == _read(RequestParser, [raw])


def test_a_head_cut_over_two_reads_is_read_by_gunicorn_alike() -> None:
    raw = PLAIN[0]
    for cut in range(1, len(raw)):
        assert _read(LeanParser, [raw[:cut], raw[cut:]]) == _read(RequestParser, [raw[:cut], raw[cut:]])


@pytest.mark.parametrize("raw", PLAIN)
def test_the_environ_is_gunicorns(raw: bytes) -> None:
    ours, theirs = socket.socketpair()
    try:
        lean = next(LeanParser(CFG, iter([raw]), CLIENT))
        plain = next(RequestParser(CFG, iter([raw]), CLIENT))
        resp = wsgi.Response(lean, ours, CFG)
        mine = plain_environ(lean, ours, CLIENT, SERVER, CFG, resp, wsgi.WSGIErrorsWrapper(CFG))
        _, expected = wsgi.create(plain, ours, CLIENT, SERVER, CFG)
    finally:
        ours.close()
        theirs.close()
    # gunicorn's, and one key of the gateway's own: the head as received, for a GET the
    # application may be asked for again (``replayable``).
    head = replayable(lean)
    assert mine.pop(REPLAYABLE, None) == (None if head is None else (lean.uri, head[0]))
    assert set(mine) == set(expected)
    for key in ("wsgi.errors", "wsgi.early_hints", "wsgi.input"):
        assert type(mine.pop(key)) is type(expected.pop(key))
    assert mine == expected


def test_the_server_and_the_application_name_one_environ_key() -> None:
    assert lean_request.REPLAYABLE == from_memory.REPLAYABLE


def test_the_master_does_not_load_the_application() -> None:
    """The worker class is imported by gunicorn's master, before it forks: what it imports is
    shared by every worker (a request id prefix drawn there would be every worker's)."""
    code = "import sys, fleet.server.worker; print(sorted(m for m in sys.modules if m.split('.')[0] == 'gateway'))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def _head(raw: bytes) -> object:
    return next(LeanParser(CFG, iter([raw]), CLIENT))


def test_replayable_is_a_get_without_cache_control_and_its_fields_but_the_key() -> None:
    head = _head(b"GET /q/a?x=1 HTTP/1.1\r\nHost: h\r\nx-api-key: s3cret\r\nAccept: */*\r\n\r\n")
    assert replayable(head) == ((("HOST", "h"), ("ACCEPT", "*/*")), "s3cret")      # in order, as sent
    assert replayable(head) is replayable(head)                                      # read once
    assert replayable(_head(b"GET /q/a HTTP/1.1\r\nHost: h\r\n\r\n")) == ((("HOST", "h"),), None)
    for refused in (b"HEAD /q/a HTTP/1.1\r\nHost: h\r\n\r\n",
                    b"GET /q/a HTTP/1.1\r\nCache-Control: no-cache\r\nX-API-Key: s\r\n\r\n",
                    b"GET /q/a HTTP/1.1\r\nX-API-Key: s\r\nX-API-Key: t\r\n\r\n"):    # which key?
        assert replayable(_head(refused)) is None, refused


@pytest.mark.parametrize("overrides", [{"proxy_protocol": "v1"}, {"strip_header_spaces": True},
                                       {"secure_scheme_headers": {"X-FORWARDED-PROTO": "https"}},
                                       {"http2_cleartext": "prior-knowledge"}])
def test_settings_that_change_a_parse_keep_gunicorns_parser(overrides: dict) -> None:
    assert plain_heads_allowed(CFG)
    assert not plain_heads_allowed(_config(**overrides))


def test_a_process_script_name_keeps_gunicorns_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCRIPT_NAME", "/api")
    assert not plain_heads_allowed(CFG)
