"""The cache's guarantee on a real gunicorn master (4 workers, the Redis purge bus and the shared
tier) under load: after a purge or a write through the gateway is answered, no worker serves
the older answer, when the write names a partition of the table the cached query reads, and
when a worker is killed (SIGKILL) in the middle of the purges."""
from __future__ import annotations

import os
import signal
import time

import requests

from helpers.load import Load, statuses, until_each_made
from helpers.util import unique


def stale_calls(calls, answered) -> list:
    """The calls sent after a change was answered that saw a value older than that change's."""
    return [(c.started, c.body, floor) for c in calls
            if c.body[0]["v"] < (floor := max((v for at, v in answered if at <= c.started), default=0))]


def test_a_write_to_a_partition_reaches_every_worker_reading_the_parent(fleet_api, master, superuser):
    parent = unique("cache_fp").replace("-", "_")
    superuser(f"CREATE TABLE {parent} (id int, v bigint) PARTITION BY LIST (id); "
              f"CREATE TABLE {parent}_1 PARTITION OF {parent} FOR VALUES IN (1); "
              f"INSERT INTO {parent} VALUES (1, 0)", db="demo")
    try:
        api = fleet_api
        connection = api.connection()
        read = api.query(f"SELECT v FROM {parent} WHERE id = 1", connection=connection, cache_ttl=600)
        write = api.query(f"UPDATE {parent}_1 SET v = :v WHERE id = 1", {"v": {"type": "int"}},
                          connection=connection)
        secret = api.key([read, write], [connection], allow_writes=True)
        answered = [(time.monotonic(), 0)]
        with Load(master.base, f"/q/{read}", secret, threads=6, close=True, keep_bodies=True) as load:
            for value in range(1, 41):
                until_each_made([load], 3, since=answered[-1][0])     # reads between two writes
                reply = api.call(write, secret, {"v": str(value)})
                assert reply.status == 200 and reply.headers["X-Rows-Affected"] == "1", reply
                assert "X-Cache-Invalidated" in reply.headers, reply.headers
                answered.append((time.monotonic(), value))
            until_each_made([load], 12, since=answered[-1][0])
        calls = load.calls
        assert statuses(calls) == {(200, None): len(calls)}, statuses(calls)
        stale = stale_calls(calls, answered)
        assert len(calls) > 100 and not stale, (len(calls), stale[:5])
    finally:
        superuser(f"DROP TABLE IF EXISTS {parent} CASCADE", db="demo")


def test_a_worker_killed_during_purges_neither_hangs_them_nor_lets_an_older_answer_out(fleet_api, master,
                                                                                       superuser):
    table = unique("cache_k").replace("-", "_")
    superuser(f"CREATE TABLE {table} (id int PRIMARY KEY, v bigint); INSERT INTO {table} VALUES (1, 0)", db="demo")
    try:
        api = fleet_api
        connection = api.connection()
        query = api.query(f"SELECT v FROM {table} WHERE id = 1", connection=connection, cache_ttl=600)
        secret = api.key([query], [connection])
        answered, waited = [(time.monotonic(), 0)], []
        with Load(master.base, f"/q/{query}", secret, threads=6, close=True, keep_bodies=True) as load:
            for value in range(1, 31):
                until_each_made([load], 4, since=answered[-1][0])     # reads between two purges
                if value == 10:
                    os.kill(master.worker_pids()[0], signal.SIGKILL)   # gunicorn starts another
                superuser(f"UPDATE {table} SET v = {value} WHERE id = 1", db="demo")   # outside the gateway
                sent = time.monotonic()
                try:
                    reply = api.manage("DELETE", "/cache/entries", params={"query": query})
                except requests.ConnectionError:   # its keep-alive connection was the killed worker's
                    reply = api.manage("DELETE", "/cache/entries", params={"query": query})
                waited.append(time.monotonic() - sent)
                answered.append((time.monotonic(), value))
                assert reply.status == 204, reply
            until_each_made([load], 12, since=answered[-1][0])
        calls = load.calls
        # A call the killed worker had taken fails with the connection; every other is answered.
        answers = [c for c in calls if c.status == 200]
        assert len(calls) - len(answers) <= 6, statuses(calls)
        stale = stale_calls(answers, answered)
        assert len(answers) > 100 and not stale, (len(answers), stale[:5])
        # A dead worker is waited for at most until its heartbeat runs out (the freshness lease, 1.5 s).
        assert max(waited) < 2.5, sorted(waited)[-3:]
        master.wait_ready(60)
    finally:
        superuser(f"DROP TABLE IF EXISTS {table}", db="demo")
