"""The cache across a real gunicorn master (4 workers, the Redis purge bus and the shared
tier): purges and writes reach every worker before they are answered, under load, and a
worker that misses fills from another's answer instead of the database."""
from __future__ import annotations

import re
import threading
import time

import pytest
import requests

from helpers.load import Load, statuses, until_each_made
from helpers.util import METRICS_AUTH, unique, wait_until


@pytest.fixture
def table(superuser):
    name = unique("cache_f").replace("-", "_")
    superuser(f"CREATE TABLE {name} (id int PRIMARY KEY, v bigint)", db="demo")
    superuser(f"INSERT INTO {name} VALUES (1, 0)", db="demo")
    yield name
    superuser(f"DROP TABLE IF EXISTS {name}", db="demo")


def cold_call(base: str, path: str, secret: str) -> requests.Response:
    """A call on a new connection: the master's shared socket hands it to any worker."""
    return requests.get(base + path, headers={"X-API-Key": secret, "Connection": "close"}, timeout=10)


def test_a_worker_that_misses_fills_from_another_workers_answer(fleet_api, master, table):
    api = fleet_api
    connection = api.connection()
    query = api.query(f"SELECT v FROM {table} WHERE id = 1", connection=connection, cache_ttl=60)
    secret = api.key([query], [connection])
    # Which worker takes a new connection is the kernel's and the balancer's choice: call until a
    # worker other than the first has answered (its fill shows in the metrics), at most 600 calls.
    states, fills, metrics = [], 0.0, ""
    while fills < 1 and len(states) < 600:
        states += [cold_call(master.base, f"/q/{query}", secret).headers["X-Cache"] for _ in range(30)]
        metrics = requests.get(master.base + "/metrics", headers=METRICS_AUTH, timeout=10).text
        fills = sum(float(v) for v in re.findall(r"^gateway_cache_shared_fills_total (\S+)$", metrics, re.M))
    # One database call for the whole master: every other worker filled from Redis, then from memory.
    assert states.count("miss") == 1 and states.count("hit") == len(states) - 1, states
    assert fills >= 1, metrics[:2000]


def _loaded(master, path: str, secret: str, threads: int = 6) -> Load:
    return Load(master.base, path, secret, threads=threads, close=True, keep_bodies=True)


def test_a_purge_reaches_every_worker_before_it_returns_under_load(fleet_api, master, table, superuser):
    api = fleet_api
    connection = api.connection()
    query = api.query(f"SELECT v FROM {table} WHERE id = 1", connection=connection, cache_ttl=600)
    secret = api.key([query], [connection])
    answered = [(time.monotonic(), 0)]
    with _loaded(master, f"/q/{query}", secret) as load:
        for value in range(1, 31):
            until_each_made([load], 12, since=answered[-1][0])   # every worker serves the cached value meanwhile
            superuser(f"UPDATE {table} SET v = {value} WHERE id = 1", db="demo")   # outside the gateway
            reply = api.manage("DELETE", "/cache/entries", params={"query": query})
            answered.append((time.monotonic(), value))
            assert reply.status == 204 and "pending=0" in reply.headers["X-Cache-Invalidated"], reply.headers
        until_each_made([load], 12, since=answered[-1][0])
    calls = load.calls
    assert statuses(calls) == {(200, None): len(calls)}, statuses(calls)
    stale = []
    for call in calls:
        # A call sent after a purge returned must see at least the value written before that purge.
        floor = max((v for at, v in answered if at <= call.started), default=0)
        if call.body[0]["v"] < floor:
            stale.append((call.started, call.body, floor))
    assert len(calls) > 300 and not stale, (len(calls), stale[:5])


def test_a_write_through_the_gateway_reaches_every_worker_before_it_is_answered(fleet_api, master, table):
    api = fleet_api
    connection = api.connection()
    read = api.query(f"SELECT v FROM {table} WHERE id = 1", connection=connection, cache_ttl=600)
    write = api.query(f"UPDATE {table} SET v = :v WHERE id = 1", {"v": {"type": "int"}}, connection=connection)
    secret = api.key([read, write], [connection], allow_writes=True)
    answered, write_ms, purges = [(time.monotonic(), 0)], [], []
    with _loaded(master, f"/q/{read}", secret) as load:
        for value in range(1, 101):
            until_each_made([load], 4, since=answered[-1][0])    # reads between two writes
            sent = time.monotonic()
            reply = api.call(write, secret, {"v": str(value)})
            assert reply.status == 200 and reply.headers["X-Rows-Affected"] == "1", reply
            answered.append((time.monotonic(), value))
            write_ms.append((time.monotonic() - sent) * 1000)
            invalidated = dict(part.strip().split("=") for part in reply.headers["X-Cache-Invalidated"].split(";"))
            purges.append(invalidated)
        until_each_made([load], 12, since=answered[-1][0])
    calls = load.calls
    assert statuses(calls) == {(200, None): len(calls)}, statuses(calls)
    stale = [(c.started, c.body, f) for c in calls
             if c.body[0]["v"] < (f := max((v for at, v in answered if at <= c.started), default=0))]
    write_ms.sort()
    waited = sorted(float(p["ms"]) for p in purges)
    late = [p for p in purges if p.get("pending") != "0"]
    print(f"writes: p50 {write_ms[50]:.1f} ms, max {write_ms[-1]:.1f} ms; invalidation waited p50 {waited[50]:.1f} "
          f"ms, p99 {waited[98]:.1f} ms, max {waited[-1]:.1f} ms; {len(late)} of 100 answered with a worker pending; "
          f"reads {len(calls)}")
    # Each write was acknowledged by the live workers (the master's, and the test's own app on the same
    # Redis) before it answered, except when that took longer than GATEWAY_CACHE_WRITE_WAIT_MS (100 ms):
    # then the late worker dropped the entries within (its ack time - 100 ms) after the answer. On this
    # 2-core machine under the load above (and other suites) that happened to 0-8 writes in a hundred.
    assert all(int(p["acked"]) + int(p["pending"]) >= master.workers for p in purges), purges[:3]
    assert len(late) <= 25, late
    assert len(calls) > 300 and not stale, (len(calls), stale[:5])


