"""A worker's boot, made cheaper: the master imports the third-party libraries once.

A reload, a recycle or a respawn starts a worker on a core where a sibling serves; loading the
application cost the new worker about 350 ms of CPU (imports, the catalog, sessions), 160 ms
of it importing falcon, psycopg2, redis, sqlglot, pglast, orjson and prometheus_client.
``preload_libraries`` imports them in the master (gunicorn_conf.py, at start-up); every worker
forks with them imported and shares their pages. Every library a worker imports is listed
(tests/fleet/test_boot.py checks that a worker's boot imports nothing else): cryptography,
sqlglot's PostgreSQL dialect and PyYAML, left to each worker, were another ~28 ms of its CPU.
Our own code (``gateway``, ``fleet.app``) is still imported by each worker, so a SIGHUP still
loads a deployed change of it; a new version of a library needs a restart of the master
(``fleet down`` / ``up``, or a rolling restart).

Our own code is compiled once, by the master, into its ``__pycache__`` (``compile_own_code``):
where bytecode is not written on import (``PYTHONDONTWRITEBYTECODE``, a read-only checkout)
each worker compiled every module of ``gateway`` and ``fleet`` from source at each boot, 75 of
its 180 ms of CPU. Reading bytecode is never disabled; a changed source is compiled again by
the master when a SIGHUP re-reads its configuration, before the new workers import it.

Tried and not kept: booting the worker at a lower CPU priority (nice +10, restored once it
served). With a paced load through nginx its reload and recycling windows were no better than
at the same priority (slowest call 53-167 ms against 51-101 ms over 4-5 runs each,
docs/bench/2026-11-30-rerun-2.md).
"""
from __future__ import annotations

import compileall
import importlib
import mimetypes
from pathlib import Path

LIBRARIES = ("falcon", "psycopg2", "psycopg2.extras", "psycopg2.pool", "psycopg2.errors", "psycopg2.errorcodes",
             "redis", "orjson", "sqlglot", "sqlglot.expressions", "sqlglot.optimizer", "sqlglot.dialects.postgres",
             "pglast", "prometheus_client", "yaml", "cryptography.exceptions",
             "cryptography.hazmat.primitives.ciphers.aead", "pickle", "logging.handlers", "hmac", "secrets",
             "encodings.idna", "re2")


def preload_libraries(names: tuple[str, ...] = LIBRARIES) -> list[str]:
    """Import ``names`` here (the master); returns those that could not be imported. Also reads
    the system's MIME types, which Falcon's first ``App`` reads otherwise (``/etc/mime.types``,
    2,000 lines: 15-25 ms of each worker's boot)."""
    missing = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    mimetypes.init()
    return missing


OWN_PACKAGES = ("gateway", "fleet")
ROOT = Path(__file__).resolve().parents[2]


def compile_own_code(root: Path = ROOT) -> bool:
    """Compile ``gateway`` and ``fleet`` into their ``__pycache__`` (only what changed since);
    False where that could not be done (a read-only checkout: the image compiles at build)."""
    done = True
    for package in OWN_PACKAGES:
        try:
            done = bool(compileall.compile_dir(root / package, quiet=2, workers=1)) and done
        except OSError:
            done = False
    return done
