"""What gunicorn does per request that this worker does for less, with the same result.

Counted in a worker under load (bytecodes per call, ``sys.settrace``): gunicorn's request
path ran about three times the Python the gateway's own call does. Parts of it repeat,
for every call, work whose answer cannot change while a worker lives:

- ``Config.__getattr__``: every ``cfg.<setting>`` read (a dozen per call in the parser, the
  response and the hooks) looks the setting up and calls its ``get()``. ``FrozenConfig``
  reads each setting once, when the worker starts (a reload starts new workers).
- ``Response.process_headers``: each response header's name is checked against the token
  grammar, lower-cased and compared with the hop-by-hop names, every call, for the same
  dozen names. ``LeanResponse`` checks a name once and remembers it; every value is still
  checked, every call, with gunicorn's own expression.
- The ``Date`` header, formatted by ``email.utils`` every call: made once a second.
- Draining what is left of a request's body before keeping its connection, under a deadline
  set with two ``settimeout`` system calls, when nothing is left (``nothing_to_drain``).

``LeanResponse`` also sends the headers and a body whose length they announce in one
``sendall`` instead of two: one system call and one TCP segment fewer per answer.

Anything out of the ordinary (a hop-by-hop or invalid header, a chunked or bodyless answer,
a body in pieces) goes through gunicorn's own code, unchanged.
"""
from __future__ import annotations

import time
from typing import Any

import gunicorn
from gunicorn import util
from gunicorn.config import Config
from gunicorn.http.body import LengthReader
from gunicorn.http.message import TOKEN_RE
from gunicorn.http.wsgi import HEADER_VALUE_RE, Response

# The gunicorn whose private names this worker overrides and whose gthread request handler
# fleet/server/worker.py copies (setup.cfg pins it). Another version may rename or change any of
# them without notice, so a worker refuses to load on it rather than misbehave quietly.
GUNICORN_VERSION = "27.0.1"


def require_gunicorn(installed: str = gunicorn.__version__) -> None:
    if installed != GUNICORN_VERSION:
        raise RuntimeError(f"fleet's worker was written against gunicorn {GUNICORN_VERSION} and {installed} is "
                           f"installed: install gunicorn=={GUNICORN_VERSION} (setup.cfg pins it), or port "
                           f"fleet/server/lean.py, lean_request.py and worker.py to {installed} first")


require_gunicorn()

_HOP = ""                      # a remembered name that gunicorn's own rules must handle
_NAMES: dict[str, str] = {}    # header name -> its lower-cased form, or _HOP
_NAMES_MAX = 512               # names an application could vary without bound are not remembered past this
_date: list = [0, ""]          # [second, its Date header value]


class FrozenConfig:
    """A worker's settings, read once: each setting a plain attribute; anything else (the
    properties and methods of gunicorn's ``Config``) from the real one."""

    def __init__(self, cfg: Config) -> None:
        # A setting that ``Config`` shadows with a property of the same name (worker_class,
        # sendfile, ...) is read through that property, every time, as gunicorn reads it.
        computed = {name for name, value in vars(type(cfg)).items() if isinstance(value, property)}
        self.__dict__.update({name: setting.get() for name, setting in cfg.settings.items() if name not in computed})
        # Whether the worker speaks TLS cannot change while it lives; every request reads it.
        self.__dict__["is_ssl"] = cfg.is_ssl
        self.__dict__["_cfg"] = cfg

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_cfg"], name)


def _name(name: str) -> str:
    known = _NAMES.get(name)
    if known is None:
        known = _HOP
        if isinstance(name, str) and TOKEN_RE.fullmatch(name) and not util.is_hoppish(name):
            known = name.lower()
        if len(_NAMES) < _NAMES_MAX:
            _NAMES[name] = known
    return known


def http_date() -> str:
    now = time.time()
    if int(now) != _date[0]:
        _date[1] = util.http_date(now)
        _date[0] = int(now)
    return str(_date[1])


def nothing_to_drain(request: Any) -> bool:
    """Whether a request's body is empty or read to its end: what gthread's drain before keeping
    the connection would find (it costs two ``settimeout`` system calls to find it)."""
    body: Any = getattr(request, "body", None)
    reader: Any = getattr(body, "reader", None)
    return (type(reader) is LengthReader and reader.length == 0 and body is not None and not body.failed
            and body.buf.tell() == 0)


class LeanResponse(Response):
    headers_sent: bool     # gunicorn's (untyped) attributes this class reads and writes
    sent: int
    def process_headers(self, headers: Any) -> None:
        match = HEADER_VALUE_RE.fullmatch
        for name, value in headers:
            lname = _name(name)
            if lname is _HOP or not isinstance(value, str) or match(value) is None:
                super().process_headers(((name, value),))   # its checks, its errors, its hop-by-hop rules
                continue
            value = value.strip(" \t")
            if lname == "content-length":
                self.response_length = int(value)
            self.headers.append((name, value))

    def default_headers(self) -> list[str]:
        if self.upgrade:
            connection = "upgrade"
        elif self.should_close():
            connection = "close"
        else:
            connection = "keep-alive"
        version = self.req.version
        headers = [f"HTTP/{version[0]}.{version[1]} {self.status}\r\n", f"Server: {self.version}\r\n",
                   f"Date: {http_date()}\r\n", f"Connection: {connection}\r\n"]
        if self.chunked:
            headers.append("Transfer-Encoding: chunked\r\n")
        return headers

    def write(self, arg: bytes) -> None:
        # The usual answer: headers not sent yet, one body of exactly the announced length.
        if (not self.headers_sent and type(arg) is bytes and not self.chunked and not self._omits_body
                and self.sent == 0 and self.response_length == len(arg)):
            tosend = self.default_headers()
            tosend.extend([f"{k}: {v}\r\n" for k, v in self.headers])
            tosend.append("\r\n")
            head = "".join(tosend).encode("latin-1")
            self.headers_sent = True
            self.sent = len(arg)
            self.sock.sendall(head + arg)
            return
        super().write(arg)
