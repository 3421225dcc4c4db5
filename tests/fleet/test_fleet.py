"""The fleet as one gateway: one real gunicorn master with 4 workers (pinned, GATEWAY_CPUS=auto),
a real Redis and PostgreSQL, many concurrent HTTP clients.

- a key's rate limit holds across every worker within the documented bound
  ``burst + rate * (T + L)`` (``fleet.shared.leases``), and is not far below ``rate * T``;
- a calls quota admits exactly its calls across the fleet;
- once a revocation or a publish returns, no call started afterwards sees the old state.
"""
from __future__ import annotations

import time

import pytest
import requests

from helpers.api import Api
from helpers.history import key_id, runs_by_worker
from helpers.load import Load, statuses, until_each_made
from helpers.masters import Master
from helpers.util import wait_until

pytestmark = pytest.mark.slow

WORKERS = 4
LEASE_MS = 100


@pytest.fixture(scope="module")
def master(services, tmp_path_factory):
    m = Master(services, tmp_path_factory.mktemp("fleet-home"), workers=WORKERS, lease_ms=LEASE_MS)
    try:
        yield m.start()
    finally:
        m.stop()


@pytest.fixture(scope="module")
def admin(master, services):
    api = Api.over_http(master.base, services)
    yield api
    api.close()


@pytest.fixture(scope="module")
def connection(admin):
    return admin.connection()


def settled_runs(sql, key: int, expected: int, timeout_s: float = 5.0) -> dict:
    """The run history of a key once ``expected`` runs were written (history flushes every 200 ms)."""
    def done():
        by_worker = runs_by_worker(sql, key)
        return by_worker if sum(sum(s.values()) for s in by_worker.values()) >= expected else None
    return wait_until(done, timeout_s, 0.1, f"{expected} runs in the history")


def admitted_in_windows(ok_calls, window_s: float) -> int:
    """The most admitted calls certainly admitted inside one window of ``window_s``: a call was
    admitted between its start and its end, so count calls lying wholly inside the window."""
    best = 0
    ends = [c.ended for c in ok_calls]
    for i, first in enumerate(ok_calls):
        limit = first.started + window_s
        best = max(best, sum(1 for e in ends[i:] if e <= limit))
    return best


# --- rate limits ------------------------------------------------------------------------------
def test_rate_limit_holds_across_workers(master, admin, connection, superuser):
    rate, burst, seconds = 50, 10, 5.0
    query = admin.query("SELECT 1 AS v", connection=connection)
    name, secret = admin.named_key([query], [connection], rate_limit=f"{rate}/second", rate_limit_burst=burst)
    load = Load(master.base, f"/q/{query}", secret, threads=12)
    with load:
        time.sleep(seconds)      # a sleep that is the test: the window the limit is measured over
    calls = load.calls
    ok = [c for c in calls if c.status == 200]
    refused = [c for c in calls if c.status != 200]
    span = calls[-1].ended - calls[0].started
    lease = LEASE_MS / 1000
    bound = burst + rate * (span + lease)
    print(f"rate limit: {len(ok)} admitted, {len(refused)} refused in {span:.2f}s; bound {bound:.1f}, "
          f"floor {0.8 * rate * span:.1f}; windows " +
          ", ".join(f"{w}s: {admitted_in_windows(ok, w)}/{burst + rate * (w + lease):.0f}" for w in (0.25, 0.5, 1.0, 2.0)))
    assert len(ok) <= bound, f"{len(ok)} admitted in {span:.2f}s, bound {bound:.1f}"
    assert len(ok) >= 0.8 * rate * span, f"only {len(ok)} admitted in {span:.2f}s at {rate}/s"
    # The load was above the limit all along (at least 1.5 times it), so the bound was really
    # tested. 4 times it here; 2.5 times it in a CI run on a loaded machine, whose twelve
    # threads made fewer calls.
    assert len(refused) > len(ok) / 2, statuses(calls)
    # Sliding windows: no shorter stretch got more than its own bound either.
    for window in (0.25, 0.5, 1.0, 2.0):
        most = admitted_in_windows(ok, window)
        assert most <= burst + rate * (window + lease), (window, most)
    # Every refusal is a well-formed 429.
    assert {(c.status, c.code) for c in refused} == {(429, "rate_limited")}, statuses(refused)
    for c in refused:
        assert int(c.headers["Retry-After"]) >= 1, c
        assert c.headers["X-RateLimit-Limit"] == str(rate), c
        assert int(c.headers["X-RateLimit-Remaining"]) >= 0, c
        assert int(c.headers["X-RateLimit-Reset"]) >= 0, c
    assert all(c.headers.get("X-RateLimit-Limit") == str(rate) for c in ok)
    # The limit was shared: more than one worker admitted calls.
    by_worker = settled_runs(superuser, key_id(superuser, name), len(calls))
    admitting = [w for w, s in by_worker.items() if s.get(200)]
    print("admitted by worker:", {w: s.get(200) for w, s in by_worker.items()})
    assert len(admitting) >= 2, by_worker


