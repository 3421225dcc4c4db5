"""A worker's boot, made cheap for the workers already serving on its core.

A reload, a recycle or a respawn starts a worker on a core where a sibling serves; loading the
application costs the new worker about 350 ms of CPU (imports, the catalog, sessions), and at
the same priority it takes half the core from the sibling while it does: the sibling's calls
slowed from p50 5.6 ms to 13.4 ms during a SIGHUP reload at 800 calls/s (the faults block,
paced). Two remedies, each with its own reason:

- ``preload_libraries``: the master imports the third-party libraries once (falcon, psycopg2,
  redis, sqlglot, pglast, orjson, prometheus_client); every worker forks with them imported and
  shares their pages. Our own code (``gateway``, ``fleet.app``) is still imported by each worker,
  so a SIGHUP still loads a deployed change of it; a new version of a library needs a restart of
  the master (``fleet down`` / ``up``, or a rolling restart).
- ``lower_priority`` / ``restore_priority``: the worker raises its nice value by
  ``GATEWAY_BOOT_NICE`` in ``post_fork`` and restores it, on every thread it started meanwhile
  (Linux keeps a nice value per thread, and threads inherit their creator's), once the
  application is loaded. A booting worker then runs on idle CPU first; only where the worker
  may lower its nice value again (CAP_SYS_NICE, or ``RLIMIT_NICE``), else it would serve at the
  lower priority for its whole life.
"""
from __future__ import annotations

import importlib
import os
import resource

LIBRARIES = ("falcon", "psycopg2", "psycopg2.extras", "psycopg2.pool", "redis", "orjson",
             "sqlglot", "sqlglot.expressions", "sqlglot.optimizer", "pglast", "prometheus_client")

_CAP_SYS_NICE = 23


def preload_libraries(names: tuple[str, ...] = LIBRARIES) -> list[str]:
    """Import ``names`` here (the master); returns those that could not be imported."""
    missing = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def may_restore(nice: int) -> bool:
    """Whether this process may set its nice value back down to ``nice`` (sched(7): with
    CAP_SYS_NICE, or when RLIMIT_NICE's soft limit is at least 20 - nice)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    if soft == resource.RLIM_INFINITY or soft >= 20 - nice:
        return True
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_SYS_NICE & 1)
    except OSError:
        pass
    return False


def lower_priority(by: int) -> int | None:
    """Raise this (single-threaded, just forked) process's nice value by ``by``; returns the
    value to restore, or None when nothing was changed."""
    if by <= 0:
        return None
    base = os.getpriority(os.PRIO_PROCESS, 0)
    if not may_restore(base):
        return None
    os.setpriority(os.PRIO_PROCESS, 0, min(19, base + by))
    return base


def restore_priority(base: int | None) -> None:
    """Set every thread of this process back to ``base``."""
    if base is None:
        return
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, base)
        except OSError:     # a thread that ended meanwhile
            pass
