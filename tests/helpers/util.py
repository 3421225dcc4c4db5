"""Small things every test module may need: the repository root, the session's keys, unique
names, and waiting until something holds (free ports: ``helpers.ports``)."""
from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# One admin key and one secret key for every gateway process of the session (the in-process
# apps, the gunicorn masters, ``fleet up``): they share one store, whose connection passwords
# are encrypted with the secret key.
# One run's pytest-xdist workers draw the same ones (their run id): a test parametrized with a key
# must be collected alike by every worker. (Each worker has a store and a Redis of its own.)
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex
ADMIN_KEY = "test-admin-" + hashlib.sha256(f"admin {_RUN}".encode()).hexdigest()[:32]
SECRET_KEY = "test-secret-" + hashlib.sha256(f"secret {_RUN}".encode()).hexdigest()[:32]
# The metrics token of every gateway process of the session: /metrics answers nothing without one.
METRICS_TOKEN = "test-metrics-" + hashlib.sha256(f"metrics {_RUN}".encode()).hexdigest()[:32]
METRICS_AUTH = {"Authorization": f"Bearer {METRICS_TOKEN}"}
# Connections refer to their database's password as ${GW_TEST_DEMO_PASSWORD}: every gateway
# process reads it from its environment (``Services.env``; the session fixture sets it in
# this process's own for the in-process apps).
PASSWORD_ENV = "GW_TEST_DEMO_PASSWORD"


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


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
