"""``fleet.leases.LeasedAdmission`` against a real Redis, driven directly: several admissions
(one per simulated worker) from several threads each, sharing one bucket in Redis.

The documented bounds (module docstring of ``fleet.leases``): in any window T,
admitted <= burst + rate * (T + L); a calls quota never admits more than its calls; quota
leftovers go back to the shared counter; rate leftovers of an expired lease are dropped.
"""
from __future__ import annotations

import random
import threading
import time
from types import SimpleNamespace

import pytest
import redis

from fleet.leases import LeasedAdmission
from gateway.errors import GatewayError
from gateway.model.limits import Quota, Rate, quota_window
from gateway.settings import Settings
from helpers.util import free_port


@pytest.fixture
def redis_url(services):
    return services.redis_url


@pytest.fixture
def rdb(services):
    client = services.redis_client()
    yield client
    client.close()


class FakeClock:
    def __init__(self, start: float = 1000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now


def a_key(rate: str | None = None, burst: int | None = None, quota: dict | None = None):
    """What the admission reads of a catalog key; a fresh id, so a fresh bucket in Redis."""
    return SimpleNamespace(id=random.randrange(10**9, 10**12),
                           rate=Rate.parse(rate, burst) if rate else None,
                           quota=Quota.parse(quota) if quota else None)


def settings(redis_url: str, **knobs) -> Settings:
    return Settings(redis_url=redis_url, **knobs)


def hammer(admissions, key, threads_each: int, seconds: float, stop_when=None):
    """Call admit_key from ``threads_each`` threads per admission; returns the admitted calls as
    (before, after) monotonic times and the refusals by code."""
    admitted, refused = [], {}
    lock = threading.Lock()
    stop = threading.Event()

    def run(admission):
        mine, codes = [], {}
        refused_since = None
        while not stop.is_set():
            before = time.monotonic()
            try:
                admission.admit_key(key)
            except GatewayError as err:
                codes[err.code] = codes.get(err.code, 0) + 1
                refused_since = refused_since or before
                if stop_when is not None and before - refused_since > stop_when:
                    break
            else:
                mine.append((before, time.monotonic()))
                refused_since = None
            time.sleep(0.0002)
        with lock:
            admitted.extend(mine)
            for code, n in codes.items():
                refused[code] = refused.get(code, 0) + n

    threads = [threading.Thread(target=run, args=(a,)) for a in admissions for _ in range(threads_each)]
    for t in threads:
        t.start()
    if stop_when is None:
        time.sleep(seconds)
        stop.set()
    for t in threads:
        t.join(seconds + 30)
    stop.set()
    return sorted(admitted), refused


def most_inside(admitted, window_s: float) -> int:
    """The most calls certainly admitted inside one window (their whole [before, after] in it)."""
    best = 0
    for i, (start, _) in enumerate(admitted):
        limit = start + window_s
        best = max(best, sum(1 for _, after in admitted[i:] if after <= limit))
    return best


def test_rate_bound_holds_in_sliding_windows(redis_url):
    rate, burst, lease_ms, seconds = 200, 20, 50, 3.0
    knobs = settings(redis_url, lease_ms=lease_ms, lease_max=64)
    admissions = [LeasedAdmission(redis_url, knobs, workers_hint=lambda: 4) for _ in range(4)]
    key = a_key(f"{rate}/second", burst)
    try:
        admitted, refused = hammer(admissions, key, threads_each=3, seconds=seconds)
    finally:
        for a in admissions:
            a.close()
    span = admitted[-1][1] - admitted[0][0]
    lease = lease_ms / 1000
    assert len(admitted) <= burst + rate * (span + lease)
    assert len(admitted) >= 0.8 * rate * seconds, (len(admitted), refused)
    # The demand was over the rate all along (else the bound above is not tested): a slow
    # machine's twelve threads made fewer calls, never fewer than 10% over the rate.
    assert set(refused) == {"rate_limited"} and refused["rate_limited"] > 0.1 * len(admitted), refused
    for window in (0.05, 0.1, 0.25, 0.5, 1.0, 2.0):
        most = most_inside(admitted, window)
        assert most <= burst + rate * (window + lease), (window, most)
    # Every simulated worker got a share (the bucket is shared, not first come takes all).
    assert all(a.redis_calls > 0 for a in admissions)


def test_quota_never_over_admits_and_ends_exact(redis_url, rdb):
    calls = 500
    knobs = settings(redis_url, lease_ms=50, lease_max=64)
    admissions = [LeasedAdmission(redis_url, knobs, workers_hint=lambda: 4) for _ in range(4)]
    key = a_key(quota={"calls": calls, "per": "day"})
    try:
        # Each thread stops once it has been refused for 6 leases in a row.
        admitted, refused = hammer(admissions, key, threads_each=3, seconds=30, stop_when=0.3)
    finally:
        for a in admissions:
            a.close()
    assert len(admitted) == calls, refused
    assert set(refused) == {"quota_exceeded"}, refused
    period, _ = quota_window("day")
    assert int(rdb.hget(f"gw:{{q:{key.id}}}:{period}", "calls")) == calls


def test_rate_leftovers_of_an_expired_lease_are_dropped(redis_url, rdb):
    """Handing leftovers back would break the bound (see the test at the end): they are
    dropped, and the next lease is smaller."""
    clock = FakeClock()
    admission = LeasedAdmission(redis_url, settings(redis_url, lease_ms=100, lease_max=64), clock=clock)
    key = a_key("1/hour", 1000)   # refill negligible: the bucket moves only by leases
    bucket = f"gw:{{rl:key:{key.id}}}"
    try:
        for _ in range(20):
            admission.admit_key(key)   # leases of 2, 4, 8, 16: 30 taken, 20 spent
        leased = 1000 - float(rdb.hget(bucket, "tokens"))
        assert leased > 20, leased
        clock.now += 0.2               # past the lease
        admission.flush()
        assert float(rdb.hget(bucket, "tokens")) == pytest.approx(1000 - leased, abs=0.05)
        want_before = admission._lease(bucket).want
        admission.admit_key(key)       # a new lease, smaller than the last
        assert admission._lease(bucket).want < want_before
    finally:
        admission.close()
    assert float(rdb.hget(bucket, "tokens")) < 1000 - leased


def test_quota_leftovers_go_back_on_close(redis_url, rdb):
    clock = FakeClock()
    admission = LeasedAdmission(redis_url, settings(redis_url, lease_ms=100, lease_max=64), clock=clock)
    key = a_key(quota={"calls": 1000, "per": "month"})
    period, _ = quota_window("month")
    bucket = f"gw:{{q:{key.id}}}:{period}"
    try:
        for _ in range(20):
            admission.admit_key(key)
        assert int(rdb.hget(bucket, "calls")) > 20
    finally:
        admission.close()
    assert int(rdb.hget(bucket, "calls")) == 20


def test_redis_unreachable_open_admits_the_local_share():
    url = f"redis://127.0.0.1:{free_port()}/0"   # nothing listens there
    clock = FakeClock()
    admission = LeasedAdmission(url, settings(url, redis_failure="open"), workers_hint=lambda: 4, clock=clock)
    key = a_key("100/second", 40)
    try:
        admitted = 0
        with pytest.raises(GatewayError) as refused:
            for _ in range(100):
                admission.admit_key(key)
                admitted += 1
        assert admitted == 10                  # burst 40 shared by 4 workers
        assert refused.value.status == 429 and refused.value.code == "rate_limited"
        assert refused.value.headers["Retry-After"] == "1"
        clock.now += 0.2                       # 100/s / 4 = 25/s: 5 more tokens
        for _ in range(5):
            admission.admit_key(key)
        with pytest.raises(GatewayError):
            admission.admit_key(key)
        assert admission.fallbacks == 17
    finally:
        admission.close()


def test_redis_unreachable_closed_refuses_limited_keys_only():
    url = f"redis://127.0.0.1:{free_port()}/0"
    admission = LeasedAdmission(url, settings(url, redis_failure="closed"))
    try:
        for key in (a_key("100/second"), a_key(quota={"calls": 10, "per": "day"})):
            with pytest.raises(GatewayError) as refused:
                admission.admit_key(key)
            assert refused.value.status == 503 and refused.value.code == "admission_unavailable"
            assert refused.value.headers["Retry-After"] == "1"
        assert admission.admit_key(a_key()) == ()   # no limit: nothing to ask Redis
    finally:
        admission.close()


def test_redis_back_means_shared_again(redis_url, rdb):
    """After a failure the worker retries Redis within 250 ms and leases from the shared
    bucket again (the bucket appears in Redis)."""
    clock = FakeClock()
    admission = LeasedAdmission(redis_url, settings(redis_url, redis_failure="open"), clock=clock)
    key = a_key("100/second", 100)
    bucket = f"gw:{{rl:key:{key.id}}}"
    try:
        admission._redis_down(redis.ConnectionError("simulated"))
        admission.admit_key(key)
        assert admission.fallbacks == 1 and not rdb.exists(bucket)
        clock.now += 0.3
        admission.admit_key(key)
        assert rdb.exists(bucket) and admission.redis_calls == 1
    finally:
        admission.close()


def test_handed_back_leftovers_stay_within_the_documented_bound(redis_url):
    """Three workers, busy on the key before (their lease size grew to 256), each take one lease
    from a full bucket and go idle. The bucket refills to its burst before their leases expire;
    their flushers hand the leftovers back within one lease after expiry (the latest tick is
    2L after the take, the tick here is at 1.8L), while a fourth worker drains the bucket."""
    rate, burst, lease_s = 1000, 1024, 0.4
    knobs = settings(redis_url, lease_ms=int(lease_s * 1000), lease_max=256)
    key = a_key(f"{rate}/second", burst)
    bucket = f"gw:{{rl:key:{key.id}}}"
    clocks = [FakeClock(time.monotonic()) for _ in range(3)]
    idle = [LeasedAdmission(redis_url, knobs, clock=c) for c in clocks]
    busy = LeasedAdmission(redis_url, knobs)
    admitted, stop = [], threading.Event()

    def drain():
        while not stop.is_set():
            before = time.monotonic()
            try:
                busy.admit_key(key)
                admitted.append((before, time.monotonic()))
            except GatewayError:
                time.sleep(0.0002)
    try:
        for admission in idle:
            admission._lease(bucket).want = 256   # what a busy spell on this key leaves behind
        taken_at = time.monotonic()
        for admission, clock in zip(idle, clocks):
            clock.now = time.monotonic()
            admission.admit_key(key)              # takes 256, 192, 144 tokens, spends 1 each
        time.sleep(max(0.0, taken_at + 0.62 - time.monotonic()))   # the bucket is full again (592 ms)
        drainer = threading.Thread(target=drain)
        drainer.start()
        time.sleep(max(0.0, taken_at + 0.72 - time.monotonic()))
        for admission, clock in zip(idle, clocks):
            clock.now = time.monotonic()          # the flusher's tick, 1.8L after the take
            admission.flush()
        time.sleep(1.1)
        stop.set()
        drainer.join()
    finally:
        stop.set()
        for admission in idle + [busy]:
            admission.close()
    admitted.sort()
    window = 1.0
    assert most_inside(admitted, window) <= burst + rate * (window + lease_s)


# --- quotas that survive Redis losing its data ------------------------------------------------
class History:
    """What the run history says a key was admitted this period (``history=`` of the
    admission); records each read. ``fail``: the store is unreachable."""

    def __init__(self, calls: int = 0, rows: int = 0):
        self.calls, self.rows, self.fail = calls, rows, False
        self.reads: list = []
        self.lock = threading.Lock()

    def __call__(self, key_id: int, since: float) -> tuple[int, int]:
        with self.lock:
            self.reads.append((key_id, since))
        if self.fail:
            raise OSError("store unreachable (simulated)")
        return self.calls, self.rows


def quota_bucket(key, per: str = "day") -> str:
    return f"gw:{{q:{key.id}}}:{quota_window(per)[0]}"


def spend_until_refused(admission, key, most: int = 10_000) -> int:
    admitted = 0
    while admitted < most:
        try:
            admission.admit_key(key)
        except GatewayError as err:
            assert err.code == "quota_exceeded", err.code
            return admitted
        admitted += 1
    return admitted


def test_a_new_quota_bucket_starts_from_the_history(redis_url, rdb):
    history = History(calls=250, rows=7)
    admission = LeasedAdmission(redis_url, settings(redis_url, lease_ms=100), history=history)
    key = a_key(quota={"calls": 300, "per": "day"})
    try:
        assert spend_until_refused(admission, key) == 50
        # Read once, for this key, since the period began (not per call).
        start = quota_window("day")[1] - 86400
        assert history.reads == [(key.id, start)]
        assert int(rdb.hget(quota_bucket(key), "rows")) == 7
    finally:
        admission.close()
    assert int(rdb.hget(quota_bucket(key), "calls")) == 300


def test_a_lost_bucket_is_rebuilt_and_old_leftovers_do_not_count(redis_url, rdb):
    """Redis loses the bucket while this worker holds a lease from it: the next lease rebuilds
    the bucket from the history, and the old lease's leftovers are not handed back to the new
    one (they were never added to it), neither by a flush nor by the next lease."""
    clock = FakeClock()
    history = History()
    admission = LeasedAdmission(redis_url, settings(redis_url, lease_ms=100, lease_max=64), clock=clock,
                                history=history)
    key = a_key(quota={"calls": 300, "per": "day"})
    bucket = quota_bucket(key)
    try:
        for _ in range(20):
            admission.admit_key(key)
        assert int(rdb.hget(bucket, "calls")) > 20   # a lease with leftovers
        rdb.delete(bucket)                          # Redis lost its data
        history.calls = 20                          # ... the history has every call
        clock.now += 0.2                            # the lease expired: its leftovers go nowhere
        admission.flush()
        assert not rdb.exists(bucket), "a hand-back alone must not create the bucket"
        assert spend_until_refused(admission, key) == 280
        assert len(history.reads) == 2 and admission.lost == 1
    finally:
        admission.close()
    assert int(rdb.hget(bucket, "calls")) == 300


def test_a_rebuild_is_made_once_when_workers_race(redis_url, rdb):
    history = History(calls=100)
    knobs = settings(redis_url, lease_ms=50, lease_max=16)
    admissions = [LeasedAdmission(redis_url, knobs, history=history) for _ in range(4)]
    key = a_key(quota={"calls": 300, "per": "day"})
    try:
        admitted, refused = hammer(admissions, key, threads_each=3, seconds=30, stop_when=0.3)
    finally:
        for a in admissions:
            a.close()
    assert len(admitted) == 200, refused
    assert 1 <= len(history.reads) <= 4, history.reads    # at most one read per worker
    assert int(rdb.hget(quota_bucket(key), "calls")) == 300


def test_rows_settled_into_a_lost_bucket_rebuild_it(redis_url, rdb):
    clock = FakeClock()
    history = History(calls=3, rows=30)
    admission = LeasedAdmission(redis_url, settings(redis_url, lease_ms=100), clock=clock, history=history)
    key = a_key(quota={"rows": 100, "per": "day"})
    try:
        admission.admit_key(key)
        admission.settle(key, 10)
        admission.flush()
        assert int(rdb.hget(quota_bucket(key), "rows")) == 40
        rdb.delete(quota_bucket(key))
        history.rows = 40
        admission.settle(key, 5)
        admission.flush()
        assert int(rdb.hget(quota_bucket(key), "rows")) == 45
        assert admission.rows_left(key) == 55
    finally:
        admission.close()


@pytest.mark.parametrize("mode", ["open", "closed"])
def test_history_unreachable_means_the_redis_failure_mode(redis_url, rdb, mode):
    """The bucket cannot be created without the history: the worker decides as it does with
    Redis unreachable (its local share, or 503) and tries the store again after a second."""
    clock = FakeClock()
    history = History(calls=10)
    history.fail = True
    admission = LeasedAdmission(redis_url, settings(redis_url, redis_failure=mode), workers_hint=lambda: 2,
                                clock=clock, history=history)
    key = a_key(quota={"calls": 40, "per": "day"})
    try:
        if mode == "open":
            assert spend_until_refused(admission, key) == 20     # its half of the quota
        else:
            with pytest.raises(GatewayError) as refused:
                admission.admit_key(key)
            assert refused.value.status == 503 and refused.value.code == "admission_unavailable"
        assert len(history.reads) == 1 and not rdb.exists(quota_bucket(key))
        history.fail = False
        clock.now += 1.1
        admission.admit_key(key)
        assert len(history.reads) == 2 and int(rdb.hget(quota_bucket(key), "calls")) > 10
    finally:
        admission.close()
