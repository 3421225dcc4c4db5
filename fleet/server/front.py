"""The front: a request is read whole on the worker's loop before any thread is given to it.

Why: gthread handed a connection to a thread as soon as it was readable, and the thread then
blocked in ``recv`` until the head (and later the body) was complete. 15-20 connections that
sent part of a head and then nothing held every thread of the embedded default: ``/health``
timed out for as long as they were held, before admission, unseen by any limit or log. Here
the loop reads what a connection has, without waiting, into that connection's ``Reading``,
and only a request that has arrived whole (head and body) goes to a thread; everything the
thread's parser then reads is already in memory.

What bounds a connection while it is read (``FrontLimits``, from ``gateway.settings``):

- a deadline for the head, counted from the connection's first byte (a new connection: from
  its accept), and one for the body, counted from the end of the head: absolute, so a byte
  every few seconds does not keep a connection alive (408 ``request_timeout``);
- the head's size (431 ``headers_too_large``) and the body's (413 ``payload_too_large``,
  before any of it is read when Content-Length says so);
- how many connections one client address may have being read at once (a new one beyond it
  is closed at once), and how many connections a worker holds in all (beyond it, the
  connection being read the longest, else the longest idle kept-alive one, is closed).

Framing is checked here, as RFC 9112 section 6 has it, because the body's end must be found
before the request goes on: one Content-Length of digits, or ``Transfer-Encoding: chunked``
with well-formed chunks; both, several, or anything else is 400 ``malformed_request`` (501
``unsupported_transfer_coding`` for a coding other than chunked), answered here with
``Connection: close``: one response, then the connection ends. gunicorn's parser reads the
same bytes again on the thread and applies its own, stricter checks to the rest of the head.

Each connection closed here is counted by reason (``gateway_front_closed``).
"""
from __future__ import annotations

import heapq
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from gateway.settings import Settings

WHOLE_HEAD = b"\r\n\r\n"
_BARE_LF = re.compile(rb"(?<!\r)\n")
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_DIGITS = re.compile(rb"[0-9]{1,18}")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})[ \t]*")
# A chunk extension: anything printable, and tabs (the grammar is laxer than RFC 9112's
# ``chunk-ext``, which no client sends; a CR, LF or other control byte is never allowed).
_CHUNK_EXT = re.compile(rb"[\t\x20-\x7e\x80-\xff]*")
_LINE_MAX = 4096          # a chunk-size line or one trailer line longer than this is refused
_TRAILERS_MAX = 16384     # all trailer lines together


@dataclass(frozen=True, slots=True)
class FrontLimits:
    head_timeout_s: float
    body_timeout_s: float
    max_head_bytes: int
    max_body_bytes: int
    max_connections: int
    max_reading_per_client: int
    proxies: frozenset[str] = frozenset()     # peers the per-client cap does not apply to

    @classmethod
    def from_settings(cls, settings: Settings) -> FrontLimits:
        return cls(head_timeout_s=settings.head_timeout_s, body_timeout_s=settings.body_timeout_s,
                   max_head_bytes=settings.max_head_bytes, max_body_bytes=settings.max_body_bytes,
                   max_connections=settings.max_connections,
                   max_reading_per_client=settings.max_reading_per_client,
                   proxies=frozenset(p.strip() for p in settings.front_proxies.split(",") if p.strip()))


