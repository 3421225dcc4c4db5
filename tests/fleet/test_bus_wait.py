"""The management side of the catalog bus against a real Redis, workers played by hand
(their heartbeats and acks written as the bus's own scripts write them): a call returns
only once every live worker acknowledged its generation or a later one; calls waiting at
once share one poller per process; a call trusts no poll older than its own publish."""
from __future__ import annotations

import threading
import time

import pytest
import redis

from fleet.shared import bus as bus_mod
from fleet.shared.bus import ACKS, ALIVE, RedisBus
from helpers.util import wait_until


@pytest.fixture
def fleet_redis(services):
    url = services.redis_url.rsplit("/", 1)[0] + "/7"   # a database of its own: no other fleet's workers
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url, client
    client.flushdb()
    client.close()


def live(client, worker: str, ack: int) -> None:
    (now_s, now_us) = client.time()
    client.hset(ALIVE, worker, int(now_s) * 1000 + now_us // 1000 + 60_000)
    client.hset(ACKS, worker, ack)


def test_concurrent_calls_each_wait_for_their_own_generation(fleet_redis, monkeypatch):
    url, client = fleet_redis
    live(client, "w1", 0)
    live(client, "w2", 0)
    announcer = RedisBus(url, lease_ms=5000, ping_ms=100, sync_timeout_ms=10_000)
    polls = []
    in_flight = [0, 0]   # now, most at once
    count_lock = threading.Lock()
    script = announcer._acks

    def counted(*args, **kwargs):
        with count_lock:
            polls.append(threading.current_thread().name)
            in_flight[0] += 1
            in_flight[1] = max(in_flight)
        try:
            time.sleep(0.001)   # a slow Redis (the test's): room for a second poller, if there were one
            return script(*args, **kwargs)
        finally:
            with count_lock:
                in_flight[0] -= 1
    monkeypatch.setattr(announcer, "_acks", counted)
    done: dict = {}

    def call(generation: int) -> None:
        done[generation] = (announcer.announce(generation), time.monotonic())
    threads = [threading.Thread(target=call, args=(g,), name=f"call-{g}") for g in (10, 11, 12, 13)]
    try:
        for t in threads:
            t.start()

        def polled_again(times: int = 3) -> None:
            """Until the acknowledgements were read ``times`` more: what they say has been seen."""
            seen = len(polls)
            wait_until(lambda: len(polls) >= seen + times, 5, 0.005, f"{times} more polls")
        polled_again()
        assert not done                                   # nobody acknowledged anything
        client.hset(ACKS, "w1", 12)
        polled_again()
        assert not done                                   # w2 still at 0
        client.hset(ACKS, "w2", 11)                       # covers 10 and 11, not 12 or 13
        wait_until(lambda: len(done) >= 2, 5, 0.01, "the calls of 10 and 11")
        polled_again()
        assert sorted(done) == [10, 11]
        client.hset(ACKS, "w2", 13)
        client.hset(ACKS, "w1", 13)
        for t in threads:
            t.join(5)
        assert sorted(done) == [10, 11, 12, 13]
        assert all(reply["workers"] == 2 and reply["pending"] == [] for reply, _ in done.values())
        # One poller at a time (whichever call it was, its polls answered the others).
        assert polls and in_flight[1] == 1, in_flight
    finally:
        for t in threads:
            t.join(5)
        announcer.close()


def test_a_call_trusts_no_poll_older_than_its_publish(fleet_redis):
    """The shared state says 'every live worker acknowledged 20', from a poll made before this
    call published 15: the call polls again (a worker may have come back since) and waits for
    the worker that has not acknowledged it."""
    url, client = fleet_redis
    live(client, "w1", 20)
    announcer = RedisBus(url, lease_ms=5000, ping_ms=100, sync_timeout_ms=600)
    try:
        assert announcer.announce(20)["pending"] == []      # the poll that saw 20
        live(client, "w2", 3)                              # back, behind
        reply = announcer.announce(15)
        assert reply["pending"] == ["w2"] and reply["workers"] == 2 and reply["waited_ms"] >= 500, reply
    finally:
        announcer.close()


def test_the_heartbeat_writes_back_a_lost_ack(fleet_redis):
    url, client = fleet_redis
    heartbeat = client.register_script(bus_mod._BUS_HEARTBEAT)
    heartbeat(keys=[ALIVE, ACKS], args=["w1", 5000, 7])
    assert client.hget(ACKS, "w1") == b"7"                # gone (pruned): written again
    client.hset(ACKS, "w1", 9)
    heartbeat(keys=[ALIVE, ACKS], args=["w1", 5000, 7])
    assert client.hget(ACKS, "w1") == b"9"                # present: left as it is
    heartbeat(keys=[ALIVE, ACKS], args=["w2", 5000, 0])
    assert client.hget(ACKS, "w2") is None                # nothing acknowledged yet: nothing written
