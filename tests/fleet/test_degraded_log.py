"""Logging while degraded is rate-limited (``fleet.shared.degraded``): a worker whose Redis is away
logs once when it starts deciding locally, a summary every ``GATEWAY_DEGRADED_LOG_S``, and
once when Redis answers again; never a line per failed retry. Driven on a real
``LeasedAdmission`` from 4 threads against a real Redis of this module's own, stopped for
about 3.5 s with a 1 s summary interval.

Before (measured: the same calls and outage on the build before it): 15 warnings for one
worker, one per 250 ms retry window, and no line when Redis came back. Now: 6 (one, four
summaries, one).
"""
from __future__ import annotations

import logging
import random
import re
import threading
import time
from types import SimpleNamespace

import pytest

from fleet.shared.leases import LeasedAdmission
from gateway.errors import GatewayError
from gateway.model.limits import Rate
from gateway.settings import Settings
from helpers.services import start_redis
from helpers.util import wait_until

# Its own Redis, stopped and started.
pytestmark = pytest.mark.integration

DOWN_S = 3.5
SUMMARY_S = 1


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    rd = start_redis(tmp_path_factory.mktemp("degraded-redis"))
    yield rd
    rd.stop()


def test_degraded_logs_once_per_state_change_plus_a_summary(server, caplog):
    admission = LeasedAdmission(server.url(), Settings(redis_url=server.url(), lease_ms=100,
                                                       redis_timeout_ms=250, degraded_log_s=SUMMARY_S),
                                workers_hint=lambda: 0)   # no headroom (fleet.shared.rates): the fallback decides
    key = SimpleNamespace(id=random.randrange(10**9, 10**12), rate=Rate.parse("100000/second", None), quota=None)
    admitted = refused = 0
    counts_lock = threading.Lock()
    stop = threading.Event()

    def call() -> None:
        nonlocal admitted, refused
        while not stop.is_set():
            try:
                admission.admit_key(key)
                ok = True
            except GatewayError:
                ok = False
            with counts_lock:
                admitted += ok
                refused += not ok
            time.sleep(0.001)      # paced callers

    threads = [threading.Thread(target=call, daemon=True) for _ in range(4)]
    caplog.set_level(logging.INFO, logger="fleet.shared.leases")
    try:
        for t in threads:
            t.start()
        wait_until(lambda: admitted > 100, 10, 0.01, "calls admitted through Redis")
        server.stop()
        down = time.monotonic()
        with counts_lock:
            before_down = admitted
        time.sleep(DOWN_S)      # a sleep that is the test: the outage whose summaries are counted
        server.start()
        up = time.monotonic()
        wait_until(lambda: any("answers again" in r.getMessage() for r in caplog.records), 10, 0.05, "the recovery line")
        time.sleep(SUMMARY_S + 0.2)     # a sleep that is the test: a summary after the recovery would come by now
    finally:
        stop.set()
        for t in threads:
            t.join(5)
        admission.close()

    lines = [r.getMessage() for r in caplog.records if r.name == "fleet.shared.leases" and r.levelno >= logging.WARNING]
    print(f"{len(lines)} lines in {up - down:.1f}s down + 2 s back:\n" + "\n".join(lines))
    began = [m for m in lines if "Redis unreachable" in m]
    summaries = [m for m in lines if "still unreachable" in m]
    back = [m for m in lines if "answers again" in m]
    assert len(began) == 1 and len(back) == 1, lines
    # one summary a second while down (the first a second after the start, the last within a
    # second of the end): 3 for 3.5 s, give or take a tick on a loaded machine
    assert int(DOWN_S / SUMMARY_S) - 1 <= len(summaries) <= int(DOWN_S / SUMMARY_S) + 1, lines
    assert len(lines) == len(began) + len(summaries) + len(back), lines
    assert lines.index(began[0]) < lines.index(summaries[0]) and lines[-1] == back[0], lines
    # the summaries count what was decided locally: together, no more than the recovery line
    admitted_locally = [int(re.search(r"(\d+) calls were admitted", m).group(1)) for m in summaries]
    total = int(re.search(r"(\d+) calls were admitted", back[0]).group(1))
    assert sum(admitted_locally) <= total and total > 100, (admitted_locally, total)
    assert admitted - before_down >= total, (admitted, before_down, total)
    assert refused == 0, refused   # open mode, a limit far above this rate: the local share admits
