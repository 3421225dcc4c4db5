"""The suite's three tiers, as markers every test gets at collection (``conftest.py``):

- ``unit``: no server: runs in well under a minute (``pytest -m unit``);
- ``integration``: the session's real PostgreSQL and Redis, an in-process app, one gunicorn
  master (the session's ``gunicorn``, a module's ``master``);
- ``fleet``: several gateway processes, ``fleet up``, Redis topologies, or a module's own servers
  that its tests stop and restart (``private_services``): fault tests.

A test's tier, the first rule that applies:

1. a tier marker on the test, its class or its module (``pytestmark = pytest.mark.fleet``);
2. ``fleet`` when it uses ``private_services``, or its module imports what starts gateway
   processes or Redis topologies (``FLEET_HELPERS``);
3. ``integration`` when it uses the session's servers (``services``, directly or through any
   fixture built on them: ``app``, ``api``, ``gunicorn``...);
4. ``unit`` otherwise; and a unit test that starts a server process anyway (a module fixture
   of its own calling ``start_postgres``, a ``redis-server``) fails, saying which marker to add
   (``refuse_servers``).
"""
from __future__ import annotations

import json
import os
import subprocess
import types
from pathlib import Path

import pytest

TIERS = ("unit", "integration", "fleet")

# Modules (and names) whose import marks a test module as one that runs several processes.
FLEET_HELPERS = ("helpers.masters", "helpers.fleetup", "helpers.redis_topologies")

# What a unit test may not start: the servers of the other tiers, as executables and as
# `python -m` modules (the benchmark harness starts fleets and their targets).
SERVERS = ("postgres", "pg_ctl", "initdb", "redis-server", "valkey-server", "redis-sentinel", "nginx",
           "gunicorn", "fleet", "locust")
SERVER_MODULES = ("gunicorn", "fleet.ops.cli", "loadtests.bench", "loadtests.servers", "locust")

current = "unit"     # the tier of the test being set up, run or torn down now


def _uses_fleet_helpers(module: types.ModuleType | None) -> bool:
    if module is None:
        return False
    for value in vars(module).values():
        name = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", "")
        if name in FLEET_HELPERS:
            return True
    return False


def tier_of(item: pytest.Item) -> str:
    for mark in item.iter_markers():        # closest first: the test, its class, its module
        if mark.name in TIERS:
            return mark.name
    names = set(getattr(item, "fixturenames", ()))
    if "private_services" in names or _uses_fleet_helpers(getattr(item, "module", None)):
        return "fleet"
    if "services" in names:
        return "integration"
    return "unit"


def _server_in(args) -> str | None:
    argv = [str(a) for a in ([args] if isinstance(args, (str, bytes, os.PathLike)) else list(args))]
    if not argv:
        return None
    words = argv[0].split() if len(argv) == 1 else argv     # shell=True: one string
    # every word, for `runuser -u postgres -- pg_ctl ...`
    found = [Path(w).name for w in words if Path(w).name in SERVERS]
    found += [m for flag, m in zip(words, words[1:]) if flag == "-m" and m in SERVER_MODULES]
    return found[0] if found else None


class ServerInUnitTier(Exception):
    pass


_real_init = subprocess.Popen.__init__


def _guarded_init(self, args, *more, **kwargs):
    if current == "unit":
        server = _server_in(args)
        if server is not None:
            raise ServerInUnitTier(
                f"a unit-tier test started {server!r}: mark its module `pytestmark = pytest.mark.integration` "
                f"(or `fleet`, see tests/helpers/tiers.py), or use the session's servers through a fixture")
    _real_init(self, args, *more, **kwargs)


def refuse_servers() -> None:
    """From now on, a unit-tier test that starts a server process fails (see the docstring)."""
    subprocess.Popen.__init__ = _guarded_init    # type: ignore[method-assign]


DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"   # {file: seconds}, `--store-durations`
GUESS_S = {"unit": 1.0, "integration": 5.0, "fleet": 20.0}          # a file the table does not know


def file_seconds(items: list[pytest.Item]) -> dict[str, float]:
    """What each file of ``items`` took when the table was last stored, or a guess by tier."""
    try:
        known = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        known = {}
    guess: dict[str, float] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        guess[path] = max(guess.get(path, 0.0), GUESS_S[tier_of(item)])
    return {path: float(known.get(path, seconds)) for path, seconds in guess.items()}


def heaviest_first(items: list[pytest.Item]) -> None:
    """The order pytest-xdist hands files out in (``--no-loadscope-reorder``), each file's tests
    together in their own order: the longest first (``durations.json``), so that none starts
    last, and the fleet tier's files alternating with the others', so that about half the
    workers run several gateway processes at a time (four workers of fleet files at once on 2
    cores starved their timing tests into failing); the short files fill the gaps at the end."""
    seconds = file_seconds(items)
    fleet_files = {it.nodeid.split("::", 1)[0] for it in items if tier_of(it) == "fleet"}
    longest = sorted(seconds, key=lambda p: -seconds[p])
    fleet = [p for p in longest if p in fleet_files]
    rest = [p for p in longest if p not in fleet_files]
    merged = [p for pair in zip(fleet, rest) for p in pair]
    merged += fleet[len(rest):] + rest[len(fleet):]
    position = {p: i for i, p in enumerate(merged)}
    items.sort(key=lambda it: position[it.nodeid.split("::", 1)[0]])


class DurationTable:
    """``--store-durations``: each file's seconds (setup, call and teardown of its tests) in this
    run, written to ``durations.json`` at the end, for the next runs' order."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        path = report.nodeid.split("::", 1)[0]
        self.seconds[path] = self.seconds.get(path, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        table = {path: round(s, 1) for path, s in sorted(self.seconds.items())}
        DURATIONS.write_text(json.dumps(table, indent=0) + "\n")


def xdist_workers(config: pytest.Config) -> int:
    """How many xdist workers this run has (0: none)."""
    if hasattr(config, "workerinput"):
        return int(config.workerinput.get("workercount", 1))
    workers = getattr(config.option, "numprocesses", None) or 0
    return workers if isinstance(workers, int) else 1

