"""``fleet.shared.leases.LeasedAdmission`` against a real Redis, driven directly: several admissions
(one per simulated worker) from several threads each, sharing one bucket in Redis.

The documented bounds (module docstrings of ``fleet.shared.leases`` and ``fleet.shared.rates``): in any
window T, admitted <= burst + rate * (T + L); a calls quota never admits more than its calls;
quota leftovers go back to the shared counter. (Rate buckets alone: tests/fleet/test_rates.py.)
"""
from __future__ import annotations

import threading

import pytest
import redis

from fleet.shared.leases import LeasedAdmission
from gateway.errors import GatewayError
from gateway.model.limits import quota_window
from helpers.admission import FakeClock, a_key, hammer, most_inside, quota_bucket, settings
from helpers.ports import free_port


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


def test_redis_unreachable_quota_admits_only_what_is_leased(redis_url, rdb):
    """Redis gone with a lease in hand: the lease's calls, then 503, never a local share (a
    share was never reconciled with the counter: 139 calls of a 100-call quota admitted
    across a 5 s stall)."""
    clock = FakeClock()
    admission = LeasedAdmission(redis_url, settings(redis_url, redis_failure="open"), workers_hint=lambda: 1,
                                clock=clock)
    key = a_key(quota={"calls": 1000, "per": "day"})
    try:
        admission.admit_key(key)                  # the first lease: 1000 / 4 calls, one spent
        leased = int(rdb.hget(quota_bucket(key), "calls"))
        assert leased == 250
        admission.reach.failed(redis.ConnectionError("simulated"), quota_bucket(key))
        for _ in range(leased - 1):
            admission.admit_key(key)              # what the lease holds
        with pytest.raises(GatewayError) as refused:
            admission.admit_key(key)
        assert refused.value.status == 503 and refused.value.code == "admission_unavailable"
        clock.now += 0.3                          # Redis tried again: shared again
        admission.admit_key(key)
        assert int(rdb.hget(quota_bucket(key), "calls")) > leased
    finally:
        admission.close()


def test_redis_unreachable_closed_refuses_limited_keys_only():
    url = f"redis://127.0.0.1:{free_port()}/0"
    admission = LeasedAdmission(url, settings(url, redis_failure="closed"), workers_hint=lambda: 0)
    try:
        # No headroom (no heartbeat has counted the fleet): every call asks Redis, and is refused.
        for key in (a_key("100/second"), a_key(quota={"calls": 10, "per": "day"})):
            with pytest.raises(GatewayError) as refused:
                admission.admit_key(key)
            assert refused.value.status == 503 and refused.value.code == "admission_unavailable"
            assert refused.value.headers["Retry-After"] == "1"
        assert admission.admit_key(a_key()) == ()   # no limit: nothing to ask Redis
    finally:
        admission.close()


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
        clock.now += 301                            # the lease expired (GATEWAY_QUOTA_HOLD_S): its leftovers go nowhere
        admission.flush()
        assert not rdb.exists(bucket), "a hand-back alone must not create the bucket"
        assert spend_until_refused(admission, key) == 280
        assert len(history.reads) == 2 and admission.lost == 1
    finally:
        admission.close()
    assert int(rdb.hget(bucket, "calls")) == 300


def test_a_loss_drops_leftovers_of_the_lost_bucket_only(redis_url, rdb):
    """The bus heartbeat learns of a loss up to one beat late (``redis_lost_data``): by then a
    worker may hold a lease from the rebuilt bucket, whose calls are counted there and must
    not be dropped (the quota would then admit fewer than it allows); a lease from the bucket
    that is gone is dropped. (Dropping every leftover made a 300-call quota stop at 296-299
    under load in test_quota_recovery.)"""
    history = History()
    knobs = settings(redis_url, lease_ms=100, lease_max=64)
    stale, fresh = LeasedAdmission(redis_url, knobs, history=history), LeasedAdmission(redis_url, knobs, history=history)
    lost, rebuilt = a_key(quota={"calls": 300, "per": "day"}), a_key(quota={"calls": 300, "per": "day"})
    try:
        for admission in (stale, fresh):
            admission.admit_key(lost)               # both lease from the bucket about to be lost
        rdb.delete(quota_bucket(lost))              # Redis lost its data
        fresh.admit_key(rebuilt)                    # a lease from a bucket created after the loss
        for admission in (stale, fresh):
            admission.redis_lost_data()
        history.calls = 2                           # the history has the lost bucket's 2 calls
        # The lost bucket's leftovers are gone: its next call rebuilds it from the history.
        assert spend_until_refused(stale, lost) == 298
        # The rebuilt bucket's lease is intact: its 300 calls are all admitted.
        assert 1 + spend_until_refused(fresh, rebuilt) == 300
    finally:
        stale.close()
        fresh.close()


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
def test_history_unreachable_means_503(redis_url, rdb, mode):
    """The bucket cannot be created without the history: nothing is leased, so 503 in both
    modes (a quota is never exceeded), and the store is tried again after a second."""
    clock = FakeClock()
    history = History(calls=10)
    history.fail = True
    admission = LeasedAdmission(redis_url, settings(redis_url, redis_failure=mode), workers_hint=lambda: 2,
                                clock=clock, history=history)
    key = a_key(quota={"calls": 40, "per": "day"})
    try:
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
