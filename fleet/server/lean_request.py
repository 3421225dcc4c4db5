"""A request head read for less than gunicorn's general parser, with the same result.

Measured on one socket pair (loadtests-style request: a ``GET /q/<name>?...`` with Host and
X-API-Key): gunicorn's pure-Python parser and ``wsgi.create`` took 21-23 us per request, about a
fifth of a cache hit's whole CPU in a worker. Most of it is generality a plain request does not
use: splitting every line into ``str`` before looking at it, a regular expression per check per
header, ``urllib.parse`` for the target, the scheme and forwarding policies, a new errors
wrapper per environ.

``LeanRequest`` reads a head of the plain kind itself, and only that kind:

- the request line ``GET`` or ``HEAD``, an origin-form target of printable ASCII (no ``#``, not
  starting with ``//``), ``HTTP/1.1``; within gunicorn's ``limit_request_line``;
- fields ``Name: value`` with a name of letters, digits and ``-`` (a subset of the token
  grammar: no ``_``, so gunicorn's ``header_map`` never applies) and a value without the
  control bytes gunicorn refuses; within ``limit_request_fields`` and
  ``limit_request_field_size``; no repeated Host or Content-Type;
- no field that frames a body or changes the protocol (Content-Length, Transfer-Encoding,
  Expect, Upgrade, HTTP2-Settings): a plain head has no body;
- the whole head in what was read (``\\r\\n\\r\\n`` seen), with no byte before the request line.

Anything else, including every head gunicorn would refuse, goes to gunicorn's own parser with
the same bytes (nothing was consumed), so its checks, its limits and its errors apply unchanged.
The fields it sets are the ones gunicorn's parser sets, to the byte; tests/fleet/test_lean_request.py
compares both on generated heads, plain and hostile. It is used only where gunicorn's settings
make its result the same: no PROXY protocol, no scheme headers, no header-space stripping
neither TLS, uWSGI nor HTTP/2 with prior knowledge (``plain_heads_allowed``).
"""
from __future__ import annotations

import os
import re
from typing import Any

from gunicorn.http.message import Request
from gunicorn.http.parser import RequestParser
from gunicorn.http.wsgi import SERVER_SOFTWARE, FileWrapper, WSGIErrorsWrapper, _make_early_hints_callback
from gunicorn.util import unquote_to_wsgi_str

from fleet.server.lean import nothing_to_drain

# The environ key of a GET the application may be asked for again (``replayable``): the
# application's ``gateway.pipeline.from_memory.REPLAYABLE`` (a test holds them equal). Not
# imported from there: this module is loaded by the master, which must not load the application.
REPLAYABLE = "gateway.replayable"

# The request line of a plain head. The target's bytes are gunicorn's (printable ASCII) less
# '#' (a fragment: urllib's split applies) and a leading '//' (split_request_uri's special case).
_REQUEST_LINE = re.compile(rb"(GET|HEAD) (/(?!/)[\x21\x22\x24-\x7e]*) HTTP/1\.1")
# One field: gunicorn strips spaces and tabs around the value and refuses these control bytes
# in it (RFC9110_5_5_INVALID_AND_DANGEROUS, which also covers a lone CR or LF).
_FIELD = re.compile(rb"([A-Za-z0-9-]+):[ \t]*([^\x00-\x08\x0a-\x1f\x7f]*?)[ \t]*")
_NOT_PLAIN = frozenset(("CONTENT-LENGTH", "TRANSFER-ENCODING", "EXPECT", "UPGRADE", "HTTP2-SETTINGS"))
_SINGLETONS = ("HOST", "CONTENT-TYPE")


def plain_heads_allowed(cfg: Any) -> bool:
    """Whether gunicorn's settings (and the process's ``SCRIPT_NAME``, which gunicorn reads per
    request) leave a plain head's parse and environ the same as ``LeanRequest``'s."""
    return (cfg.proxy_protocol in ("off", False, None) and not cfg.strip_header_spaces
            and not cfg.secure_scheme_headers and not cfg.is_ssl and not os.environ.get("SCRIPT_NAME")
            and getattr(cfg, "protocol", "http") == "http"
            and getattr(cfg, "http2_cleartext", "off") not in ("prior-knowledge", "both"))


class NotPlain(Exception):
    """A head ``LeanParser.read_ready`` leaves to gunicorn's parser (on a thread)."""


class LeanRequest(Request):
    """gunicorn's ``Request``; a plain head is read by ``_plain`` (``plain`` is then True).
    ``plain_only`` (``LeanParser.read_ready``): any other head raises ``NotPlain`` with its bytes
    given back, instead of being parsed (or refused) by gunicorn's parser here."""

    plain = False
    plain_only = False
    replay_head: Any = None    # ``replayable``'s answer, made once per request (the loop, then a thread, ask)

    def parse(self, unreader: Any) -> bytes:
        if self._use_fast and not self.plain_only:   # gunicorn's C parser, were it installed: its own way
            return super().parse(unreader)
        buf = bytearray()
        self.read_into(unreader, buf, stop=True)
        end = buf.find(b"\r\n\r\n")
        if end > 0 and self._plain(bytes(buf[:end])):
            self.plain = True
            return bytes(buf[end + 4:])
        if self.plain_only:
            unreader.unread(bytes(buf))
            raise NotPlain()
        return self._parse_python(unreader, buf)

    def _plain(self, head: bytes) -> bool:
        """Set the fields gunicorn's parser would set from ``head``; False (nothing set) unless
        the head is of the plain kind."""
        lines = head.split(b"\r\n")
        line = _REQUEST_LINE.fullmatch(lines[0])
        if line is None or 0 < self.limit_request_line < len(lines[0]):
            return False
        if len(lines) - 1 > self.limit_request_fields:
            return False
        size_limit = self.limit_request_field_size
        headers = []
        seen = set()
        for raw in lines[1:]:
            field = _FIELD.fullmatch(raw)
            if field is None or len(raw) + 2 > size_limit > 0:
                return False
            name = field.group(1).decode("ascii").upper()
            if name in _NOT_PLAIN:
                return False
            if name in _SINGLETONS:
                if name in seen:
                    return False
                seen.add(name)
            headers.append((name, field.group(2).decode("latin-1")))
        uri = line.group(2).decode("ascii")
        path, _, query = uri.partition("?")
        self.method = line.group(1).decode("ascii")
        self.uri = uri
        self.path = path
        self.query = query
        self.fragment = ""
        self.version = (1, 1)
        self.headers = headers
        return True