class Refused(Exception):
    """A request the front answers itself, with ``Connection: close``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def response(self) -> bytes:
        # Imported here: this module is loaded by the master, which draws no request ids.
        from gateway.request_ids import new_request_id

        request_id = new_request_id()
        body = orjson.dumps({"error": self.message, "code": self.code, "request_id": request_id})
        reason = _REASONS.get(self.status, "Error")
        head = (f"HTTP/1.1 {self.status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
                f"X-Request-Id: {request_id}\r\nContent-Length: {len(body)}\r\n\r\n")
        return head.encode("ascii") + body


# The front's answers; their codes are the gateway's public ones (gateway.errors.CODES: a test holds them equal).
FRONT_CODES = {"malformed_request": 400, "request_timeout": 408, "headers_too_large": 431,
               "payload_too_large": 413, "unsupported_transfer_coding": 501}
_REASONS = {400: "Bad Request", 408: "Request Timeout", 413: "Content Too Large",
            431: "Request Header Fields Too Large", 501: "Not Implemented"}


def _malformed(message: str) -> Refused:
    return Refused(400, "malformed_request", message)


def lone_plain_head(data: bytes, max_head_bytes: int) -> bool:
    """Whether ``data`` is exactly one whole head with nothing behind it and nothing that frames a
    body (no Content-Length, Transfer-Encoding or Expect anywhere in it: no body, by any reading)
    and no bare LF: the usual GET arriving in one read, which needs no ``Reading`` (about a tenth
    of its cost: a few byte searches in C)."""
    if len(data) > max_head_bytes or data.find(WHOLE_HEAD) != len(data) - 4:
        return False
    lowered = data.lower()
    return (b"content-length" not in lowered and b"transfer-encoding" not in lowered and b"expect" not in lowered
            and data.count(b"\n") == data.count(b"\r\n"))


class Reading:
    """One request's bytes as they arrive, and where it ends: ``feed`` answers the length of the
    whole request once it is all there (None before), or raises ``Refused``. Incremental: each
    byte is looked at about once however the request is cut into reads."""

    __slots__ = ("buf", "limits", "head_end", "body_end", "chunk_at", "chunk_phase", "body_bytes",
                 "trailer_bytes", "expects_continue", "continued", "deadline", "client")

    def __init__(self, limits: FrontLimits, client: str, deadline: float) -> None:
        self.buf = bytearray()
        self.limits = limits
        self.client = client
        self.deadline = deadline
        self.head_end = -1         # index just after the head's blank line
        self.body_end = -1         # index just after the request (known for a Content-Length)
        self.chunk_at = -1         # chunked: where the next chunk-size (or trailer) line starts
        self.chunk_phase = ""      # "size", "trailers", or "" (not chunked)
        self.body_bytes = 0        # chunked: decoded bytes so far
        self.trailer_bytes = 0
        self.expects_continue = False
        self.continued = False     # a 100 Continue was sent for this request

    def feed(self, data: bytes) -> int | None:
        scanned = len(self.buf)
        self.buf += data
        if self.head_end < 0:
            end = self.buf.find(WHOLE_HEAD, max(0, scanned - 3))
            bare = _BARE_LF.search(self.buf, max(0, scanned))
            if bare is not None and (end < 0 or bare.start() < end):
                raise _malformed("a line of the head ends with a bare LF")
            if end < 0:
                if len(self.buf) > self.limits.max_head_bytes:
                    raise Refused(431, "headers_too_large",
                                  f"the request head is larger than {self.limits.max_head_bytes} bytes")
                return None
            if end + 4 > self.limits.max_head_bytes:
                raise Refused(431, "headers_too_large",
                              f"the request head is larger than {self.limits.max_head_bytes} bytes")
            self.head_end = end + 4
            self._frame(bytes(self.buf[:end]))
        if self.body_end >= 0:
            return self.body_end if len(self.buf) >= self.body_end else None
        return self._chunks()

    @property
    def waiting_for_body(self) -> bool:
        return self.head_end >= 0

    # --- the head -------------------------------------------------------------------------------
    def _frame(self, head: bytes) -> None:
        lengths: list[bytes] = []
        codings: list[bytes] = []
        lines = head.split(b"\r\n")
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or _TOKEN.fullmatch(name) is None:
                raise _malformed("a header line is not `name: value` (or continues the previous one)")
            lower = name.lower()
            if lower == b"content-length":
                lengths.append(value.strip(b" \t"))
            elif lower == b"transfer-encoding":
                codings.extend(c.strip(b" \t").lower() for c in value.split(b","))
            elif lower == b"expect":
                self.expects_continue = value.strip(b" \t").lower() == b"100-continue"
        if codings:
            if lengths:
                raise _malformed("both Content-Length and Transfer-Encoding")
            if codings[-1] != b"chunked":
                raise _malformed("Transfer-Encoding does not end with chunked")
            if codings != [b"chunked"]:
                raise Refused(501, "unsupported_transfer_coding", "only Transfer-Encoding: chunked is supported")
            self.chunk_at, self.chunk_phase = self.head_end, "size"
            return
        if len(lengths) > 1:
            raise _malformed("more than one Content-Length")
        length = 0
        if lengths:
            if _DIGITS.fullmatch(lengths[0]) is None:
                raise _malformed("Content-Length is not a number")
            length = int(lengths[0])
            if length > self.limits.max_body_bytes:
                raise Refused(413, "payload_too_large",
                              f"the body is larger than {self.limits.max_body_bytes} bytes")
        self.body_end = self.head_end + length
        if length == 0:
            self.expects_continue = False

    # --- a chunked body --------------------------------------------------------------------------
    def _chunks(self) -> int | None:
        buf = self.buf
        while True:
            nl = buf.find(b"\n", self.chunk_at)
            if nl < 0:
                if len(buf) - self.chunk_at > _LINE_MAX:
                    raise _malformed("a chunk-size or trailer line is too long")
                return None
            if nl == self.chunk_at or buf[nl - 1] != 0x0D:
                raise _malformed("a chunk line ends with a bare LF")
            line = bytes(buf[self.chunk_at:nl - 1])
            if self.chunk_phase == "trailers":
                if not line:
                    return nl + 1
                self.trailer_bytes += len(line) + 2
                if self.trailer_bytes > _TRAILERS_MAX or b"\r" in line:
                    raise _malformed("the trailer section is malformed or too large")
                self.chunk_at = nl + 1
                continue
            size_text, semicolon, extension = line.partition(b";")
            size = _CHUNK_SIZE.fullmatch(size_text)
            if size is None or (semicolon and _CHUNK_EXT.fullmatch(extension) is None):
                raise _malformed("a chunk size is not a hexadecimal number, or its extension holds a control byte")
            length = int(size.group(1), 16)
            self.body_bytes += length
            if self.body_bytes > self.limits.max_body_bytes:
                raise Refused(413, "payload_too_large", f"the body is larger than {self.limits.max_body_bytes} bytes")
            if length == 0:
                self.chunk_phase, self.chunk_at = "trailers", nl + 1
                continue
            data_end = nl + 1 + length
            if len(buf) < data_end + 2:
                return None           # this chunk's line is read again once more has arrived
            if buf[data_end:data_end + 2] != b"\r\n":
                raise _malformed("a chunk's data is not followed by CRLF")
            self.chunk_at = data_end + 2


class Deadlines:
    """The connections being read, by deadline (a heap; an entry whose connection has left the
    front or has a new deadline is skipped when it comes up)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Any]] = []
        self._order = itertools.count()

    def add(self, deadline: float, conn: Any) -> None:
        heapq.heappush(self._heap, (deadline, next(self._order), conn))

    def next_deadline(self, current: Callable[[Any], float | None]) -> float | None:
        heap = self._heap
        while heap and current(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def pop_due(self, now: float, current: Callable[[Any], float | None]) -> list[Any]:
        due = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            deadline, _, conn = heapq.heappop(heap)
            if current(conn) == deadline:
                due.append(conn)
        return due

    def cap(self, at: float, current: Callable[[Any], float | None],
            set_deadline: Callable[[Any, float], None]) -> None:
        """Every connection due by ``at`` at the latest (a worker that stops)."""
        for deadline, _, conn in list(self._heap):
            if current(conn) == deadline and deadline > at:
                set_deadline(conn, at)
                self.add(at, conn)

    def oldest(self, current: Callable[[Any], float | None]) -> Any | None:
        deadline = self.next_deadline(current)
        return None if deadline is None else self._heap[0][2]


class ClientCounts:
    """How many connections each client address has being read by the front."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._counts: dict[str, int] = {}

    def take(self, client: str) -> bool:
        count = self._counts.get(client, 0)
        if count >= self.cap:
            return False
        self._counts[client] = count + 1
        return True

    def give_back(self, client: str) -> None:
        count = self._counts.get(client, 0) - 1
        if count > 0:
            self._counts[client] = count
        else:
            self._counts.pop(client, None)
