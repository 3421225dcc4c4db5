"""A calls quota never admits more than its calls (the README's promise; issue #26), also when
Redis answers slowly or not at all.

The cause of the 51-of-50 (issue #26), traced in real workers: a Redis reply that comes after
``GATEWAY_REDIS_TIMEOUT_MS`` (a loaded Redis, not a lost one) counts as Redis unreachable, and
the quota's local fallback (a local quota fallback, since removed: ``fleet.shared.quotas``) then admits this
worker's share of what it last saw left, ``(calls - used) / W``, and one call even when it
last saw nothing left (``_local_take`` floors a local bucket at one token); none of it is
debited in Redis, nor reconciled when Redis answers again. The timed-out script had run:
its grant is debited in Redis and lost to the worker. A slow reply after the quota was spent
admits one call more per worker (the 51); one before admits a share more. (Traced: a trial
admitted 76 of 50, 32 from answered leases and 44 from local shares, while Redis's counter
held 50: the 32 and the 18 granted to the four timed-out scripts.)

- Driven directly (``LeasedAdmission`` on the session's Redis behind a relay that holds
  replies past the client's timeout; the command has run on Redis by then): a slow reply
  after the quota is spent, a slow reply in the middle of it, and a hand-back of leftovers
  whose reply comes late (the flusher keeps the leftovers and hands them back again, so
  Redis's counter is lowered twice).
- A real 4-worker fleet on a PostgreSQL and Redis of this module's own (``private_services``),
  a CPU hog beside it: 200 trials of a 50-call quota hammered by 32 clients, Redis paused for
  a moment (about its timeout) in each; and Redis stalled (SIGSTOP) for 5 s while a 100-call
  quota is hammered.

What must hold in every case: the calls admitted are at most the quota, and at most what
Redis's counter holds (every admitted call was debited there: a counter below the calls
admitted means some were admitted from nowhere), and the run history agrees.

On the code of issue #26 (d55f79c) every test here fails: 14 of 10, 49 of 40, 210 of 200
(the counter fell to 10 with 20 admitted); 144 of 200 trials over 50 (by 1 to 47, 11,943
admitted of 10,000); 161 of 100 with Redis stalled for 5 s (76 of them during the stall).
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
import requests

from fleet.shared.leases import LeasedAdmission
from gateway.errors import GatewayError
from gateway.model.limits import Quota, quota_window
from gateway.settings import Settings
from helpers import tiers
from helpers.admission import FakeClock
from helpers.api import Api
from helpers.masters import Master
from helpers.relay import DelayingRelay
from helpers.util import wait_until

# The direct tests' GATEWAY_REDIS_TIMEOUT_MS: the default, so that only the replies the relay holds
# miss it (at 100 ms an unheld reply on a loaded machine did too: admission_unavailable where
# the test expected quota_exceeded).
TIMEOUT_MS = 250
LATE_S = 0.6               # a held reply arrives this long after its command ran: past the timeout
DOWN_S = 0.25              # fleet.shared.leases: after a Redis error a worker decides locally this long
# Refusals a quota may answer with: spent, or (a design that refuses while Redis is away) 503.
REFUSALS = {"quota_exceeded", "admission_unavailable"}


# --- driven directly ------------------------------------------------------------------------
@pytest.fixture
def relay(services):
    relay = DelayingRelay("127.0.0.1", services.redis.port)
    yield relay
    relay.close()


def a_quota_key(calls: int):
    """What the admission reads of a catalog key; a fresh id, so a fresh bucket in Redis."""
    return SimpleNamespace(id=random.randrange(10**9, 10**12), rate=None,
                           quota=Quota.parse({"calls": calls, "per": "day"}))


def counter(rdb, key) -> int:
    return int(rdb.hget(f"gw:{{q:{key.id}}}:{quota_window('day')[0]}", "calls") or 0)


def admission_behind(relay, services, clock, workers: int = 1) -> LeasedAdmission:
    url = relay.url(services.redis_url)
    knobs = Settings(redis_url=url, lease_ms=100, lease_max=64, redis_timeout_ms=TIMEOUT_MS, redis_failure="open")
    return LeasedAdmission(url, knobs, workers_hint=lambda: workers, clock=clock)


def attempt(admission, key, calls: int) -> tuple[int, dict]:
    """``calls`` calls of ``key``: how many were admitted, and the refusals by code."""
    admitted, refused = 0, {}
    for _ in range(calls):
        try:
            admission.admit_key(key)
        except GatewayError as err:
            refused[err.code] = refused.get(err.code, 0) + 1
        else:
            admitted += 1
    return admitted, refused


def test_a_slow_answer_after_the_quota_is_spent_admits_nothing(relay, services, rdb):
    """The 51-of-50: four workers know the quota is spent (their last replies said so); their
    next asks are answered late. Each worker, taking the late reply for a lost Redis, admits
    one call from a local share of nothing (14 of 10 on the code of issue #26)."""
    clock = FakeClock()
    workers = [admission_behind(relay, services, clock, workers=4) for _ in range(4)]
    key = a_quota_key(10)
    admitted = 0
    try:
        for admission in workers:
            more, refused = attempt(admission, key, 20)
            admitted += more
            assert set(refused) == {"quota_exceeded"}, refused
        assert admitted == 10, admitted
        for _ in range(2):
            clock.now += 0.2                 # past the refusal's pause: each worker asks Redis again
            relay.reply_delay_s = LATE_S
            for admission in workers:
                more, codes = attempt(admission, key, 5)
                admitted += more
                assert set(codes) <= REFUSALS, codes
            relay.reply_delay_s = 0.0
            clock.now += DOWN_S + 0.05       # Redis is back
            for admission in workers:
                more, codes = attempt(admission, key, 5)
                admitted += more
                assert set(codes) <= REFUSALS, codes
        assert relay.held >= 4, "replies were not held: the slow path was not tested"
    finally:
        for admission in workers:
            admission.close()
    assert admitted <= 10, f"{admitted} calls admitted against a quota of 10 (Redis holds {counter(rdb, key)})"
    assert counter(rdb, key) >= admitted


def test_a_slow_answer_mid_quota_admits_nothing_beyond_redis(relay, services, rdb):
    """A slow reply while calls are left: the script ran (its lease is debited in Redis) but
    the worker, taking the late reply for a lost Redis, admits its share of what it last saw
    left on top, and Redis never hears of those calls (49 of 40 on the code of issue #26)."""
    clock = FakeClock()
    admission = admission_behind(relay, services, clock, workers=2)
    key = a_quota_key(40)
    try:
        admitted, refused = attempt(admission, key, 8)
        assert admitted == 8 and not refused
        clock.now += 0.2                     # the lease expired: the next call asks Redis
        relay.reply_delay_s = LATE_S
        more, codes = attempt(admission, key, 40)
        relay.reply_delay_s = 0.0
        admitted += more
        assert relay.held, "no reply was held: the slow path was not tested"
        assert set(codes) <= REFUSALS, codes
        clock.now += DOWN_S + 0.05
        for _ in range(5):                   # what Redis still grants, lease after lease
            more, codes = attempt(admission, key, 40)
            admitted += more
            assert set(codes) <= REFUSALS, codes
            clock.now += 0.2
    finally:
        admission.close()
    assert admitted <= 40, f"{admitted} calls admitted against a quota of 40 (Redis holds {counter(rdb, key)})"
    assert counter(rdb, key) >= admitted


def test_a_hand_back_answered_late_is_not_handed_back_twice(relay, services, rdb):
    """An expired lease's leftovers go back to Redis from the flusher; the hand-back runs on
    Redis but its reply comes late. The worker must not hand the same leftovers back again
    (``_settle_quota`` lowered ``lease.tokens`` only after the reply): each time it does,
    Redis's counter drops below the calls admitted and the quota admits that much more (on the
    code of issue #26: the counter fell to 10 with 20 admitted, and 210 of 200 were admitted)."""
    clock = FakeClock()
    admission = admission_behind(relay, services, clock)
    key = a_quota_key(200)
    try:
        admitted, refused = attempt(admission, key, 20)   # leases of 2, 4, 8, 16: 30 taken
        assert admitted == 20 and not refused
        leased = counter(rdb, key)
        assert leased > admitted, leased             # leftovers to hand back
        relay.reply_delay_s = LATE_S
        clock.now += Settings().quota_hold_s + 0.2   # the lease expired: its leftovers go back
        admission.flush()
        # The hand-back ran on Redis, though its reply is still held.
        wait_until(lambda: counter(rdb, key) <= admitted, 5, 0.01, "the hand-back to reach Redis")
        # A sleep that is the test: the background flusher's try, its reply held, times out too
        # (TIMEOUT_MS): nothing outside the admission shows when it gave up.
        time.sleep(TIMEOUT_MS / 1000 + 0.05)
        relay.reply_delay_s = 0.0
        clock.now += DOWN_S + 0.05
        admission.flush()                            # the next flush: nothing is left to hand back
        after_flush = counter(rdb, key)
        for _ in range(10):                          # the rest of the quota, lease after lease
            more, codes = attempt(admission, key, 60)
            admitted += more
            assert set(codes) <= REFUSALS, codes
            clock.now += 0.2
    finally:
        admission.close()
    assert admitted <= 200, (f"{admitted} calls admitted against a quota of 200 (Redis's counter fell to "
                             f"{after_flush} with 20 calls admitted; it holds {counter(rdb, key)})")
    assert after_flush >= 20, f"Redis's counter fell to {after_flush} with 20 calls admitted"
    assert counter(rdb, key) >= admitted


# --- a real fleet -----------------------------------------------------------------------------
WORKERS = 4
CLIENTS = 32
FLEET_TIMEOUT_MS = 50      # the fleet's GATEWAY_REDIS_TIMEOUT_MS: the pauses below straddle it
TRIALS = 200
TRIAL_CALLS = 50
TRIAL_S = 0.25             # each trial's hammering: 50 calls are gone within about 0.1 s here


@pytest.fixture
def cpu_hog(request):
    """Two busy processes beside the fleet (this machine has 2 cores), ended by their pids; for
    the one test that asks for them. Under pytest-xdist each other worker's tests are busy
    beside it already: a hog fewer for each (two hogs at full speed for the test's minute and a
    half starved the other workers' timing tests into failing)."""
    others = max(0, tiers.xdist_workers(request.config) - 1)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(max(0, 2 - others))]
    try:
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(10)


