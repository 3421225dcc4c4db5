"""Quotas that survive Redis: Redis SIGKILLed (no persistence: it comes back empty) in the
middle of a key's quota period, on a real 3-worker gunicorn master, on a PostgreSQL and
Redis of this module's own (``private_services``).

A quota counter Redis does not hold is rebuilt from the run history before the key is
admitted again (``fleet.shared.quotas``: "Redis lost its data"), so a ``300 calls/day`` key with 200
spent is admitted at most 300 calls plus the calls in flight at the loss (admitted, and not
in the store's history when the counter was rebuilt), and every refusal is a typed 429
``quota_exceeded`` (or, while Redis is away and a worker's lease is spent, 503
``admission_unavailable``):

- a loss between calls (the key idle for a moment, as a restart at night): nothing is in
  flight, so exactly 300 calls; a ``3000 rows/day`` key stops at 3000 rows plus what the
  documented settling lag allows, not at 2000 + 3000;
- a loss under load (calls arriving all along): at most 300 plus the calls that can have
  been in flight (see ``in_flight_bound``).

Before the rebuild the counter restarted at 0 (measured on the build before it): the idle
test admitted 504 and 506 calls and 5200 and 5230 rows, the test under load 508 to 518 calls.
With it: 300 calls every time, 3110 to 3200 rows (bounds 3660 to 3760), and 310 to 322 calls
under load (bounds 378 to 384).
"""
from __future__ import annotations

import os
import signal
import time

import pytest

from helpers.api import Api
from helpers.history import key_id
from helpers.load import Load, most_in_window, statuses
from helpers.masters import Master
from helpers.procs import wait_gone
from helpers.util import wait_until

pytestmark = pytest.mark.slow

WORKERS = 3
LEASE_MS = 100
FLUSH_MS = 200          # GATEWAY_HISTORY_FLUSH_MS: how long an answered run may wait to be stored
FALLBACK_S = 0.25       # a worker that met Redis down decides locally this long (fleet.shared.leases)
MARGIN_S = 0.1          # a COPY, a call's own duration, scheduling on a loaded machine
SETTLE_S = 1.0          # past the fallback before calling again: a slow CI machine took more than 0.1 s
CALLS, SPENT = 300, 200
ROWS, ROWS_PER_CALL, ROWS_SPENT = 3000, 10, 2000
LOST = "test:quota-recovery:lost"   # set before the SIGKILL, gone after it
TYPED = {(200, None), (429, "quota_exceeded")}


@pytest.fixture(scope="module")
def master(private_services, tmp_path_factory):
    m = Master(private_services, tmp_path_factory.mktemp("quota-home"), workers=WORKERS, lease_ms=LEASE_MS,
               history_flush_ms=FLUSH_MS, redis_timeout_ms=500)
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
def connection(admin):
    return admin.connection()


def spend(base: str, path: str, secret: str, admitted: int, pause_s: float = 0.0) -> list:
    """Call under load until ``admitted`` calls were admitted; every call made."""
    load = Load(base, path, secret, threads=4, close=True, pause_s=pause_s)
    load.start()
    try:
        wait_until(lambda: sum(c.status == 200 for c in load.calls) >= admitted, 60, 0.002,
                   f"{admitted} admitted calls")
    finally:
        calls = load.stop()
    return calls


def sigkill_redis(services) -> tuple[float, float]:
    """SIGKILL the redis-server (no persistence: its data is gone) and start it again; when
    it was killed and when it answered again (monotonic)."""
    client = services.redis_client()
    try:
        client.set(LOST, 1)
        pid = int(services.redis.pid_file.read_text().split()[0])
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        assert wait_gone(pid, 10), "redis-server survived SIGKILL"
        services.redis.pid_file.unlink(missing_ok=True)
        services.redis.start()
        up = time.monotonic()
        assert not client.exists(LOST), "Redis came back with its data: the loss was not tested"
    finally:
        client.close()
    return killed, up


def until_refused(base: str, path: str, secret: str, pause_s: float = 0.0) -> list:
    load = Load(base, path, secret, threads=6, close=True, pause_s=pause_s, until_refused=("quota_exceeded", 1.0))
    load.start()
    return load.join(60)


def ok(calls) -> list:
    return [c for c in calls if c.status == 200]


def wait_stored(sql, key_name: str, admitted: int) -> None:
    """Until the store's history holds ``admitted`` admitted runs of the key."""
    key = key_id(sql, key_name)

    def stored() -> bool:
        return sql("SELECT count(*) FROM gw_run_history WHERE key_id = %s AND admitted", (key,))[0][0] >= admitted
    wait_until(stored, 10, 0.05, f"{admitted} runs of {key_name} in the history")


