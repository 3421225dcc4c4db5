"""fleet/worker.py's look at a listening socket's accept queue (``queued``), which decides
whether a leaving worker may shut its socket without resetting a connection queued on it."""
from __future__ import annotations

import socket
import time

from fleet.worker import queued


def test_queued_counts_the_connections_waiting_to_be_accepted():
    listener = socket.socket()
    clients = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        assert queued(listener) == 0
        clients = [socket.create_connection(listener.getsockname()) for _ in range(3)]
        deadline = time.monotonic() + 2
        while queued(listener) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert queued(listener) == 3
        listener.accept()[0].close()
        assert queued(listener) == 2
    finally:
        for client in clients:
            client.close()
        listener.close()


def test_queued_is_unknown_for_what_is_not_a_tcp_listener():
    unix = socket.socket(socket.AF_UNIX)
    try:
        assert queued(unix) == -1
    finally:
        unix.close()