@pytest.fixture(scope="module")
def master(private_services, tmp_path_factory):
    m = Master(private_services, tmp_path_factory.mktemp("quota-exact-home"), workers=WORKERS,
               redis_timeout_ms=FLEET_TIMEOUT_MS)
    try:
        yield m.start()
    finally:
        m.stop()


@pytest.fixture(scope="module")
def admin(master, private_services):
    api = Api.over_http(master.base, private_services)
    yield api
    api.close()


@pytest.fixture(scope="module")
def query(admin):
    connection = admin.connection()
    return SimpleNamespace(connection=connection, name=admin.query("SELECT 1 AS v", connection=connection))


class Clients:
    """``count`` client threads kept for many trials: each trial, every one calls ``path``
    with the trial's secret on a new connection per call (so calls spread over every worker)
    until the trial ends. The answers of a trial: (status, code) -> count."""

    def __init__(self, base: str, path: str, count: int) -> None:
        self.base, self.path = base, path
        self._gate = threading.Barrier(count + 1)
        self._lock = threading.Lock()
        self._secret, self._until, self._done = "", 0.0, False
        self._answers: dict = {}
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]
        for thread in self._threads:
            thread.start()

    def begin(self, secret: str, seconds: float) -> None:
        self._secret, self._until, self._answers = secret, time.monotonic() + seconds, {}
        self._gate.wait(30)

    def end(self) -> dict:
        self._gate.wait(30)
        return self._answers

    def close(self) -> None:
        self._done = True
        self._gate.wait(30)
        for thread in self._threads:
            thread.join(30)

    def _run(self) -> None:
        session = requests.Session()
        url = self.base + self.path
        while True:
            self._gate.wait(60)
            if self._done:
                return
            headers = {"X-API-Key": self._secret, "Connection": "close"}
            while time.monotonic() < self._until:
                try:
                    reply = session.get(url, headers=headers, timeout=10)
                    answer = (reply.status_code, None if reply.status_code == 200 else reply.json().get("code"))
                except (requests.RequestException, ValueError) as exc:
                    answer = (0, type(exc).__name__)
                with self._lock:
                    self._answers[answer] = self._answers.get(answer, 0) + 1
            self._gate.wait(60)


