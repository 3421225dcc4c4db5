"""The front (fleet/server/front.py, fleet/server/front_worker.py) through a real gunicorn master, as an attacker
would try it: connections that send part of a head or a body and then nothing (or a byte now
and then) hold no thread, are closed at their deadline and counted; malformed framing is one
400 and a closed connection, before the application or its key check; one address cannot
hold more than its share of connections being read; a body sent after ``100 Continue``, and
pipelined requests, still work."""
from __future__ import annotations

import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from helpers import raw
from helpers.api import Api
from helpers.masters import Master
from helpers.procs import established_by_pid, ran_for
from helpers.util import wait_until

HEAD_TIMEOUT_S = 1.5
PER_CLIENT = 24


@pytest.fixture(scope="module")
def master(services, tmp_path_factory, app):
    # 2 workers x 8 threads, as the embedded default: 16 held threads stopped it before.
    one = Master(services, tmp_path_factory.mktemp("front-master"), workers=2, threads=8,
                 head_timeout_s=HEAD_TIMEOUT_S, body_timeout_s=HEAD_TIMEOUT_S,
                 max_reading_per_client=PER_CLIENT, metrics_token="front-metrics")
    try:
        yield one.start(90)
    finally:
        one.stop()


@pytest.fixture(scope="module")
def api(master, services):
    api = Api.over_http(master.base, services)
    yield api
    api.close()


def closed_by_front(master: Master, reason: str) -> float:
    text = requests.get(master.base + "/metrics", headers={"Authorization": "Bearer front-metrics"}, timeout=10).text
    return sum(float(v) for v in re.findall(rf'^gateway_front_closed_total{{reason="{reason}"}} (\S+)$', text, re.M))


def wait_closed_by_front(master: Master, reason: str, before: float, count: int) -> None:
    """Until the front has counted ``count`` more closes for ``reason`` (the counts are written
    with the history's flush)."""
    wait_until(lambda: closed_by_front(master, reason) - before >= count, 10, 0.05,
               lambda: f"{count} closes for {reason}: {closed_by_front(master, reason) - before}")


def held_by_workers(master: Master) -> int:
    """The connections the master's workers hold now (accepted by the front)."""
    return sum(established_by_pid(master.worker_pids(), master.port).values())