def test_a_loss_between_calls_loses_no_quota(master, admin, connection):
    one = admin.query("SELECT 1 AS v", connection=connection)
    ten = admin.query(f"SELECT g FROM generate_series(1, {ROWS_PER_CALL}) AS g", connection=connection)
    calls_key, calls_secret = admin.named_key([one], [connection], quota={"calls": CALLS, "per": "day"})
    rows_key, rows_secret = admin.named_key([ten], [connection], quota={"rows": ROWS, "per": "day"})
    rows_before = spend(master.base, f"/q/{ten}", rows_secret, ROWS_SPENT // ROWS_PER_CALL, pause_s=0.01)
    before = spend(master.base, f"/q/{one}", calls_secret, SPENT)
    sigkill_redis(admin.services)
    # The callers come back once every run is stored and no worker is on its local fallback
    # (one may have met Redis down): nothing is in flight.
    sql = admin.services.sql
    wait_stored(sql, calls_key, len(ok(before)))
    wait_stored(sql, rows_key, len(ok(rows_before)))
    # Waits out the product's local-fallback window (FALLBACK_S), which nothing outside a worker
    # shows ending, and SETTLE_S more for a loaded machine: the callers below must meet Redis.
    time.sleep(FALLBACK_S + SETTLE_S)
    after = until_refused(master.base, f"/q/{one}", calls_secret)
    # Rows callers paced (about 200 calls/s), so the settling lag is far below the 2000 rows
    # a counter restarted at 0 would add.
    rows_after = until_refused(master.base, f"/q/{ten}", rows_secret, pause_s=0.02)

    for calls in (before, rows_before, after, rows_after):
        assert set(statuses(calls)) <= TYPED, statuses(calls)
    assert statuses(after).get((429, "quota_exceeded")) and statuses(rows_after).get((429, "quota_exceeded"))
    admitted = len(ok(before + after))
    # Rows: refused once the rows known reach the quota; they can overshoot by the rows of
    # calls admitted and not yet settled (calls in progress, and those of the last two leases:
    # a worker settles its rows and learns the others' within L each).
    rows_ok = ok(rows_before + rows_after)
    rows = ROWS_PER_CALL * len(rows_ok)
    unsettled = most_in_window([c.ended for c in rows_ok], 2 * LEASE_MS / 1000) + 6
    print(f"calls: {len(ok(before))} before the SIGKILL, {len(ok(after))} after: {admitted} of {CALLS}; "
          f"rows: {ROWS_PER_CALL * len(ok(rows_before))} before, {rows} in all of {ROWS} "
          f"(bound {ROWS + ROWS_PER_CALL * unsettled})")
    assert admitted == CALLS, (admitted, statuses(after))
    assert ROWS <= rows <= ROWS + ROWS_PER_CALL * unsettled, (rows, unsettled, statuses(rows_after))


def in_flight_bound(calls, killed: float, up: float) -> int:
    """The calls that can have been admitted without being in the store's history when the
    first worker rebuilt the counter (at some R between ``up`` and ``up`` + FALLBACK_S, when
    the last worker's local fallback ends): runs of calls that ended less than one history
    flush before R (not yet written), those admitted by a worker's local fallback (Redis
    down, or up but that worker not yet back) and those spent from leases taken before the
    loss (spent within L of the kill). Every such call ended between one flush (and a
    margin) before Redis was back and the end of the fallback: counting every admitted call
    of that stretch over-counts (it includes the calls the rebuilt counter did count)."""
    start, end = min(killed, up - FLUSH_MS / 1000) - MARGIN_S, up + FALLBACK_S + MARGIN_S
    return sum(1 for c in ok(calls) if start < c.ended <= end)


def test_a_loss_under_load_admits_at_most_the_calls_in_flight(master, admin, connection, private_services):
    one = admin.query("SELECT 1 AS v", connection=connection)
    _, secret = admin.named_key([one], [connection], quota={"calls": CALLS, "per": "day"})
    # Paced callers (about 100 calls/s): the calls in flight at the loss are a few dozen, so
    # the bound is far below what a counter restarted at 0 admits (200 + 300).
    load = Load(master.base, f"/q/{one}", secret, threads=3, close=True, pause_s=0.02,
                until_refused=("quota_exceeded", 1.0))
    load.start()
    try:
        wait_until(lambda: len(ok(load.calls)) >= SPENT, 60, 0.002, f"{SPENT} admitted calls")
        killed, up = sigkill_redis(private_services)
    finally:
        calls = load.join(60)

    # While Redis is away a worker admits what it had leased, then answers 503 (fleet.shared.leases: a
    # quota is never exceeded): only in that stretch, when the restart outlasts the leases (a
    # loaded machine's restart took long enough).
    away = [c for c in calls if c.status == 503 and c.code == "admission_unavailable"
            and c.ended >= killed and c.started <= up + FALLBACK_S + MARGIN_S]
    assert set(statuses([c for c in calls if c not in away])) <= TYPED, statuses(calls)
    assert statuses(calls).get((429, "quota_exceeded")), statuses(calls)
    admitted = len(ok(calls))
    in_flight = in_flight_bound(calls, killed, up)
    print(f"under load: {len([c for c in ok(calls) if c.ended < killed])} admitted before the SIGKILL, "
          f"{admitted} in all of {CALLS}; Redis back after {up - killed:.3f}s; in flight at most {in_flight}")
    assert admitted <= CALLS + in_flight, (admitted, in_flight)
    assert admitted >= CALLS, admitted
