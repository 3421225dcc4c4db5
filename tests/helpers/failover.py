"""A Redis failover under load, the same for Redis Cluster and Sentinel: two gunicorn masters
on one distributed Redis (``GATEWAY_REDIS_FAILURE=open`` and ``closed``), keep-alive
clients on both calling one key with a rate limit and a quota, the failover, then a
management change that every call after it must see, and an ``/events`` stream that must
carry runs again. Every call is recorded (``helpers.load``); the test module asserts.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
import requests

from fleet.shared.rates import parse_bucket, rate_bucket
from helpers.api import Api
from helpers.events import Connection, EventStream
from helpers.history import key_id
from helpers.load import Call, Load, until_each_made
from helpers.masters import ALIVE, HOSTNAME, Master
from helpers.util import wait_until

LEASE_MS = 1500   # GATEWAY_FRESHNESS_LEASE_MS (the default): a heartbeat's lifetime
# Every worker leased and beat on the new master within this of the promotion: 0.8-1.3 s on a
# quiet 2-core machine, 3.2 s in a slow CI run (measured to the end of the look that saw it;
# now to its start); 11.6 s without fleet.shared.sentinel_watch, for a planned Sentinel failover.
SHARED_WITHIN_S = 6.0


@dataclass
class Failover:
    """What happened, in ``time.monotonic()`` seconds."""

    calls: dict[str, list[Call]]          # per master: "open", "closed"
    failed: float                          # the failover was started (kill, SENTINEL FAILOVER)
    promoted: float                        # the new master answered as master
    shared: float                          # seen: every worker leased and beat on the new master, /ready 200
    changed: float                         # the management change was sent ...
    returned: float                        # ... and returned
    events_after: int                      # runs of the key on a stream opened after the failover
    shared_look: float = 0.0               # when the look that found the fleet shared began
    missing: list = field(default_factory=list)   # (seconds after the first look, what) of the looks before it
    notes: dict = field(default_factory=dict)


def redis_ms(client) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def fleet_shared(redis_client, masters: list[Master], bucket: str, since_ms: int) -> str:
    """"" when every worker has written a heartbeat after ``since_ms`` (Redis time), some worker
    took a lease from ``bucket`` after it and every master answers /ready: the fleet works on
    the new master. Else what is still missing. A new client each time: an old connection may
    still reach the old master (Sentinel demotes a live one only seconds later)."""
    client = redis_client()
    try:
        beats = {k.decode(): int(v) for k, v in client.hgetall(ALIVE).items()}
        value = client.get(bucket)
        if value is None or parse_bucket(value)[1] < since_ms:
            return "no lease taken or report sent on the new master yet"
        for master in masters:
            for pid in master.worker_pids():
                if beats.get(f"{HOSTNAME}:{pid}", 0) < since_ms + LEASE_MS:
                    return f"worker {pid} has not beaten on the new master"
            ready = requests.get(master.base + "/ready", timeout=1)
            if ready.status_code != 200:
                return f"/ready {ready.status_code}: {ready.text[:200]}"
        return ""
    except (redis.RedisError, requests.RequestException) as exc:
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    finally:
        client.close()


def _until_shared(redis_client, masters: list[Master], bucket: str, since_ms: int,
                  timeout_s: float) -> tuple[float, float, list[tuple[float, str]]]:
    """When the look that found the fleet shared began and ended (a look under load takes a
    while: a new client, a /ready per master), and what each look before it found missing
    (seconds after the first look, what)."""
    started = time.monotonic()
    missing: list[tuple[float, str]] = []

    def look() -> tuple[float, float] | None:
        began = time.monotonic()
        reason = fleet_shared(redis_client, masters, bucket, since_ms)
        if reason:
            missing.append((round(began - started, 2), reason))
            return None
        return began, time.monotonic()
    began, ended = wait_until(look, timeout_s, 0.05,
                              lambda: f"the fleet to share its limits on the new master: {missing[-5:]}")
    return began, ended, missing


def failover_under_load(masters: dict[str, Master], admin: Api, redis_client: Callable[[], object],
                        fail: Callable[[], None], promoted: Callable[[], None],
                        pick_key: Callable[[int], bool] = lambda key: True,
                        bystander: Callable[[int], bool] | None = None) -> Failover:
    """``fail()`` starts the failover, ``promoted()`` returns once the new master serves;
    ``pick_key(id)``: whether a key's id suits the test (a cluster: its bucket on the master
    that will fail); ``bystander(id)``: a second key that suits it is called on the
    ``closed`` master too (its calls under ``"bystander"``: a cluster, its buckets on the
    masters that do not fail)."""
    connection = admin.connection()
    query = admin.query("SELECT 1 AS v", connection=connection)
    admin.ok("POST", f"/queries/{query}/versions",
             {"connection_name": connection, "sql": "SELECT 2 AS v", "parameters": {}, "publish": False})
    kid, secret = _key(admin, query, connection, pick_key)
    bucket = rate_bucket("key", kid)
    path = f"/q/{query}"
    loads = {mode: Load(m.base, path, secret, threads=3, keep_bodies=True) for mode, m in masters.items()}
    if bystander is not None:
        loads["bystander"] = Load(masters["closed"].base, path, _key(admin, query, connection, bystander)[1],
                                  threads=2, keep_bodies=True)
    client = redis_client()
    stream = EventStream(Connection(masters["open"].base))
    try:
        for load in loads.values():
            load.start()
        until_each_made(loads.values(), 25)
        failed = time.monotonic()
        fail()
        promoted()
        at_promotion = time.monotonic()
        since = wait_until(lambda: _redis_ms_or_none(client), 10, 0.02, "Redis time on the new master")
        shared_look, shared, missing = _until_shared(redis_client, list(masters.values()), bucket, since, 20)
        until_each_made(loads.values(), 12, since=shared)
        changed = time.monotonic()
        admin.ok("POST", f"/queries/{query}/publish", {"version": 2})
        returned = time.monotonic()
        until_each_made(loads.values(), 12, since=returned)
        # A stream opened now carries the key's runs: the event stream works on the new master.
        after = EventStream(Connection(masters["open"].base))
        try:
            events = after.wait(lambda evs: any(json.loads(e.data).get("key_id") == kid
                                                for e in evs if e.kind == "run"), 10, "runs after the failover")
            events_after = sum(1 for e in events if e.kind == "run" and json.loads(e.data).get("key_id") == kid)
        finally:
            after.close()
    finally:
        calls = {mode: load.stop() for mode, load in loads.items()}
        stream.close()
        client.close()
    return Failover(calls, failed, at_promotion, shared, changed, returned, events_after, shared_look, missing[-8:])


def _key(admin: Api, query: str, connection: str, suits: Callable[[int], bool]) -> tuple[int, str]:
    """A key with a rate limit whose id ``suits``: (id, secret). No quota: a quota is never
    exceeded, so without Redis it admits only what a worker had leased, then 503 in both modes
    (fleet.shared.leases); what a failover does to quotas: test_quota_rebuilt_when_the_promoted_replica_lagged."""
    for _ in range(60):
        # A limit well above what this machine serves: a refusal means "no Redis", not "too fast".
        name, secret = admin.named_key([query], [connection], rate_limit="5000/second")
        kid = key_id(admin.services.sql, name)
        if suits(kid):
            return kid, secret
    raise AssertionError("no key id suited the test")


def _redis_ms_or_none(client) -> int | None:
    try:
        return redis_ms(client)
    except redis.RedisError:
        return None


def report(result: Failover, what: str) -> str:
    """The numbers docs/failures.md quotes: how long each phase took, what clients saw."""
    lines = [f"{what}: promoted {result.promoted - result.failed:.2f}s after the fault, fleet shared again "
             f"{result.shared - result.failed:.2f}s after it; publish took {result.returned - result.changed:.3f}s"]
    if result.missing:
        lines.append(f"  missing before: {result.missing}")
    for mode, calls in result.calls.items():
        gap = [c for c in calls if result.failed <= c.started < result.shared]
        refused = [c for c in calls if c.status != 200]
        took = sorted(c.ended - c.started for c in gap) or [0.0]
        normal = sorted(c.ended - c.started for c in calls if c.ended < result.failed) or [0.0]
        span = (max(c.ended for c in refused) - min(c.started for c in refused)) if refused else 0.0
        lines.append(f"  {mode}: {len(calls)} calls, {len(refused)} not 200 over {span:.2f}s; during the failover "
                     f"{len(gap)} calls, p50 {took[len(took) // 2] * 1000:.0f} ms, p99 "
                     f"{took[int(len(took) * 0.99)] * 1000:.0f} ms, max {took[-1] * 1000:.0f} ms, "
                     f"{sum(t > 0.25 for t in took)} over 250 ms (before: p99 "
                     f"{normal[int(len(normal) * 0.99)] * 1000:.0f} ms)")
    return "\n".join(lines)
