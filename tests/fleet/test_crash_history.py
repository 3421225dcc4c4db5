"""What a crash loses from the run history, measured under load on real gunicorn masters: every
call a client saw answered must be in the history once, after

- one worker SIGKILLed (its replacement, or the other worker, stores its spool);
- the master alone SIGKILLed (its workers are told, stop gracefully and flush);
- the master and all its workers SIGKILLed at once (the next master started on the same home
  stores their spools);

and, as the control that shows the test can fail, the same worker SIGKILL with the spool off
loses the runs of the last flush interval. A run recorded by a process killed before it sent
the answer may be in the history without a client having seen it: at most the calls in
flight, one per client.

``GATEWAY_HISTORY_FLUSH_MS`` is 1 s here (200 ms by default), so every kill finds runs not yet
stored.
"""
from __future__ import annotations

import os
import signal
import time

import pytest

from helpers.load import Callers
from helpers.masters import Master
from helpers.procs import wait_gone

pytestmark = pytest.mark.slow

FLUSH_MS = 1000
CLIENTS = 4
ANSWERED_BEFORE = 300     # calls answered before each kill


def history_of(sql, query: str) -> dict:
    """{request_id: rows} of the runs of ``query``."""
    return dict(sql("SELECT request_id, count(*) FROM gw_run_history WHERE query = %s GROUP BY 1", (query,)))


def settle(sql, query: str, answered: set, timeout_s: float = 15) -> dict:
    """The runs of ``query`` once every answered call is in (or ``timeout_s`` passed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        runs = history_of(sql, query)
        if answered <= set(runs) or time.monotonic() > deadline:
            # A sleep that is the test: a run stored twice, or one more stored without an
            # answer, would arrive after the ones awaited; nothing announces that none will.
            time.sleep(0.5)
            return history_of(sql, query)
        time.sleep(0.1)


def check(answers, runs: dict, what: str, lose_none: bool = True) -> int:
    answered = {a.request_id for a in answers if a.status == 200}
    failed = [a for a in answers if a.status != 200]
    missing = answered - set(runs)
    unseen = set(runs) - answered            # recorded by a process killed before it answered
    print(f"{what}: {len(answered)} answered, {len(failed)} failed ({ {a.error for a in failed} }), "
          f"{len(missing)} missing from the history, {len(unseen)} stored without an answer")
    assert len(answered) >= ANSWERED_BEFORE
    assert all(a.status in (0, 200) for a in answers), {a.status for a in answers}
    assert all(n == 1 for n in runs.values()), "a run stored twice"
    if lose_none:
        assert not missing, f"{len(missing)} answered calls are not in the history"
    assert len(unseen) <= CLIENTS, unseen
    return len(missing)


@pytest.fixture
def master_factory(services, tmp_path_factory):
    started = []

    def make(home=None, **settings):
        master = Master(services, home or tmp_path_factory.mktemp("crash-home"), workers=2,
                        history_flush_ms=FLUSH_MS, **settings)
        started.append(master)
        return master.start(90)
    yield make
    for master in started:
        master.stop()


@pytest.mark.parametrize("spool", ["", "off"], ids=["spool", "no-spool"])
def test_a_killed_worker(master_factory, endpoint, superuser, spool):
    master = master_factory(history_spool=spool)
    ep = endpoint("SELECT 1 AS one")
    victim = master.worker_pids()[0]
    # A new connection a call spreads the calls over both workers.
    with Callers(f"{master.base}/q/{ep.query}", ep.secret, threads=CLIENTS, close=True) as callers:
        callers.wait_for(ANSWERED_BEFORE, status=200)
        os.kill(victim, signal.SIGKILL)
        assert wait_gone(victim, 5)
        callers.wait_for(callers.count(200) + 100, status=200)    # answered by the other worker, or the new one
    answers = callers.answers
    answered = {a.request_id for a in answers if a.status == 200}
    runs = settle(superuser, ep.query, answered, 15 if spool != "off" else 4)
    missing = check(answers, runs, f"worker SIGKILL, spool {spool or 'on'}", lose_none=spool != "off")
    if spool == "off":
        # The control: without the spool the runs of the last flush interval are gone.
        assert missing > 0, "the kill lost nothing without the spool: the test cannot tell"


def test_a_killed_master_alone(master_factory, endpoint, superuser):
    master = master_factory()
    ep = endpoint("SELECT 1 AS one")
    workers = master.worker_pids()
    with Callers(f"{master.base}/q/{ep.query}", ep.secret, threads=CLIENTS, close=True) as callers:
        callers.wait_for(ANSWERED_BEFORE, status=200)
        master.proc.send_signal(signal.SIGKILL)
        assert all(wait_gone(pid, 5) for pid in workers)
        callers.wait_for(callers.count(0) + CLIENTS, status=0)    # the clients meet the closed port
    answers = callers.answers
    runs = settle(superuser, ep.query, {a.request_id for a in answers if a.status == 200})
    check(answers, runs, "master SIGKILL (its workers flush)")


def test_a_killed_master_and_its_workers(master_factory, endpoint, superuser, tmp_path_factory):
    home = tmp_path_factory.mktemp("crash-home")
    master = master_factory(home=home)
    ep = endpoint("SELECT 1 AS one")
    workers = master.worker_pids()
    with Callers(f"{master.base}/q/{ep.query}", ep.secret, threads=CLIENTS, close=True) as callers:
        callers.wait_for(ANSWERED_BEFORE, status=200)
        os.killpg(master.proc.pid, signal.SIGKILL)     # nobody of that instance is left to flush
        assert all(wait_gone(pid, 5) for pid in [master.proc.pid, *workers])
        callers.wait_for(callers.count(0) + CLIENTS, status=0)    # the clients meet the closed port
    answers = callers.answers
    answered = {a.request_id for a in answers if a.status == 200}
    lost = answered - set(history_of(superuser, ep.query))
    print(f"not stored when the instance died: {len(lost)}")
    assert lost, "every run was stored before the kill: the test cannot tell"
    master_factory(home=home)                           # the instance again, on the same home
    runs = settle(superuser, ep.query, answered)
    check(answers, runs, "master and workers SIGKILL, then a master on the same home")