def redis_pid(services) -> int:
    return int(services.redis.pid_file.read_text().split()[0])


def key_ids(sql, names) -> dict:
    return dict(sql("SELECT name, id FROM gw_api_keys WHERE name = ANY(%s)", (list(names),)))


def admitted_in_history(sql, ids, expected: dict, timeout_s: float = 15.0) -> dict:
    """{key id: admitted runs in the history} once it holds at least ``expected`` of each."""
    def read():
        rows = dict(sql("SELECT key_id, count(*) FROM gw_run_history WHERE key_id = ANY(%s) AND admitted "
                        "GROUP BY key_id", (list(ids),)))
        return rows if all(rows.get(k, 0) >= n for k, n in expected.items()) else None
    return wait_until(read, timeout_s, 0.1, "the runs of every trial in the history")


@pytest.mark.slow
def test_a_quota_never_over_admits_under_cpu_load_and_slow_redis(master, admin, query, private_services, cpu_hog):
    """200 trials, a fresh 50-call key each, 32 clients across 4 workers, two busy processes
    beside them, and in each trial Redis paused once at a random moment for 0.5 to 2 times
    the fleet's Redis timeout (a loaded Redis: some replies just before it, some after, the
    command having run either way). Every trial admits at most 50, as many as Redis's counter
    holds at most, and the history records exactly the calls answered 200.

    The pauses stand for the load issue #26 saw: on this 2-core machine two busy processes
    alone never delayed a script past 62 ms (about 1,000 scripts a run), so no reply reached
    the default 250 ms timeout and nothing was over-admitted in 36 such trials."""
    pid = redis_pid(private_services)
    rng = random.Random(26)
    clients = Clients(master.base, f"/q/{query.name}", CLIENTS)
    trials = []
    started = time.monotonic()
    try:
        for _ in range(TRIALS):
            name, secret = admin.named_key([query.name], [query.connection],
                                           quota={"calls": TRIAL_CALLS, "per": "day"})
            pause_at, pause_s = rng.uniform(0.0, TRIAL_S - 0.05), rng.uniform(0.5, 2.0) * FLEET_TIMEOUT_MS / 1000
            clients.begin(secret, TRIAL_S)
            time.sleep(pause_at)          # sleeps that are the test: Redis paused at a random moment ...
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(pause_s)       # ... for about the fleet's Redis timeout
            finally:
                os.kill(pid, signal.SIGCONT)
            trials.append((name, clients.end()))
    finally:
        clients.close()
    hammered_s = time.monotonic() - started

    sql = private_services.sql
    ids = key_ids(sql, [name for name, _ in trials])
    ok = {ids[name]: answers.get((200, None), 0) for name, answers in trials}
    history = admitted_in_history(sql, ids.values(), ok)
    client = private_services.redis_client()
    try:
        period = quota_window("day")[0]
        counters = {k: int(client.hget(f"gw:{{q:{k}}}:{period}", "calls") or 0) for k in ok}
    finally:
        client.close()
    codes = {code for _, answers in trials for (status, code) in answers if status != 200}
    over = {k: n for k, n in ok.items() if n > TRIAL_CALLS}
    undebited = {k: (n, counters[k]) for k, n in ok.items() if n > counters[k]}
    print(f"{TRIALS} trials in {hammered_s:.1f}s: admitted {sum(ok.values())} of {TRIALS * TRIAL_CALLS}; "
          f"{len(over)} trials over {TRIAL_CALLS} (by {sorted(n - TRIAL_CALLS for n in over.values())}); "
          f"{len(undebited)} admitted more than Redis's counter; refusals {sorted(map(str, codes))}")
    assert not over, f"{len(over)} of {TRIALS} trials admitted more than {TRIAL_CALLS}: {sorted(over.values())}"
    assert not undebited, f"admitted more than Redis debited (admitted, counter): {sorted(undebited.values())}"
    assert {k: history.get(k, 0) for k in ok} == ok, "the run history and the 200s disagree"
    assert codes <= REFUSALS, codes
    # Not a test that passes by refusing everything: most of each quota is spent. (Not all: a
    # timed-out script's grant is debited in Redis and may be lost to its worker, at most one
    # lease per worker per pause.)
    assert sum(ok.values()) >= 0.5 * TRIALS * TRIAL_CALLS, sum(ok.values())