def closed_count(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the server has closed (nothing is ever sent on the others)."""
    closed = 0
    for sock in socks:
        sock.settimeout(0.01)
        try:
            closed += sock.recv(1) == b""
        except TimeoutError:
            pass
        except ConnectionResetError:
            closed += 1
    return closed


def connect(master: Master, source: str = "127.0.0.1") -> socket.socket:
    return raw.connect(master.port, source)


def answer_of(sock: socket.socket, timeout: float = 5.0) -> bytes:
    return raw.until_closed(sock, timeout)


def timed_get(url: str) -> float:
    started = time.monotonic()
    assert requests.get(url, timeout=10).status_code == 200
    return time.monotonic() - started


SLOW_KINDS = [
    b"GET /health HTTP/1.1\r\nHost: x\r\n",                                         # part of a head
    b"POST /execute_sql HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"sql\"",  # a head, part of a body
    b"POST /q/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",    # part of a chunk
]


def test_slow_clients_hold_no_thread_and_are_closed_at_their_deadline(master, api):
    ep = api.endpoint("SELECT 1 AS one")
    before = closed_by_front(master, "timeout")
    held_before = held_by_workers(master)
    # 60 slow connections from several addresses (each under the per-client cap): today 16 such
    # connections held every thread of the 2 x 8, and /health hung for as long as they were held.
    slow = []
    for n in range(60):
        sock = connect(master, f"127.0.0.{10 + n % 5}")
        sock.sendall(SLOW_KINDS[n % len(SLOW_KINDS)])
        slow.append(sock)
    trickler = connect(master, "127.0.0.20")
    try:
        wait_until(lambda: held_by_workers(master) - held_before >= 61, 10, 0.02,
                   lambda: f"61 slow connections accepted: {held_by_workers(master) - held_before}")
        timings = []
        for n in range(10):
            timings.append(timed_get(master.base + "/health"))
            started = time.monotonic()
            assert api.call(ep.query, ep.secret).json == [{"one": 1}]
            timings.append(time.monotonic() - started)
            trickler.sendall(b"GET /health HTTP/1.1\r\n"[n:n + 1])     # a byte now and then
        assert max(timings) < 1.0, timings
        # Each one is answered 408 and closed at its deadline (a byte every 0.1 s does not extend it).
        started = time.monotonic()
        answers = [answer_of(sock, timeout=HEAD_TIMEOUT_S + 5) for sock in [*slow, trickler]]
        assert time.monotonic() - started < HEAD_TIMEOUT_S + 3
        assert all(a.startswith(b"HTTP/1.1 408 ") and b'"code":"request_timeout"' in a for a in answers), answers[:3]
    finally:
        for sock in [*slow, trickler]:
            sock.close()
    wait_closed_by_front(master, "timeout", before, 61)


@pytest.mark.parametrize("route, keyed", [("/q/{query}", False), ("/execute_sql", False), ("/execute_sql", True)])
@pytest.mark.parametrize("chunk", [b"zz\r\n", b"5;ext\nbad\r\n", b"-1\r\n", b"5\nhello"])
def test_malformed_chunked_bodies_get_one_400_and_a_closed_connection(master, api, route, keyed, chunk):
    ep = api.endpoint("SELECT 1 AS one")
    key = f"X-API-Key: {ep.secret}\r\n" if keyed else ""
    head = (f"POST {route.format(query=ep.query)} HTTP/1.1\r\nHost: x\r\n{key}Content-Type: application/json\r\n"
            f"Transfer-Encoding: chunked\r\n\r\n").encode()
    sock = connect(master)
    try:
        sock.sendall(head + chunk + b"hello\r\n0\r\n\r\n")
        answer = answer_of(sock)
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert answer.count(b"HTTP/1.1 ") == 1, answer                   # one request, one response
    assert b"Connection: close" in answer and b'"code":"malformed_request"' in answer


def test_one_address_cannot_hold_more_than_its_share(master):
    before = closed_by_front(master, "per_client")
    held = [connect(master, "127.0.0.30") for _ in range(2 * (PER_CLIENT * 2 + 4))]   # 2 workers, each its cap
    try:
        for sock in held:
            sock.sendall(b"GET /health HTTP/1.1\r\n")
        wait_until(lambda: closed_count(held) >= 2 * 4, 10, 0.05, lambda: f"8 closed: {closed_count(held)}")
        assert timed_get(master.base + "/health") < 1.0         # another address is served meanwhile
    finally:
        for sock in held:
            sock.close()
    wait_closed_by_front(master, "per_client", before, 8)


def test_a_body_sent_after_100_continue_and_pipelined_requests_are_served(master, api):
    ep = api.endpoint("SELECT 1 AS one")
    body = b'{"sql": "SELECT 2 AS two", "connection_name": "%s"}' % ep.connection.encode()
    sock = connect(master)
    try:
        sock.sendall(f"POST /execute_sql HTTP/1.1\r\nHost: x\r\nX-API-Key: {ep.secret}\r\n"
                     f"Content-Type: application/json\r\nExpect: 100-continue\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode())
        sock.settimeout(5)
        assert sock.recv(64) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body + f"GET /q/{ep.query} HTTP/1.1\r\nHost: x\r\nX-API-Key: {ep.secret}\r\n"
                            f"Connection: close\r\n\r\n".encode())
        answer = answer_of(sock)
    finally:
        sock.close()
    assert answer.count(b"HTTP/1.1 200 OK") == 2 and b"100 Continue" not in answer, answer
    assert b'"two":2' in answer and b'"one":1' in answer


def test_a_chunked_body_arriving_in_pieces_is_served(master, api):
    ep = api.endpoint("SELECT 1 AS one")
    body = b'{"sql": "SELECT 3 AS three", "connection_name": "%s"}' % ep.connection.encode()
    sock = connect(master)
    try:
        sock.sendall(f"POST /execute_sql HTTP/1.1\r\nHost: x\r\nX-API-Key: {ep.secret}\r\n"
                     f"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
                     f"Connection: close\r\n\r\n".encode())
        for at in range(0, len(body), 10):
            piece = body[at:at + 10]
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            time.sleep(0.02)      # a sleep that is the test: the pieces arrive apart
        sock.sendall(b"0\r\n\r\n")
        answer = answer_of(sock)
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 200 ") and b'"three":3' in answer, answer


def test_two_thousand_idle_and_slow_connections_leave_health_and_lookups_served(master, api):
    """Many connections held at once (idle, part of a head, part of a body) from many addresses:
    /health and a saved lookup stay fast; the soak's own size is a benchmark's (loadtests/front.py)."""
    ep = api.endpoint("SELECT 1 AS one")
    quiet = [timed_get(master.base + "/health") for _ in range(20)]
    held = []
    try:
        with ThreadPoolExecutor(8) as pool:
            held = list(pool.map(lambda n: connect(master, f"127.0.{1 + n // 200}.{2 + n % 200}"), range(2000)))
        for n, sock in enumerate(held):
            if n % 3:
                sock.sendall(SLOW_KINDS[n % len(SLOW_KINDS)])
        loaded = []
        for _ in range(20):
            loaded.append(timed_get(master.base + "/health"))
            assert api.call(ep.query, ep.secret).status == 200
        assert sorted(loaded)[-2] < max(0.25, 10 * sorted(quiet)[-2]), (quiet, loaded)
    finally:
        for sock in held:
            sock.close()


def test_health_and_ready_answer_while_every_thread_waits_on_the_database(master, api, superuser):
    """A slow database holds every request thread: /health and /ready (once its watcher runs)
    are answered on the loop, not behind them. Two connections, each with its bulkhead's share
    (6 of a worker's 8 threads), so that together they can hold all 16 threads."""
    slow = [api.endpoint("SELECT pg_sleep(5) IS NULL AS slept") for _ in range(2)]
    # Each worker's watcher has looked (it starts with the worker's loop, looking once a second).
    wait_until(lambda: all(ran_for(pid) > 1.5 for pid in master.worker_pids()), 10, 0.1, "workers up 1.5 s")
    with ThreadPoolExecutor(24) as pool:
        calls = [pool.submit(requests.get, f"{master.base}/q/{ep.query}", headers={"X-API-Key": ep.secret},
                             timeout=30) for ep in slow for _ in range(12)]
        wait_until(lambda: superuser("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'",
                                     db="demo")[0][0] >= 16, 10, 0.05, "16 calls in the database")
        running = sum(not call.done() for call in calls)
        assert running >= 16, [c.result().status_code for c in calls if c.done()]    # every thread held
        # Behind the threads each would wait about 4 s, until the first calls end.
        timings = [timed_get(master.base + path) for path in ("/health", "/ready") * 5]
        assert max(timings) < 1.0, timings
        statuses = [call.result().status_code for call in calls]
        assert set(statuses) <= {200, 503} and statuses.count(200) >= 16, statuses   # 503: connection_busy


@pytest.fixture(scope="module")
def capped(services, tmp_path_factory, app):
    """One worker, a cap in all of 30 connections, 8 being read per address, 127.0.0.40 a proxy."""
    one = Master(services, tmp_path_factory.mktemp("front-capped"), workers=1, max_connections=30,
                 max_reading_per_client=8, front_proxies="127.0.0.40", metrics_token="front-metrics")
    try:
        yield one.start(90)
    finally:
        one.stop()


def _still_open(socks: list[socket.socket]) -> int:
    open_now = 0
    for sock in socks:
        sock.settimeout(0.05)
        try:
            open_now += sock.recv(1) != b""
        except TimeoutError:
            open_now += 1
        except ConnectionResetError:
            pass
    return open_now


def test_at_the_cap_the_connection_read_the_longest_makes_room(capped):
    """60 slow connections from many addresses (none over its per-address share) against a cap of
    30: the oldest are closed as new ones come, so the worker never holds more than its cap, and
    a newcomer is served."""
    before = closed_by_front(capped, "evicted")
    held = []
    try:
        for n in range(60):
            sock = connect(capped, f"127.0.1.{10 + n}")
            sock.sendall(b"GET /health HTTP/1.1\r\n")
            held.append(sock)
            time.sleep(0.01)      # one after the other: which is the oldest is the test's
        wait_until(lambda: _still_open(held) <= 30, 10, 0.05, lambda: f"at most 30 open: {_still_open(held)}")
        assert _still_open(held[:20]) == 0                           # the oldest went first
        assert timed_get(capped.base + "/health") < 1.0
    finally:
        for sock in held:
            sock.close()
    wait_closed_by_front(capped, "evicted", before, 30)


def test_a_proxy_is_not_held_to_the_per_address_share(capped):
    """Behind a balancer every client has its address: 20 requests being read from the proxy's
    address are all kept; 20 from another address, only 8."""
    proxy = [connect(capped, "127.0.0.40") for _ in range(20)]
    other = [connect(capped, "127.0.0.41") for _ in range(20)]
    try:
        for sock in proxy + other:
            sock.sendall(b"GET /health HTTP/1.1\r\n")
        wait_until(lambda: _still_open(other) <= 8, 10, 0.05, lambda: f"8 of the other's open: {_still_open(other)}")
        assert _still_open(proxy) == 20
        assert _still_open(other) == 8
    finally:
        for sock in proxy + other:
            sock.close()
