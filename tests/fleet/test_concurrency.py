"""A key's ``max_concurrent`` across the fleet (fleet/shared/concurrency.py, the pipeline's admission
stage): the attack through real gunicorn workers, a worker SIGKILLed holding places, Redis
unreachable (open and closed), Redis losing the set, and a stream holding its place."""
from __future__ import annotations

import logging
import os
import signal
import threading
import time

import pytest
import redis
import requests

from fleet.shared.concurrency import RunningCalls, bucket
from fleet.shared.degraded import DegradedLog
from gateway.errors import GatewayError
from gateway.model.catalog import ApiKey
from helpers.masters import Master
from helpers.ports import free_port

SLOW_S = 4.0   # long enough for every call of an attack to arrive while the first ones still run


def a_key(key_id: int, maximum: int) -> ApiKey:
    return ApiKey({"id": key_id, "name": f"k{key_id}", "prefix": "", "secret_hash": b"", "expires_at": None,
                   "grants": {"max_concurrent": maximum}})


def running(services, client: redis.Redis, key_id: int) -> int:
    """Places of the key whose lease has not ended (Redis server time)."""
    seconds, micros = client.time()
    return client.zcount(bucket(key_id), seconds * 1000 + micros // 1000 + 1, "+inf")


def key_id(services, name: str) -> int:
    return services.sql("SELECT id FROM gw_api_keys WHERE name = %s", (name,))[0][0]


def calls(base: str, query: str, secret: str, n: int, params: dict) -> list[tuple[int, dict, dict, float]]:
    """``n`` calls started together; (status, body, headers, seconds until answered) each."""
    start = threading.Barrier(n)
    got: list = [None] * n

    def one(i: int) -> None:
        start.wait()
        began = time.monotonic()
        reply = requests.get(f"{base}/q/{query}", params=params, headers={"X-API-Key": secret}, timeout=60)
        got[i] = (reply.status_code, reply.json(), reply.headers, time.monotonic() - began)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


# --- RunningCalls on the test Redis -------------------------------------------------------------
def make(url: str, lease_ms: int = 3000, closed: bool = False, workers: int = 1) -> RunningCalls:
    client = redis.Redis.from_url(url, socket_timeout=0.25, socket_connect_timeout=0.25)
    log = DegradedLog(logging.getLogger("test.concurrency"), "deciding locally", 60)
    return RunningCalls(client, lease_ms, closed, lambda: workers, log)


def test_at_most_n_places_and_leave_frees_one(services):
    one, other = make(services.redis_url), make(services.redis_url)   # two workers
    key = a_key(900_001, 3)
    try:
        places = [one.enter(key), other.enter(key), one.enter(key)]
        for side in (one, other):
            with pytest.raises(GatewayError) as refused:
                side.enter(key)
            assert refused.value.status == 429 and refused.value.code == "too_many_concurrent"
            assert refused.value.headers == {"Retry-After": "1"}
            assert refused.value.extra == {"retry_after": 1, "max_concurrent": 3}
        other.leave(places[1])
        places[1] = one.enter(key)
        with pytest.raises(GatewayError):
            other.enter(key)
        for place in places:
            one.leave(place)
        assert running(services, services.redis_client(), key.id) == 0
    finally:
        one.close()
        other.close()


def test_a_worker_that_stops_renewing_loses_its_places_within_the_lease(services):
    dead, alive = make(services.redis_url, lease_ms=600), make(services.redis_url, lease_ms=600)
    key = a_key(900_002, 2)
    try:
        dead.enter(key)
        dead.enter(key)
        dead.close()                    # no more renewals: as a killed worker
        stopped = time.monotonic()
        with pytest.raises(GatewayError):
            alive.enter(key)
        held = 0
        while held < 2:     # both dead places run out (each on its own last renewal's lease)
            try:
                alive.enter(key)
                held += 1
            except GatewayError:
                assert time.monotonic() - stopped < 0.6 + 0.2 + 0.5, "places outlived their lease"
                time.sleep(0.02)
        # Renewed ones do not run out: the live worker's places hold past several leases (a
        # sleep that is the test: leases must pass).
        time.sleep(1.5)
        with pytest.raises(GatewayError):
            alive.enter(key)
    finally:
        alive.close()


def test_renewal_brings_back_places_redis_lost(services):
    side = make(services.redis_url, lease_ms=3000)
    key = a_key(900_003, 2)
    client = services.redis_client()
    try:
        side.enter(key)
        side.enter(key)
        client.delete(bucket(key.id))   # Redis lost its data
        assert running(services, client, key.id) == 0
        side.renew()
        assert running(services, client, key.id) == 2
        with pytest.raises(GatewayError):
            side.enter(key)
    finally:
        side.close()


def test_redis_unreachable_open_counts_the_workers_share_locally(services):
    dead_url = f"redis://127.0.0.1:{free_port()}/0"
    side = make(dead_url, workers=2)
    key = a_key(900_004, 5)            # share: 5 // 2 = 2 at once in this worker
    try:
        places = [side.enter(key), side.enter(key)]
        assert all(p.local for p in places)
        with pytest.raises(GatewayError) as refused:
            side.enter(key)
        assert refused.value.code == "too_many_concurrent"
        side.leave(places[0])
        side.enter(key)
        assert side.fallbacks == 4
        one = make(dead_url, workers=8)  # more workers than places: one each, never none
        try:
            one.enter(key)
            with pytest.raises(GatewayError):
                one.enter(key)
        finally:
            one.close()
    finally:
        side.close()


def test_redis_unreachable_closed_answers_503(services):
    side = make(f"redis://127.0.0.1:{free_port()}/0", closed=True)
    try:
        with pytest.raises(GatewayError) as refused:
            side.enter(a_key(900_005, 5))
        assert refused.value.status == 503 and refused.value.code == "admission_unavailable"
    finally:
        side.close()


# --- through gunicorn ---------------------------------------------------------------------------
def test_attack_lets_exactly_n_run(http, gunicorn, demo_connection, services):
    n = 3
    query = http.query("SELECT true AS slept FROM pg_sleep(:s)", {"s": "float"}, connection=demo_connection)
    name, secret = http.named_key([query], [], max_concurrent=n)
    got = calls(gunicorn.base, query, secret, 2 * n + 1, {"s": SLOW_S})
    ok = [g for g in got if g[0] == 200]
    refused = [g for g in got if g[0] == 429]
    assert len(ok) == n and len(refused) == n + 1, [(g[0], g[1]) for g in got]
    assert all(g[1] == [{"slept": True}] for g in ok)
    for _, body, headers, seconds in refused:
        assert body["code"] == "too_many_concurrent" and body["max_concurrent"] == n and body["retry_after"] == 1
        assert headers["Retry-After"] == "1"
        assert seconds < SLOW_S      # refused while the n ran, not after
    # Nothing leaked: every place given back, and n more run at once again.
    assert running(services, services.redis_client(), key_id(services, name)) == 0
    again = calls(gunicorn.base, query, secret, n, {"s": 0.2})
    assert [g[0] for g in again] == [200] * n


def test_a_stream_holds_its_place_until_its_last_row(http, gunicorn, demo_connection, services):
    query = http.query("SELECT g FROM generate_series(1, 200000) g", connection=demo_connection)
    name, secret = http.named_key([query], [], max_concurrent=1)
    stream = requests.get(f"{gunicorn.base}/q/{query}", params={"stream": "true", "format": "ndjson"},
                          headers={"X-API-Key": secret}, stream=True, timeout=30)
    assert stream.status_code == 200
    lines = stream.iter_lines()
    assert next(lines) == b'{"g":1}'           # the stream has begun; most of it is not read yet
    refused = requests.get(f"{gunicorn.base}/q/{query}", headers={"X-API-Key": secret}, timeout=30)
    assert refused.status_code == 429 and refused.json()["code"] == "too_many_concurrent"
    rows = 1 + sum(1 for _ in lines)
    assert rows == 200000
    deadline = time.monotonic() + 5
    while running(services, services.redis_client(), key_id(services, name)):
        assert time.monotonic() < deadline, "the stream's place was not given back"
        time.sleep(0.05)
    assert requests.get(f"{gunicorn.base}/q/{query}", headers={"X-API-Key": secret}, timeout=30).status_code == 200


def test_a_client_leaving_a_stream_gives_its_place_back(http, gunicorn, demo_connection, services):
    query = http.query("SELECT g FROM generate_series(1, 2000000) g", connection=demo_connection)
    name, secret = http.named_key([query], [], max_concurrent=1)
    stream = requests.get(f"{gunicorn.base}/q/{query}", params={"stream": "true", "format": "ndjson"},
                          headers={"X-API-Key": secret}, stream=True, timeout=30)
    assert stream.status_code == 200 and next(stream.iter_lines()) == b'{"g":1}'
    stream.close()                             # the client goes away mid-stream
    deadline = time.monotonic() + 10
    while running(services, services.redis_client(), key_id(services, name)):
        assert time.monotonic() < deadline, "the place of a stream its client left was not given back"
        time.sleep(0.05)


@pytest.mark.slow
def test_worker_sigkill_frees_its_places_within_the_lease(services, http, demo_connection, tmp_path):
    lease_s = 1.5
    master = Master(services, tmp_path / "home", workers=1, concurrency_lease_ms=int(lease_s * 1000)).start(90)
    try:
        query = http.query("SELECT true AS slept FROM pg_sleep(:s)", {"s": "float"}, connection=demo_connection)
        name, secret = http.named_key([query], [], max_concurrent=2)
        ident = key_id(services, name)
        client = services.redis_client()
        def hold() -> None:
            try:
                requests.get(f"{master.base}/q/{query}", params={"s": 8}, headers={"X-API-Key": secret}, timeout=30)
            except requests.ConnectionError:
                pass    # its worker is killed under it

        holders = [threading.Thread(target=hold) for _ in range(2)]
        for t in holders:
            t.daemon = True
            t.start()
        deadline = time.monotonic() + 10
        while running(services, client, ident) < 2:
            assert time.monotonic() < deadline, master.log_tail()
            time.sleep(0.02)
        reply = requests.get(f"{master.base}/q/{query}", params={"s": 0}, headers={"X-API-Key": secret}, timeout=30)
        assert reply.status_code == 429 and reply.json()["code"] == "too_many_concurrent"
        # Renewed while they run: still held after two leases (a sleep that is the test).
        time.sleep(2 * lease_s)
        assert running(services, client, ident) == 2
        [worker] = master.worker_pids()
        os.kill(worker, signal.SIGKILL)
        killed = time.monotonic()
        while running(services, client, ident):
            assert time.monotonic() - killed < lease_s + 0.5, "places outlived the killed worker's lease"
            time.sleep(0.02)
        master.wait_ready(90)   # gunicorn's replacement serves the key its two places again
        got = calls(master.base, query, secret, 2, {"s": 0.5})
        assert [g[0] for g in got] == [200, 200], got
    finally:
        master.stop()