class _PlainOnly(LeanRequest):
    plain_only = True


class LeanParser(RequestParser):
    mesg_class = LeanRequest
    mesg: Any
    ready: LeanRequest | None = None    # read by ``read_ready``, handed out by the next ``next``

    def __next__(self) -> LeanRequest:
        """gunicorn's, without draining a previous request that left nothing to drain (its
        drain restores the socket's timeout: a system call per request to find nothing)."""
        ready = self.ready
        if ready is not None:
            self.ready = None
            return ready
        previous = self.mesg
        if previous is None or not nothing_to_drain(previous):
            return super().__next__()
        if previous.should_close():
            raise StopIteration()
        self.req_count += 1
        request = self.mesg = LeanRequest(self.cfg, self.unreader, self.source_addr, self.req_count)
        return request

    next = __next__

    def read_ready(self) -> LeanRequest | None:
        """On the server's loop, for a request the front read whole (fleet/server/front.py: every byte
        of it is in the unreader's buffer): the request, when it is plain and nothing follows
        it; else None. Either way what was read stays for ``next``: a request read here is the
        one ``next`` returns (``ready``)."""
        previous = self.mesg
        if self.ready is not None or (previous is not None and (not nothing_to_drain(previous)
                                                                or previous.should_close())):
            return None
        data = self.unreader.buf.getvalue()
        if data.find(b"\r\n\r\n") != len(data) - 4:
            return None            # a body, or more behind it: gunicorn's way, on a thread
        try:
            request = _PlainOnly(self.cfg, self.unreader, self.source_addr, self.req_count + 1)
        except NotPlain:
            return None
        self.req_count += 1
        self.mesg = self.ready = request
        return request


_NOT_REPLAYABLE = (None,)


def replayable(req: LeanRequest) -> tuple[tuple, str | None] | None:
    """A GET the application may have answered from memory before (``REPLAYABLE``): no
    Cache-Control (which may ask for the database), one X-API-Key at most. (its header fields
    but X-API-Key, as received; the key's secret). Read once per request: the loop asks
    (``_answered_here``), then, when the application did not answer it there, ``plain_environ``."""
    head = req.replay_head
    if head is None:
        head = req.replay_head = _replayable(req) or _NOT_REPLAYABLE
    return None if head is _NOT_REPLAYABLE else head


def _replayable(req: LeanRequest) -> tuple[tuple, str | None] | None:
    if req.method != "GET":
        return None
    fields = []
    secret = None
    for field in req.headers:
        name = field[0]
        if name == "X-API-KEY":
            if secret is not None:
                return None
            secret = field[1]
        elif name == "CACHE-CONTROL":
            return None
        else:
            fields.append(field)
    return tuple(fields), secret


def plain_environ(req: LeanRequest, sock: Any, client: Any, server: Any, cfg: Any, resp: Any,
                  errors: WSGIErrorsWrapper) -> dict:
    """``gunicorn.http.wsgi.create``'s environ for a plain head (``req.plain``), made directly:
    the same keys and values (its ``wsgi.errors`` made once per worker: it only holds the error
    log's streams). No Content-Length or Content-Type field can be there, no scheme or
    forwarding header applies; ``client`` and ``server`` are addresses (TCP), not a path."""
    environ = {
        "wsgi.errors": errors,
        "wsgi.version": (1, 0),
        "wsgi.multithread": False,
        "wsgi.multiprocess": cfg.workers > 1,
        "wsgi.run_once": False,
        "wsgi.file_wrapper": FileWrapper,
        "wsgi.input_terminated": True,
        "SERVER_SOFTWARE": SERVER_SOFTWARE,
        "wsgi.input": req.body,
        "gunicorn.socket": sock,
        "REQUEST_METHOD": req.method,
        "QUERY_STRING": req.query,
        "RAW_URI": req.uri,
        "SERVER_PROTOCOL": "HTTP/1.1",
    }
    repeated: dict[str, list[str]] = {}
    for name, value in req.headers:
        key = "HTTP_" + name.replace("-", "_")
        if key in environ:
            repeated.setdefault(key, [environ[key]]).append(value)
        else:
            environ[key] = value
    for key, values in repeated.items():
        environ[key] = ",".join(values)
    environ["wsgi.url_scheme"] = req.scheme
    environ["REMOTE_ADDR"] = client[0]
    environ["REMOTE_PORT"] = str(client[1])
    environ["SERVER_NAME"] = server[0]
    environ["SERVER_PORT"] = str(server[1])
    environ["PATH_INFO"] = unquote_to_wsgi_str(req.path)
    environ["SCRIPT_NAME"] = ""
    environ["wsgi.early_hints"] = _make_early_hints_callback(req, sock, resp)
    head = replayable(req)
    if head is not None:
        environ[REPLAYABLE] = (req.uri, head[0])
    return environ

