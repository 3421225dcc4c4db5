"""Small things every test module may need: the repository root, the session's keys, unique
names, a free port, and polling until something holds."""
from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# One admin key and one secret key for every gateway process of the session (the in-process
# apps, the gunicorn masters, ``fleet up``): they share one store, whose connection passwords
# are encrypted with the secret key.
ADMIN_KEY = "test-admin-" + uuid.uuid4().hex
SECRET_KEY = "test-secret-" + uuid.uuid4().hex
# The metrics token of every gateway process of the session: /metrics answers nothing without one.
METRICS_TOKEN = "test-metrics-" + uuid.uuid4().hex
METRICS_AUTH = {"Authorization": f"Bearer {METRICS_TOKEN}"}
# Connections refer to their database's password as ${GW_TEST_DEMO_PASSWORD}: every gateway
# process reads it from its environment (``Services.env``; the session fixture sets it in
# this process's own for the in-process apps).
PASSWORD_ENV = "GW_TEST_DEMO_PASSWORD"


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port free now and not handed out before in this process: the kernel may give one port
    to two binds in a row, and two masters made at once then bound the same port (each binds
    before it listens, fleet/server/listen.py) and the second failed to boot with EADDRINUSE."""
    for _ in range(100):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no free port that was not handed out already")


def claim_ports(*ports: int) -> bool:
    """Mark ``ports`` handed out; False (nothing marked) when one of them already was."""
    if _HANDED_OUT.intersection(ports):
        return False
    _HANDED_OUT.update(ports)
    return True


def wait_until(predicate, timeout_s: float, interval_s: float = 0.05, what: str | Callable[[], str] = "condition"):
    """The first true value of ``predicate()``; AssertionError after ``timeout_s`` (``what``, or
    what it returns then: what was seen, say)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what if isinstance(what, str) else what()}")
        time.sleep(interval_s)