@pytest.mark.slow
def test_a_quota_never_over_admits_while_redis_is_stalled(master, admin, query, private_services):
    """A 100-call key hammered by 16 paced clients; after 20 calls Redis stops (SIGSTOP: its
    data and connections stay) for 5 s, then goes on. Issue #26 saw 139 admitted."""
    calls = 100
    name, secret = admin.named_key([query.name], [query.connection], quota={"calls": calls, "per": "day"})
    answers: list = []
    lock = threading.Lock()
    stop = threading.Event()

    def hammer():
        session = requests.Session()
        headers = {"X-API-Key": secret, "Connection": "close"}
        while not stop.is_set():
            try:
                reply = session.get(f"{master.base}/q/{query.name}", headers=headers, timeout=20)
                answer = (reply.status_code, None if reply.status_code == 200 else reply.json().get("code"))
            except (requests.RequestException, ValueError) as exc:
                answer = (0, type(exc).__name__)
            with lock:
                answers.append((time.monotonic(), answer))
            time.sleep(0.02)      # paced clients: the load's shape, not a wait

    def admitted() -> int:
        with lock:
            return sum(1 for _, a in answers if a == (200, None))

    def spent_since(since: float) -> int:
        with lock:
            return sum(1 for at, a in answers if at > since and a == (429, "quota_exceeded"))

    pid = redis_pid(private_services)
    threads = [threading.Thread(target=hammer, daemon=True) for _ in range(16)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: admitted() >= 20, 30, 0.002, "20 admitted calls")
        before = admitted()
        stopped = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(5.0)       # a sleep that is the test: the stall
        finally:
            os.kill(pid, signal.SIGCONT)
        resumed = time.monotonic()
        during = admitted() - before
        # Hammered on until the quota is spent and refused many times over: what was admitted
        # past it would show by then.
        wait_until(lambda: spent_since(resumed) >= 200, 30, 0.05,
                   lambda: f"the quota spent: {admitted()} admitted, {spent_since(resumed)} refused since")
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)

    total = admitted()
    sql = private_services.sql
    key = key_ids(sql, [name])[name]
    history = admitted_in_history(sql, [key], {key: total})[key]
    client = private_services.redis_client()
    try:
        held = int(client.hget(f"gw:{{q:{key}}}:{quota_window('day')[0]}", "calls") or 0)
    finally:
        client.close()
    codes = {a[1] for _, a in answers if a[0] != 200}
    print(f"stalled {resumed - stopped:.1f}s: {before} admitted before, {during} during, "
          f"{total - before - during} after: {total} of {calls}; Redis's counter {held}; refusals {sorted(map(str, codes))}")
    assert total <= calls, f"{total} calls admitted against a quota of {calls} ({during} while Redis was stalled)"
    assert held >= total, f"{total} admitted, Redis's counter {held}"
    assert history == total, (history, total)
    assert codes <= REFUSALS, codes
