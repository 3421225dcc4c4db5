"""gunicorn's threaded worker (gthread) with the front: every request read whole on the loop
(fleet/server/front.py) before a thread is given to it, and connections closed without the loop
waiting on them.

What gthread did: it handed a connection to a thread as soon as it was readable, and the
thread then blocked in ``recv`` until the request was complete, so a connection that sent part
of a head and then nothing held a thread for as long as it liked; and it closed a connection
by reading, on the loop, until the client closed too. Here the loop reads what each connection
has without waiting, under the front's deadlines and caps, and answers what the front refuses;
only a whole request goes to a thread (or is answered on the loop: ``_answered_here``, which
fleet/server/worker.py's ``BalancedThreadWorker`` fills in). Over TLS or HTTP/2 gunicorn's own reading
applies (``plain_heads_allowed``).
"""
from __future__ import annotations

import io
import resource
import selectors
import socket
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

from fleet.server.front import ClientCounts, Deadlines, FrontLimits, Reading, Refused, lone_plain_head
from fleet.server.lean import FrozenConfig
from fleet.server.lean_request import LeanParser, plain_heads_allowed

CLOSE_LINGER_S = 2.0      # a closed connection waits at most this long for the client's own close
STOP_READING_LINGER_S = 2.0   # a leaving worker's requests still arriving: this long at most
FD_MARGIN = 256           # file descriptors kept for everything but client connections
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class ReadingThreadWorker(ThreadWorker):
    """gthread whose loop reads each request whole before a thread gets it (module docstring)."""

    cfg: Any
    alive: bool            # gunicorn's (untyped) attributes this class reads and writes

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cfg = FrozenConfig(self.cfg)
        self._plain_heads = plain_heads_allowed(self.cfg)
        self._closing: dict[socket.socket, float] = {}
        # The front (fleet/server/front.py): requests read whole on the loop. Not over TLS or HTTP/2,
        # where gunicorn's own reading applies.
        self._front_on = self._plain_heads
        from gateway.settings import Settings  # not at import: the master loads this module
        self._limits = FrontLimits.from_settings(Settings.from_env())
        self._max_connections = self._limits.max_connections
        if self._front_on:
            self._max_connections = min(self._max_connections, _raise_fd_limit() - FD_MARGIN)
            # Accept always: room is made at the cap by closing the connection read the longest.
            self.worker_connections = sys.maxsize
            self.max_keepalived = max(1, self._max_connections - self.cfg.threads)
        self._deadlines = Deadlines()
        self._reading_of = _reading_deadline
        self._clients = ClientCounts(self._limits.max_reading_per_client)
        self._uncapped = self._limits.proxies
        self._closed_counter: Callable[[str], None] = lambda reason: None   # set by a subclass's run()

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        if self._closing:
            self._expire_closing(time.monotonic())
            timeout = min(timeout, CLOSE_LINGER_S)
        if self._front_on:
            timeout = self._expire_reading(timeout)
        super().wait_for_and_dispatch_events(timeout)

    def _cap_reading(self) -> None:
        """A worker that leaves: what is still arriving has ``STOP_READING_LINGER_S`` at most."""
        self._deadlines.cap(time.monotonic() + STOP_READING_LINGER_S, self._reading_of, _set_reading_deadline)

    def _answered_here(self, conn: Any) -> bool:
        """Whether the loop answered this whole request itself (a subclass's choice); else a thread does."""
        return False

    # --- reading requests: the front (fleet/server/front.py) -----------------------------------------
    def enqueue_req(self, conn: Any) -> None:
        """Every request starts here (a new connection, or bytes a previous request left behind):
        the front reads it whole on the loop before a thread gets it. A new connection gets the
        parser that reads plain heads itself (fleet/server/lean_request.py) where gunicorn would give it
        its HTTP/1 parser: not over TLS, not HTTP/2."""
        if not self._front_on:
            super().enqueue_req(conn)
            return
        new = conn.parser is None
        if new:
            conn.parser = LeanParser(self.cfg, conn.sock, conn.client)
        unreader = conn.parser.unreader
        data: bytes | None = unreader.buf.getvalue()
        unreader.buf = io.BytesIO()
        if data:
            conn.sock.setblocking(False)     # a thread left it blocking: the loop must never wait
        elif new:
            data = self._recv_now(conn)
            if data == b"":
                self._front_drop(conn, "", registered=False, counted=False)
                return
        self._front_begin(conn, data, new, registered=False)

    def on_client_socket_readable(self, conn: Any, client: Any) -> None:
        """A kept-alive connection's next request begins: read on the loop (its socket stays
        registered, with the front's callback, while the request is not whole)."""
        if not self._front_on:
            super().on_client_socket_readable(conn, client)
            return
        self.keepalived_conns.remove(conn)
        data = self._recv_now(conn)
        if data == b"":
            self._unregister(conn.sock)
            self._front_drop(conn, "", registered=False, counted=False)
            return
        self._front_begin(conn, data, False, registered=True)

    def _front_begin(self, conn: Any, data: bytes | None, new: bool, registered: bool) -> None:
        """The first bytes of a request (None: none yet). The usual GET, whole in one read, goes
        on at once (``lone_plain_head``); anything else is read through a ``Reading``."""
        if data and lone_plain_head(data, self._limits.max_head_bytes):
            if registered:
                self._unregister(conn.sock)
            if new and self.nr_conns > self._max_connections:
                self._make_room(None)
            self._front_whole(conn, data, alone=True, continued=False)
            return
        if not self._front_enter(conn, new, registered):
            return
        if data and self._front_feed(conn, data, registered):
            return
        self._front_wait(conn, registered)

    def _recv_now(self, conn: Any) -> bytes | None:
        """What the socket has, without waiting: None when nothing yet, b"" when the client is gone."""
        try:
            return conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            return b""

    def _front_enter(self, conn: Any, new: bool, registered: bool = False) -> bool:
        client = conn.client[0] if type(conn.client) is tuple else ""
        if client not in self._uncapped and not self._clients.take(client):
            if registered:
                self._unregister(conn.sock)
            self._front_drop(conn, "per_client", registered=False, counted=False)
            return False
        conn.gw_reading = Reading(self._limits, client, time.monotonic() + self._limits.head_timeout_s)
        if new and self.nr_conns > self._max_connections:
            self._make_room(conn)
        return conn.gw_reading is not None

    def _front_wait(self, conn: Any, registered: bool) -> None:
        """Not whole yet: the loop waits for more, until the reading's deadline."""
        reading = conn.gw_reading
        callback = partial(self._on_front_readable, conn)
        if registered:
            self.poller.modify(conn.sock, selectors.EVENT_READ, callback)
        else:
            conn.sock.setblocking(False)
            self.poller.register(conn.sock, selectors.EVENT_READ, callback)
        conn.gw_registered = True
        self._deadlines.add(reading.deadline, conn)

    def _on_front_readable(self, conn: Any, sock: Any) -> None:
        self._front_read(conn, registered=True)

    def _front_read(self, conn: Any, registered: bool = False) -> bool:
        """More of a request being read; whether it left the front (whole, refused, or the
        client gone)."""
        data = self._recv_now(conn)
        if data is None:
            return False
        if not data:
            if conn.gw_reading.buf:       # the client stopped sending (half-closed) mid-request: tell it why
                refusal = Refused(400, "malformed_request", "the connection ended before the request was whole")
                self._front_refuse(conn, refusal, "incomplete", registered)
            else:
                self._front_drop(conn, "", registered=registered)
            return True
        return self._front_feed(conn, data, registered)

    def _front_feed(self, conn: Any, data: bytes, registered: bool = False) -> bool:
        reading = conn.gw_reading
        had_head = reading.waiting_for_body
        try:
            end = reading.feed(data)
        except Refused as refusal:
            self._front_refuse(conn, refusal, refusal.code, registered)
            return True
        if end is None:
            if reading.waiting_for_body and not had_head:
                self._body_begins(conn, reading)
            return False
        self._front_leave(conn, registered or getattr(conn, "gw_registered", False))
        self._front_whole(conn, bytes(reading.buf), alone=end == len(reading.buf), continued=reading.continued)
        return True

    def _front_whole(self, conn: Any, data: bytes, alone: bool, continued: bool) -> None:
        """A request arrived whole (and, when not ``alone``, more behind it): answered on this
        loop when it can be, else handed to a thread, which finds every byte of it read."""
        conn.parser.unreader.unread(data)
        conn.gw_arrived = time.monotonic()
        conn.gw_continued = continued
        conn.data_ready = True
        if not alone or not self._answered_here(conn):
            ThreadWorker.enqueue_req(self, conn)

    def _body_begins(self, conn: Any, reading: Reading) -> None:
        """The head is whole, the body not: its own deadline; the client told to go on when it
        waits for that (``Expect: 100-continue``)."""
        reading.deadline = time.monotonic() + self._limits.body_timeout_s
        if getattr(conn, "gw_registered", False):
            self._deadlines.add(reading.deadline, conn)
        if reading.expects_continue:
            reading.continued = True
            try:
                conn.sock.send(_CONTINUE)
            except OSError:
                pass      # a client that cannot take 25 bytes: its body's deadline ends it

    def _front_leave(self, conn: Any, registered: bool) -> None:
        reading = conn.gw_reading
        conn.gw_reading = None
        conn.gw_registered = False
        if reading is not None and reading.client not in self._uncapped:
            self._clients.give_back(reading.client)
        if registered:
            self._unregister(conn.sock)

    def _unregister(self, sock: Any) -> None:
        try:
            self.poller.unregister(sock)
        except (KeyError, ValueError, OSError):
            pass

    def _front_drop(self, conn: Any, reason: str, registered: bool, counted: bool = True) -> None:
        """Close a connection the front holds: the client left (no reason), or it was dropped."""
        if counted:
            self._front_leave(conn, registered)
        self.nr_conns -= 1
        if reason:
            self._closed_counter(reason)
        try:
            conn.sock.close()
        except OSError:
            pass

    def _front_refuse(self, conn: Any, refusal: Refused, reason: str, registered: bool) -> None:
        """Answer the request here (one response, ``Connection: close``) and close gently."""
        self._front_leave(conn, registered)
        self.nr_conns -= 1
        self._closed_counter(reason)
        try:
            conn.sock.setblocking(False)
            conn.sock.send(refusal.response())
        except OSError:
            pass
        self._close_gently(conn.sock)

    def _expire_reading(self, timeout: float) -> float:
        """Close what is past its deadline; how long the loop may sleep before the next one."""
        now = time.monotonic()
        for conn in self._deadlines.pop_due(now, self._reading_of):
            refusal = Refused(408, "request_timeout", "the request did not arrive in time")
            self._front_refuse(conn, refusal, "timeout", registered=True)
        upcoming = self._deadlines.next_deadline(self._reading_of)
        if upcoming is not None:
            timeout = min(timeout, max(0.0, upcoming - now))
        return timeout

    def _make_room(self, newcomer: Any | None) -> None:
        """At the cap: close the connection whose request has been arriving the longest, else the
        longest idle kept-alive one, else the newcomer (every other connection is being served;
        None: a newcomer whose request is whole already, let through one over the cap)."""
        oldest = self._deadlines.oldest(self._reading_of)
        if oldest is not None:
            self._front_drop(oldest, "evicted", registered=True)
        elif self.keepalived_conns:
            idle = self.keepalived_conns.popleft()
            self._unregister(idle.sock)
            self.nr_conns -= 1
            self._closed_counter("evicted_idle")
            idle.close()
        elif newcomer is not None:
            self._front_drop(newcomer, "evicted", registered=False)

    # --- closing without stalling the loop -----------------------------------------------------
    def _close_gently(self, sock: socket.socket) -> None:
        """gunicorn closes a connection after its last answer by sending FIN and then reading,
        on the loop's own thread, until the client closes too (up to 2 s), so that unread bytes
        do not turn the close into a reset; every other connection of the worker waits
        meanwhile (hundreds of ms on a loaded box, once per connection a restart closes). Here
        the loop watches for the client's close instead, and closes at CLOSE_LINGER_S at the latest."""
        try:
            sock.setblocking(False)
            sock.shutdown(socket.SHUT_WR)
            self.poller.register(sock, selectors.EVENT_READ, self._on_closing_readable)
        except (OSError, ValueError, KeyError):
            sock.close()
            return
        self._closing[sock] = time.monotonic() + CLOSE_LINGER_S

    def _on_closing_readable(self, sock: socket.socket) -> None:
        try:
            if sock.recv(65536):
                return                      # bytes the client sent after our last answer: dropped
        except BlockingIOError:
            return
        except OSError:
            pass
        self._closed(sock)

    def _closed(self, sock: socket.socket) -> None:
        self._closing.pop(sock, None)
        try:
            self.poller.unregister(sock)
        except (KeyError, ValueError, OSError):
            pass
        sock.close()

    def _expire_closing(self, now: float, everything: bool = False) -> None:
        for sock, deadline in list(self._closing.items()):
            if everything or deadline <= now:
                self._closed(sock)



def _reading_deadline(conn: Any) -> float | None:
    reading = getattr(conn, "gw_reading", None)
    return None if reading is None else reading.deadline


def _set_reading_deadline(conn: Any, deadline: float) -> None:
    conn.gw_reading.deadline = deadline


def _raise_fd_limit() -> int:
    """The soft limit on open files raised to the hard one (each connection is one): the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return hard if soft == resource.RLIM_INFINITY else soft