def test_cache_entries_lists_the_shared_tier(fleet_api, master, table):
    api = fleet_api
    connection = api.connection()
    query = api.query(f"SELECT v FROM {table}", connection=connection, cache_ttl=60)
    secret = api.key([query], [connection])
    assert cold_call(master.base, f"/q/{query}", secret).status_code == 200
    items = api.ok("GET", "/cache/entries", params={"query": query}).json["items"]
    assert "shared" in {i["tier"] for i in items}, items
    api.ok("DELETE", "/cache/entries", params={"query": query})
    assert api.ok("GET", "/cache/entries", params={"query": query}).json["items"] == []
    assert cold_call(master.base, f"/q/{query}", secret).headers["X-Cache"] == "miss"


def scans_of(superuser, table: str, since) -> int:
    """The table's sequential scans. A backend reports its statistics when it ends, and an idle
    one otherwise only about 10 s later: the gateway's data sessions on the demo database opened
    since ``since`` (PostgreSQL's clock), the test's own pool's (a read heals on a fresh one),
    are ended first, and each has reported once it is gone."""
    ended = superuser("SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'demo' "
                      "AND application_name = 'gateway-fleet' AND backend_start >= %s", (since,))
    wait_until(lambda: not superuser("SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", ([p for p, _ in ended],)),
               10, 0.02, "the data sessions ended")
    return superuser(f"SELECT seq_scan FROM pg_stat_user_tables WHERE relname = '{table}'", db="demo")[0][0]


def test_concurrent_misses_in_one_worker_make_one_database_call(api, endpoint, superuser):
    """Single flight: 8 threads miss the same entry at once; the table is scanned once."""
    table = unique("cache_s").replace("-", "_")
    superuser(f"CREATE TABLE {table} (id int)", db="demo")
    (since,) = superuser("SELECT now()")[0]
    try:
        ep = endpoint(f"SELECT count(*) AS n, pg_sleep(0.3) AS slept FROM {table}", cache_ttl=60,
                      connection=api.connection())     # a pool of its own: its sessions are ended to count
        replies = []
        threads = [threading.Thread(target=lambda: replies.append(api.call(ep.query, ep.secret))) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(r.status == 200 for r in replies), replies[0]
        assert sorted(r.headers["X-Cache"] for r in replies) == ["miss"] * 8
        assert scans_of(superuser, table, since) == 1
        # The control: the same calls past the cache scan it once each.
        bypass = [threading.Thread(target=lambda: replies.append(api.call(ep.query, ep.secret, {"cache": "false"})))
                  for _ in range(8)]
        for t in bypass:
            t.start()
        for t in bypass:
            t.join()
        assert scans_of(superuser, table, since) == 9
    finally:
        superuser(f"DROP TABLE {table}", db="demo")


def test_locust_cached_scenario_finds_no_stale_answer(fleet_api, master, tmp_path, superuser):
    """loadtests' CachedReadWrite against the 4-worker master: every cached read after a user's own
    deposit shows the database's balance; no failure of any kind."""
    import csv
    import os
    import subprocess

    from helpers.ports import free_port
    from helpers.util import ADMIN_KEY, ROOT
    env = {**os.environ, "GATEWAY_ADMIN_KEY": ADMIN_KEY, "LOADTEST_CONNECTION": fleet_api.connection(),
           "LOADTEST_WRITE_CONNECTION": fleet_api.connection(unique("demo_writer")),
           "LOADTEST_KEY_PREFIX": f"cc{free_port()}", "LOADTEST_MAX_ID": "1000000"}
    try:
        run = subprocess.run([str(ROOT / ".venv/bin/locust"), "-f", "loadtests/locustfile.py", "--headless",
                              "-u", "8", "-r", "8", "-t", "8s", "--host", master.base, "--csv",
                              str(tmp_path / "run"), "--only-summary", "CachedReadWrite"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    finally:
        # The deposits (and the setup's probe deposit) changed the session's demo accounts: every balance
        # starts at 0 (pgbench's layout), and other tests read them.
        superuser("UPDATE pgbench_accounts SET abalance = 0 WHERE abalance <> 0", db="demo")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    with open(tmp_path / "run_stats.csv") as fh:
        rows = {row["Name"]: row for row in csv.DictReader(fh)}
    assert int(rows["Aggregated"]["Failure Count"]) == 0, rows
    assert int(rows["/q/deposit [cached]"]["Request Count"]) > 10, rows
    assert int(rows["/q/account_cached [cached]"]["Request Count"]) > 50, rows
    summary = re.search(r"cached reads: (\d+) hits, (\d+) misses, (\d+) stale", run.stderr + run.stdout)
    assert summary and int(summary.group(1)) > 0 and summary.group(3) == "0", run.stderr[-2000:]
