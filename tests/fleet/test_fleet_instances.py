"""Two gateway instances (two gunicorn masters) behind a real nginx, as ``fleet up --instances 2``
starts them, on one PostgreSQL store and one Redis: calls reach both instances, and a key's rate
limit and its revocation hold across them. ``fleet down --keep-services`` stops them.

Which instance answered a call: the store's run history names the worker (``host:pid``), and
each worker's parent is its instance's master (its pid file under ``<home>/run``).
"""
from __future__ import annotations

import time

import pytest

from helpers.api import Api
from helpers.fleetup import LEASE_MS, started
from helpers.history import key_id, runs_by_worker
from helpers.load import Load, statuses, until_each_made
from helpers.util import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fleet(services, tmp_path_factory):
    with started(services, tmp_path_factory.mktemp("fleet-up-home")) as running_fleet:
        yield running_fleet


@pytest.fixture(scope="module")
def admin(fleet, services):
    api = Api.over_http(fleet.base, services)   # through nginx: either instance may take a management call
    yield api
    api.close()


def by_instance(fleet, sql, kid: int, expected_200: int) -> dict[int, dict]:
    """{instance index: {status: count}} from the run history, once ``expected_200`` 200s are in."""
    def settled():
        runs = runs_by_worker(sql, kid)
        return runs if sum(s.get(200, 0) for s in runs.values()) >= expected_200 else None
    runs = wait_until(settled, 5, 0.1, "the run history")
    owner = fleet.instance_of()
    out: dict[int, dict] = {}
    for worker, counts in runs.items():
        assert worker in owner, (worker, owner)   # every run was served by a worker of one of the two
        bucket = out.setdefault(owner[worker], {})
        for status, n in counts.items():
            bucket[status] = bucket.get(status, 0) + n
    return out


def test_calls_reach_both_instances_and_a_rate_limit_holds_across_them(fleet, admin, superuser):
    rate, burst, seconds = 40, 5, 4.0
    connection = admin.connection()
    query = admin.query("SELECT 1 AS v", connection=connection)
    name, secret = admin.named_key([query], [connection], rate_limit=f"{rate}/second", rate_limit_burst=burst)
    load = Load(fleet.base, f"/q/{query}", secret, threads=8)
    with load:
        time.sleep(seconds)      # a sleep that is the test: the window the limit is measured over
    calls = load.calls
    ok = [c for c in calls if c.status == 200]
    span = calls[-1].ended - calls[0].started
    bound = burst + rate * (span + LEASE_MS / 1000)
    print(f"two instances: {len(ok)} admitted of {len(calls)} in {span:.2f}s, bound {bound:.1f}")
    assert len(ok) <= bound, (len(ok), bound)
    assert len(ok) >= 0.8 * rate * span, (len(ok), span)
    assert set(statuses(calls)) == {(200, None), (429, "rate_limited")}, statuses(calls)
    runs = by_instance(fleet, superuser, key_id(superuser, name), len(ok))
    print("by instance:", runs)
    assert set(runs) == {0, 1}, runs
    assert all(runs[i].get(200, 0) >= 0.2 * len(ok) for i in (0, 1)), runs       # both admitted a share
    assert sum(r.get(200, 0) for r in runs.values()) == len(ok)


def test_revocation_holds_across_instances(fleet, admin, superuser):
    connection = admin.connection()
    query = admin.query("SELECT 1 AS v", connection=connection)
    name, secret = admin.named_key([query], [connection])
    kid = key_id(superuser, name)
    # Clients on nginx and on each instance directly.
    load = Load([fleet.base, *fleet.instances], f"/q/{query}", secret, threads=9, close=True)
    targets = [fleet.base, *fleet.instances]

    def calls_to_each(since: float) -> list[int]:
        return [sum(1 for c in load.calls if c.target == t and c.started > since) for t in targets]
    with load:
        until_each_made([load], 45)
        admin.ok("DELETE", f"/api-keys/{name}")
        returned = time.monotonic()
        wait_until(lambda: min(calls_to_each(returned)) > 10, 30, 0.05,
                   lambda: f"10 calls to each target after the delete: {calls_to_each(returned)}")
    calls = load.calls
    before = [c for c in calls if c.ended < returned]
    after = [c for c in calls if c.started > returned]
    assert sum(c.status == 200 for c in before) > 30, statuses(before)
    for target in [fleet.base, *fleet.instances]:
        mine = [c for c in after if c.target == target]
        assert len(mine) > 10, (target, len(mine))
        assert statuses(mine) == {(401, "unauthorized"): len(mine)}, (target, statuses(mine))
    runs = by_instance(fleet, superuser, kid, sum(c.status == 200 for c in calls))
    assert set(runs) == {0, 1} and all(runs[i].get(200) for i in (0, 1)), runs
