"""Free TCP ports for the servers the tests start (PostgreSQL, Redis, gunicorn masters, nginx,
Redis topologies), safe when several test processes pick at once: pytest-xdist's workers, or
two checkouts' suites on one machine.

Why not ``bind(0)``: the kernel answers with a port of its ephemeral range (32768-60999 here,
``/proc/sys/net/ipv4/ip_local_port_range``), the range it also takes the local end of every
outgoing connection from. Between the moment a test learns the port and the moment its server
binds it, any client's ``connect()`` may be given that port as its local end, and the server
then fails with "Address already in use" (met with PostgreSQL, two suites side by side). So
ports are picked below the ephemeral range (10000 up to its start by default), where the
kernel never puts a connection's local end: only a server that binds the port explicitly can
take it.

Why a lock: two processes probing at once could both find one port free. Each port handed out
is held with a POSIX record lock on one byte (offset = the port) of one shared file,
``$TMPDIR/gateway-test-ports.lock``, for as long as the process that took it lives (the kernel
releases the locks when it exits, however it exits); a process also never hands out a port
twice itself. A port is handed out only when nobody listens on it (a test bind succeeds) and
no other process of the suite holds it.

``GATEWAY_TEST_PORTS=low-high`` narrows the range (two suites each in its own range, or a range
a machine's policy leaves to tests).
"""
from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
import threading
from pathlib import Path

LOCK_FILE = Path(tempfile.gettempdir()) / "gateway-test-ports.lock"
LOWEST = 10000


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_range() -> tuple[int, int]:
    """The ports handed out, both ends included."""
    wanted = os.environ.get("GATEWAY_TEST_PORTS", "")
    if wanted:
        low, _, high = wanted.partition("-")
        return int(low), int(high)
    return LOWEST, _ephemeral_start() - 1


_guard = threading.Lock()
_handed_out: set[int] = set()
_lock_fd: int | None = None   # one descriptor for the process's life: closing any descriptor of
#                               the file would drop every record lock this process holds on it


def _lock_file() -> int:
    global _lock_fd
    if _lock_fd is None:
        _lock_fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
    return _lock_fd


def _bindable(port: int) -> bool:
    """Nobody listens on (or holds a connection from) 127.0.0.1:``port`` now. Without
    SO_REUSEADDR, so a port with connections lingering in TIME_WAIT is passed over too."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _claim(port: int) -> bool:
    try:
        fcntl.lockf(_lock_file(), fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port, os.SEEK_SET)
    except OSError:
        return False     # another process of the suite holds it
    return True


def _pick(low: int, high: int, count: int) -> list[int] | None:
    """``count`` consecutive ports from a random start, claimed; None when one is taken."""
    first = random.randint(low, high - count + 1)
    candidates = list(range(first, first + count))
    if _handed_out.intersection(candidates) or not all(_bindable(p) for p in candidates):
        return None
    if not all(_claim(p) for p in candidates):
        return None      # a block claimed in part stays so (and unused): rare and harmless
    _handed_out.update(candidates)
    return candidates


def free_ports(count: int = 1, consecutive: bool = False) -> list[int]:
    """``count`` ports, free now and held for this process from now on (``consecutive``: p,
    p+1, ...: what ``fleet up --instances`` binds)."""
    low, high = port_range()
    block = count if consecutive else 1
    found: list[int] = []
    with _guard:
        for _ in range(5000):
            found += _pick(low, high, block) or []
            if len(found) >= count:
                return found
    raise RuntimeError(f"no {count} free port(s) in {low}-{high} (GATEWAY_TEST_PORTS)")


def free_port() -> int:
    """One port, free now and held for this process (see the module's docstring)."""
    return free_ports(1)[0]
