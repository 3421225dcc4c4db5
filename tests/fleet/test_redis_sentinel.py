"""The fleet on Redis Sentinel (a master, a replica, three sentinels,
``helpers.redis_topologies``), on the session's PostgreSQL: two real gunicorn masters
(``GATEWAY_REDIS_FAILURE=open`` and ``closed``) under load through two failovers, each
counting every status and checking every body:

- ``SENTINEL FAILOVER`` (planned: the old master is demoted, Sentinel closes its clients);
- the master SIGKILLed (found down after 1 s, ``down-after-milliseconds``, then promoted).

Through each: ``open`` answers every call 200, ``closed`` answers typed 503
``admission_unavailable`` with ``Retry-After`` and only during the gap, never a 500 nor a
dropped connection; then every worker leases and beats on the new master within 3 s of
the promotion (the clients follow ``+switch-master``: ``fleet.shared.sentinel_watch``), a change
made then is seen by every call after it returns, and the event stream carries runs.
"""
from __future__ import annotations

import pytest

from helpers.api import Api
from helpers.failover import SHARED_WITHIN_S, Failover, failover_under_load, report
from helpers.load import statuses
from helpers.masters import Master, stop_all
from helpers.redis_topologies import SentinelGroup

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    topology = SentinelGroup(tmp_path_factory.mktemp("sentinel")).start(wait=False)
    yield topology
    topology.stop()


@pytest.fixture(scope="module")
def masters(group, services, tmp_path_factory):
    made = {mode: Master(services, tmp_path_factory.mktemp(f"sentinel-{mode}"), workers=2, redis_client=group.client,
                         redis_url=group.url, redis_failure=mode, lease_ms=100, redis_timeout_ms=250).spawn()
            for mode in ("open", "closed")}
    try:
        for master in made.values():
            master.wait_ready(90)
        group.wait_known(20)   # found each other while the masters started
        yield made
    finally:
        stop_all(made.values())


@pytest.fixture(scope="module")
def admin(masters, services):
    api = Api.over_http(masters["open"].base, services)
    yield api
    api.close()


def check(result: Failover) -> None:
    for mode, calls in result.calls.items():
        allowed = {(200, None)} | ({(503, "admission_unavailable")} if mode == "closed" else set())
        assert set(statuses(calls)) <= allowed, (mode, statuses(calls))
        assert all(c.body in ([{"v": 1}], [{"v": 2}]) for c in calls if c.status == 200), mode
        before = [c for c in calls if c.ended < result.failed]
        assert len(before) > 20 and all(c.status == 200 for c in before), (mode, statuses(before))
        refused = [c for c in calls if c.status == 503]
        assert all(c.headers.get("Retry-After") == "1" for c in refused)
        late = [(round(c.started - result.failed, 3), round(c.ended - result.shared, 3)) for c in refused
                if not (result.failed <= c.ended <= result.shared + 0.5)]
        assert not late, (mode, late[:10], len(late))
        back = [c for c in calls if c.started > result.shared and c.ended < result.changed]
        assert len(back) > 10 and all(c.status == 200 for c in back), (mode, statuses(back))
        after = [c for c in calls if c.started > result.returned]
        assert len(after) > 10 and all(c.status == 200 and c.body == [{"v": 2}] for c in after), \
            (mode, statuses(after))
    assert result.returned - result.changed < 1.0
    assert result.events_after > 0
    # Every worker on the new master soon after the promotion. Without fleet.shared.sentinel_watch a
    # planned failover took 11.6 s here: the connections open to the demoted master (alive,
    # still accepting writes until Sentinel reconfigures it) kept part of the fleet there.
    # The looks that found something missing say what it was.
    assert result.shared_look - result.promoted < SHARED_WITHIN_S, (result.shared_look - result.promoted,
                                                                    result.missing)


def test_planned_failover_under_load(group, masters, admin):
    new = group.other(group.sentinel_master())
    result = failover_under_load(masters, admin, group.client, fail=group.failover,
                                 promoted=lambda: group.wait_master(new, 20))
    print(report(result, "sentinel, SENTINEL FAILOVER"))
    group.wait_synced(group.other(new), 20)
    group.wait_known(20)
    check(result)


def test_master_killed_under_load(group, masters, admin):
    doomed = group.sentinel_master()
    new = group.other(doomed)
    result = failover_under_load(masters, admin, group.client, fail=doomed.kill,
                                 promoted=lambda: group.wait_master(new, 20))
    print(report(result, "sentinel, master SIGKILL"))
    doomed.start()   # it comes back as a replica of the new master (the sentinels reconfigure it)
    check(result)
