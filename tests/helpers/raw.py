"""HTTP as raw bytes on a socket: what a hostile or unusual client sends, and everything the
server answers until it closes the connection."""
from __future__ import annotations

import socket

import requests.structures

from helpers.api import Reply


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    """A connection to the server on ``port`` from the loopback address ``source``."""
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def until_closed(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """Everything the server sends until it closes the connection (an AssertionError if it does not)."""
    sock.settimeout(timeout)
    got = bytearray()
    while True:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            raise AssertionError(f"the connection stayed open; got {bytes(got)!r}") from None
        except ConnectionResetError:
            break
        if not data:
            break
        got += data
    return bytes(got)


def exchange(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    """``data`` sent on a new connection; everything answered until the server closes it."""
    sock = connect(port)
    try:
        sock.sendall(data)
        return until_closed(sock, timeout)
    finally:
        sock.close()


def reply_of(answer: bytes) -> Reply:
    """The first response of ``answer`` (Content-Length framed) as a ``Reply``."""
    head, _, rest = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = requests.structures.CaseInsensitiveDict(line.split(": ", 1) for line in lines[1:])
    length = int(headers.get("Content-Length", "0"))
    return Reply(int(lines[0].split(" ")[1]), headers, rest[:length])
