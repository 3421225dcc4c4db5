"""A master's port refuses connections until one of its workers can serve them.

gunicorn binds and listens in the master before it forks its workers, and a worker takes a few
seconds to load the application (imports, migrations, the catalog; measured 2-15 s on 2 busy
cores). Meanwhile the kernel completes every connect and queues it, so a load balancer sends
calls to an instance that cannot answer them yet and they wait (a master restarted by the
supervisor under load: calls waited up to 10 s, one past its client's timeout). Bound but not
listening, the port refuses instead (nginx tries the other instance at once, a lone
instance's clients see it down, as it is); the first worker that has loaded the application
starts it listening (``post_worker_init``), on the socket every worker shares.

``on_starting`` (the master, before gunicorn makes its sockets) makes the sockets this way for
``bind`` addresses of TCP, and with ``reuse_port`` (one socket per worker, made by gunicorn
after each fork) has gunicorn make those unlistened too; inherited sockets (systemd, a USR2
re-exec) and Unix sockets are left to gunicorn.
"""
from __future__ import annotations

import errno
import os
import time
from typing import TYPE_CHECKING, Any

from gunicorn import sock, util

if TYPE_CHECKING:
    from gunicorn.arbiter import Arbiter
    from gunicorn.workers.base import Worker

BIND_WAIT_S = 10.0   # a killed master's orphaned workers may still hold the port this long


class _Unlistened:
    """gunicorn's socket, bound, with gunicorn's ``listen()`` left out (its own check for an
    inherited socket that already listens is the hook)."""

    @staticmethod
    def _is_listening(_sock: Any) -> bool:
        return True


class TCPSocket(_Unlistened, sock.TCPSocket):
    pass


class TCP6Socket(_Unlistened, sock.TCP6Socket):
    pass


def make_unlistened(server: Arbiter) -> None:
    """Give the master its listening sockets bound and not listening (``on_starting``); with
    ``reuse_port``, every worker's own socket (``unlisten_worker_sockets``)."""
    cfg = server.cfg
    if os.environ.get("GUNICORN_FD") or os.environ.get("LISTEN_FDS"):
        return
    if cfg.reuse_port:
        unlisten_worker_sockets()
        return
    if server.LISTENERS:
        return
    addresses = cfg.address
    if not addresses or not all(isinstance(a, tuple) for a in addresses):
        return
    listeners = []
    for address in addresses:
        kind = TCP6Socket if util.is_ipv6(address[0]) else TCPSocket
        began = time.monotonic()
        deadline = began + BIND_WAIT_S
        tries = 0
        while True:
            try:
                listeners.append(kind(address, cfg, server.log))
                if tries:   # a killed master's workers held it (tests/fleet/test_orphaned_workers.py)
                    server.log.warning("bound %s:%s after waiting %.2fs for the port", *address[:2],
                                    time.monotonic() - began)
                break
            except OSError as error:
                if error.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                    for made in listeners:
                        made.close()
                    return           # gunicorn makes them as usual (and reports the error)
                tries += 1
                time.sleep(0.05)
    server.LISTENERS = listeners


def unlisten_worker_sockets() -> None:
    """With ``reuse_port`` gunicorn makes each worker's socket right after the fork, listening
    at once, while the worker still loads the application: the connections the kernel hashed to
    it waited for the whole boot (slowest call 115-402 ms in reloads and recycling). gunicorn
    picks the class of a TCP socket by its module's names: pointed at these, the worker's socket
    is bound and joins its port's group only when ``start_listening`` runs."""
    sock.TCPSocket = TCPSocket      # gunicorn's _sock_type reads these names
    sock.TCP6Socket = TCP6Socket


def start_listening(worker: Worker) -> None:
    """The application is loaded: the shared socket may take connections (``post_worker_init``;
    on a socket that already listens this only sets the backlog again)."""
    for listener in worker.sockets:
        raw = getattr(listener, "sock", None)
        if raw is not None:
            raw.listen(worker.cfg.backlog)