# --- quotas ------------------------------------------------------------------------------------------
def test_calls_quota_is_exact_across_workers(master, admin, connection, superuser):
    quota = 240
    query = admin.query("SELECT 1 AS v", connection=connection)
    name, secret = admin.named_key([query], [connection], quota={"calls": quota, "per": "day"})
    # Each client stops once it has seen only quota_exceeded for 5 leases.
    load = Load(master.base, f"/q/{query}", secret, threads=8, close=True,
                until_refused=("quota_exceeded", 5 * LEASE_MS / 1000))
    load.start()
    calls = load.join(60)
    ok = [c for c in calls if c.status == 200]
    refused = [c for c in calls if c.status != 200]
    assert len(ok) == quota, statuses(calls)
    assert {(c.status, c.code) for c in refused} == {(429, "quota_exceeded")}, statuses(refused)
    for c in refused:
        assert int(c.headers["Retry-After"]) >= 1, c
        assert int(c.headers["X-Quota-Reset"]) >= 1, c
    # The shared counter agrees, once every lease has been settled.
    usage = admin.ok("GET", "/usage/quotas").json["items"]
    mine = [u for u in usage if u["key"] == name]
    assert mine and mine[0]["calls_used"] == quota, mine
    by_worker = settled_runs(superuser, key_id(superuser, name), len(calls))
    assert sum(s.get(200, 0) for s in by_worker.values()) == quota
    assert len([w for w, s in by_worker.items() if s.get(200)]) >= 2, by_worker


# --- revocation ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["delete", "deactivate", "rotate"])
def test_revocation_holds_once_the_call_returns(master, admin, connection, superuser, how):
    query = admin.query("SELECT 1 AS v", connection=connection)
    name, secret = admin.named_key([query], [connection])
    kid = key_id(superuser, name)
    # A new connection per call spreads the calls over every worker.
    load = Load(master.base, f"/q/{query}", secret, threads=8, close=True)

    def serving() -> list:
        return [w for w, s in runs_by_worker(superuser, kid).items() if s.get(200)]
    with load:
        until_each_made([load], 60)
        wait_until(lambda: len(serving()) == WORKERS, 10, 0.1, lambda: f"every worker serving the key: {serving()}")
        if how == "delete":
            admin.ok("DELETE", f"/api-keys/{name}")
        elif how == "deactivate":
            admin.ok("PATCH", f"/api-keys/{name}", {"active": False})
        else:
            # No grace period: the old secret must stop everywhere when the call returns.
            new_secret = admin.ok("POST", f"/api-keys/{name}/rotate", {"grace_minutes": 0}).json["secret"]
        returned = time.monotonic()
        until_each_made([load], 60, since=returned)
    calls = load.calls
    before = [c for c in calls if c.ended < returned]
    after = [c for c in calls if c.started > returned]
    assert sum(c.status == 200 for c in before) > 50, statuses(before)
    assert len(after) > 50, statuses(after)
    assert statuses(after) == {(401, "unauthorized"): len(after)}, statuses(after)
    # Every worker served the key before: the revocation reached all of them. (Refused calls
    # of an unknown key are recorded without a key: count the 200s.)
    by_worker = settled_runs(superuser, kid, sum(c.status == 200 for c in calls))
    assert len([w for w, s in by_worker.items() if s.get(200)]) == WORKERS, by_worker
    if how == "rotate":
        reply = requests.get(master.base + f"/q/{query}", headers={"X-API-Key": new_secret}, timeout=10)
        assert reply.status_code == 200, reply.text


# --- publish, rollback, unpublish ------------------------------------------------------------------
def test_publish_and_rollback_hold_once_the_call_returns(master, admin, connection):
    query = admin.query("SELECT 1 AS v", connection=connection)
    admin.ok("POST", f"/queries/{query}/versions",
             {"connection_name": connection, "sql": "SELECT 2 AS v", "parameters": {}, "publish": False})
    _, secret = admin.named_key([query], [connection])
    load = Load(master.base, f"/q/{query}", secret, threads=8, close=True, keep_bodies=True)
    changes = []   # (started, returned, version served from then on; None: unpublished)
    with load:
        until_each_made([load], 12)
        for version in (2, 1, 2, 1, 2, 1, None):
            started = time.monotonic()
            if version is None:
                admin.ok("POST", f"/queries/{query}/unpublish")
            else:
                admin.ok("POST", f"/queries/{query}/publish", {"version": version})
            changes.append((started, time.monotonic(), version))
            until_each_made([load], 12, since=changes[-1][1])      # calls that must see it
    calls = load.calls
    assert statuses(c for c in calls if c.ended < changes[0][0]) == \
        {(200, None): sum(1 for c in calls if c.ended < changes[0][0])}
    for i, (_, returned, version) in enumerate(changes):
        next_start = changes[i + 1][0] if i + 1 < len(changes) else float("inf")
        seen = [c for c in calls if c.started > returned and c.ended < next_start]
        assert len(seen) >= 10, (i, version, len(seen))
        if version is None:
            assert statuses(seen) == {(404, "not_published"): len(seen)}, statuses(seen)
        else:
            wrong = [c for c in seen if c.status != 200 or c.body != [{"v": version}]]
            assert not wrong, (i, version, wrong[:3])
