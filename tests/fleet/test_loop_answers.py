"""Calls answered from memory on the worker's loop (fleet/server/worker.py ``_answered_here``,
gateway/pipeline/from_memory.py) through a real gunicorn master with one worker: the loop
answers them (its counter in /metrics moves), every rule still applies at once (a narrowed,
revoked or limited key, a purge), and a client that does not read cannot hold the loop."""
from __future__ import annotations

import re
import socket
import threading
import time

import pytest
import requests

from helpers.api import Api
from helpers.masters import Master
from helpers.util import METRICS_AUTH, unique, wait_until

ROWS = 1000


@pytest.fixture(scope="module")
def master(services, tmp_path_factory, app):
    one = Master(services, tmp_path_factory.mktemp("loop-master"), workers=1, cache_max_bytes=256 << 20)
    try:
        yield one.start(90)
    finally:
        one.stop()


@pytest.fixture
def api(master, services):
    api = Api.over_http(master.base, services)   # one kept-alive connection
    yield api
    api.close()


@pytest.fixture
def table(superuser):
    name = unique("loop_t").replace("-", "_")
    superuser(f"CREATE TABLE {name} (id int PRIMARY KEY, email text, secret text)", db="demo")
    superuser(f"INSERT INTO {name} VALUES (1, 'a@x', 'alpha'), (2, 'b@x', 'beta'), (3, 'c@x', 'gamma')", db="demo")
    yield name
    superuser(f"DROP TABLE IF EXISTS {name}", db="demo")


def loop_answers_now(master: Master) -> float:
    text = requests.get(master.base + "/metrics", headers=METRICS_AUTH, timeout=10).text
    return sum(float(v) for v in re.findall(r"^gateway_loop_answers_total (\S+)$", text, re.M))


def loop_answers(master: Master) -> float:
    """gateway_loop_answers_total once the worker's metrics have caught up: they are written
    with the history, every flush (200 ms), and nothing shows that a flush came, so this waits
    one out (for a count to compare exactly: "as many as before", "one more")."""
    time.sleep(0.3)
    return loop_answers_now(master)


def at_least_more_loop_answers(master: Master, before: float, more: int) -> None:
    """Until gateway_loop_answers_total is ``more`` past ``before``."""
    wait_until(lambda: loop_answers_now(master) - before >= more, 10, 0.05,
               lambda: f"{more} more loop answers: {loop_answers_now(master) - before}")


def test_a_cached_call_on_a_kept_alive_connection_is_answered_on_the_loop(api, master, table):
    ep = api.endpoint(f"SELECT id, email FROM {table} ORDER BY id", cache_ttl=60)
    before = loop_answers(master)
    first = api.call(ep.query, ep.secret)
    answers = [api.call(ep.query, ep.secret) for _ in range(20)]
    assert first.status == 200 and first.headers["X-Cache"] == "miss"
    assert {(a.status, a.headers["X-Cache"], a.content) for a in answers} == {(200, "hit", first.content)}
    at_least_more_loop_answers(master, before, 19)      # all but (at most) the one after the first


def test_grants_masks_and_limits_apply_at_once_on_the_loop(api, master, table):
    ep = api.endpoint(f"SELECT id, secret FROM {table} ORDER BY id", cache_ttl=60)
    for _ in range(3):
        assert api.call(ep.query, ep.secret).json[0]["secret"] == "alpha"
    before = loop_answers(master)
    api.ok("PATCH", f"/api-keys/{ep.key}", {"mask": [{"column": f"{table}.secret", "action": "null"}]})
    masked = [api.call(ep.query, ep.secret) for _ in range(3)]
    assert all(m.headers["X-Cache"] == "hit" and [r["secret"] for r in m.json] == [None] * 3 for m in masked)
    api.ok("PATCH", f"/api-keys/{ep.key}", {"max_rows": 1, "mask": None})
    assert [len(api.call(ep.query, ep.secret).json) for _ in range(3)] == [1, 1, 1]
    other = api.endpoint("SELECT 1 AS one")
    api.ok("PATCH", f"/api-keys/{ep.key}", {"queries": [other.query], "connections": []})
    refused = [api.call(ep.query, ep.secret) for _ in range(3)]
    assert all(r.status in (403, 404) and b"alpha" not in r.content for r in refused), refused
    api.ok("PATCH", f"/api-keys/{ep.key}", {"queries": [ep.query], "connections": [ep.connection], "active": False})
    assert [api.call(ep.query, ep.secret).status for _ in range(3)] == [401] * 3
    api.ok("PATCH", f"/api-keys/{ep.key}", {"active": True, "max_rows": None})
    assert [api.call(ep.query, ep.secret).json[0]["secret"] for _ in range(3)] == ["alpha"] * 3
    at_least_more_loop_answers(master, before, 4)       # the loop answered some of them (the later hits)
    # A limited key is admitted through Redis: its calls go to a thread, and its limit holds.
    api.ok("PATCH", f"/api-keys/{ep.key}", {"rate_limit": "3/minute", "rate_limit_burst": 3})
    before = loop_answers(master)
    statuses = [api.call(ep.query, ep.secret).status for _ in range(6)]
    assert statuses.count(429) >= 3 and statuses.count(200) <= 3, statuses
    assert loop_answers(master) == before


def test_a_purge_is_seen_by_the_next_call_on_the_loop(api, master, table, superuser):
    ep = api.endpoint(f"SELECT email FROM {table} WHERE id = 1", cache_ttl=600)
    for _ in range(3):
        assert api.call(ep.query, ep.secret).json == [{"email": "a@x"}]
    superuser(f"UPDATE {table} SET email = 'changed@x' WHERE id = 1", db="demo")
    assert api.call(ep.query, ep.secret).json == [{"email": "a@x"}]            # outside the gateway: the TTL's
    api.ok("DELETE", f"/cache/entries?query={ep.query}")
    after = api.call(ep.query, ep.secret)
    assert after.headers["X-Cache"] == "miss" and after.json == [{"email": "changed@x"}]


def _raw_get(sock: socket.socket, path: str, secret: str) -> None:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\nX-API-Key: {secret}\r\n\r\n".encode())


def _read_answer(sock: socket.socket, buffered: bytearray) -> bytes:
    """One whole HTTP answer (Content-Length framed) from ``sock``."""
    while b"\r\n\r\n" not in buffered:
        buffered += sock.recv(65536)
    head, _, _ = bytes(buffered).partition(b"\r\n\r\n")
    framed = re.search(rb"(?i)content-length: (\d+)", head)
    length = int(framed.group(1)) if framed else 0    # a 304
    total = len(head) + 4 + length
    while len(buffered) < total:
        buffered += sock.recv(1 << 20)
    answer = bytes(buffered[:total])
    del buffered[:total]
    return answer


# What each answer makes anew: gunicorn's Date, the request id, the freshness headers.
_MADE_PER_CALL = re.compile(rb"(?im)^(date|x-request-id|age|cache-control): .*$")


def _exchange(head: bytes, port: int, times: int) -> list[bytes]:
    """``head`` sent ``times`` times on one new connection, each answer read before the next."""
    sock = socket.create_connection(("127.0.0.1", port))
    buffered = bytearray()
    try:
        answers = []
        for _ in range(times):
            sock.sendall(head)
            answers.append(_read_answer(sock, buffered))
        return answers
    finally:
        sock.close()


def _pipelined(head: bytes, port: int, times: int) -> list[bytes]:
    """``head`` sent ``times`` times at once on one new connection, then the answers read."""
    sock = socket.create_connection(("127.0.0.1", port))
    buffered = bytearray()
    try:
        sock.sendall(head * times)
        return [_read_answer(sock, buffered) for _ in range(times)]
    finally:
        sock.close()


@pytest.mark.parametrize("case", ["json", "csv", "304", "close"])
def test_the_loops_answer_is_the_threads_byte_for_byte(api, master, table, case):
    """Two requests sent at once on a connection: the first goes to a thread (the front hands a
    request with more behind it to a thread, and the pipeline answers it), the second, then
    alone, to the loop: the same bytes, but for what each answer makes anew."""
    ep = api.endpoint(f"SELECT id, email FROM {table} ORDER BY id", cache_ttl=600)
    target = f"/q/{ep.query}" + ("?format=csv" if case == "csv" else "")
    head = f"GET {target} HTTP/1.1\r\nHost: t\r\nX-API-Key: {ep.secret}\r\n"
    if case == "304":
        miss = _exchange(f"{head}\r\n".encode(), master.port, 1)[0]
        etag = re.search(rb"(?im)^etag: (.*)\r$", miss).group(1).decode()
        head += f"If-None-Match: {etag}\r\n"
    request = f"{head}\r\n".encode()
    _exchange(request, master.port, 1)                      # learned (a miss, or the 304's first)
    before = loop_answers(master)
    on_thread, on_loop = _pipelined(request, master.port, 2)
    assert loop_answers(master) - before == 1
    assert b"x-cache: hit" in on_thread and b"x-cache: hit" in on_loop
    assert on_thread.startswith(b"HTTP/1.1 304 " if case == "304" else b"HTTP/1.1 200 ")
    assert _MADE_PER_CALL.sub(b"", on_thread) == _MADE_PER_CALL.sub(b"", on_loop)
    assert len(_MADE_PER_CALL.findall(on_loop)) == 4
    if case == "close":   # a request asking to close, answered on the loop: the answer says so, and closes
        closing = f"{head}Connection: close\r\n\r\n".encode()
        _exchange(closing, master.port, 1)                  # learned
        sock = socket.create_connection(("127.0.0.1", master.port))
        try:
            buffered = bytearray()
            sock.sendall(request)
            _read_answer(sock, buffered)
            before = loop_answers(master)
            sock.sendall(closing)
            answer = _read_answer(sock, buffered)
            assert b"\r\nConnection: close\r\n" in answer and answer.endswith(b'"c@x"}]')
            assert sock.recv(1) == b""                      # and closed
            assert loop_answers(master) - before == 1
        finally:
            sock.close()


def test_a_client_that_does_not_read_cannot_hold_the_loop(api, master, table):
    big = api.endpoint(f"SELECT g AS n, repeat('x', 7000) AS pad FROM generate_series(1, {ROWS}) g", cache_ttl=600)
    small = api.endpoint(f"SELECT email FROM {table} WHERE id = 2", cache_ttl=600)
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # before connecting: the window it offers
    slow.connect(("127.0.0.1", master.port))
    buffered = bytearray()
    try:
        for _ in range(2):                       # learned by the worker, answered (and read) whole
            _raw_get(slow, f"/q/{big.query}?page_size={ROWS}", big.secret)
            whole = _read_answer(slow, buffered)
        before = loop_answers(master)
        for _ in range(3):                       # now asked on the loop, three times, and not read
            _raw_get(slow, f"/q/{big.query}?page_size={ROWS}", big.secret)
            time.sleep(0.2)      # one request at a time, each taken up by the loop (not a pipeline)
        # Meanwhile other clients' calls are answered at once: the loop is not waiting on `slow`.
        timings = []
        for _ in range(20):
            started = time.monotonic()
            assert api.call(small.query, small.secret).json == [{"email": "b@x"}]
            timings.append(time.monotonic() - started)
        assert max(timings) < 0.5, timings
        # `slow` reads at last: every answer whole and the same, in order.
        got = [_read_answer(slow, buffered) for _ in range(3)]
        body = whole.partition(b"\r\n\r\n")[2]
        assert whole.startswith(b"HTTP/1.1 200 ")
        assert all(g.partition(b"\r\n\r\n")[2] == body for g in got), [g[:300] for g in got]
        assert len(body) > 6_000_000              # more than the server's socket takes at once (4 MiB)
        at_least_more_loop_answers(master, before, 1)
    finally:
        slow.close()


def test_requests_sent_together_are_answered_in_order(api, master, table):
    ep = api.endpoint(f"SELECT email FROM {table} WHERE id = :id", {"id": "int"}, cache_ttl=600)
    sock = socket.create_connection(("127.0.0.1", master.port))
    buffered = bytearray()
    try:
        for aid in (1, 2, 3):
            _raw_get(sock, f"/q/{ep.query}?id={aid}", ep.secret)
            assert b'"email"' in _read_answer(sock, buffered)
        both = b"".join(f"GET /q/{ep.query}?id={aid} HTTP/1.1\r\nHost: t\r\nX-API-Key: {ep.secret}\r\n\r\n".encode()
                        for aid in (3, 1, 2))
        sock.sendall(both)
        got = [_read_answer(sock, buffered).partition(b"\r\n\r\n")[2] for _ in range(3)]
        assert got == [b'[{"email":"c@x"}]', b'[{"email":"a@x"}]', b'[{"email":"b@x"}]']
    finally:
        sock.close()


def test_a_half_sent_request_on_a_learned_connection_is_waited_for_on_a_thread(api, master, table):
    ep = api.endpoint(f"SELECT email FROM {table} WHERE id = 3", cache_ttl=600)
    sock = socket.create_connection(("127.0.0.1", master.port))
    buffered = bytearray()
    try:
        for _ in range(2):
            _raw_get(sock, f"/q/{ep.query}", ep.secret)
            _read_answer(sock, buffered)
        head = f"GET /q/{ep.query} HTTP/1.1\r\nHost: t\r\nX-API-Key: {ep.secret}\r\n\r\n".encode()
        sock.sendall(head[:20])
        answered = []
        waiter = threading.Thread(target=lambda: answered.append(api.call(ep.query, ep.secret).status))
        waiter.start()
        waiter.join(5)
        assert answered == [200]                   # the loop serves others while this one is half sent
        time.sleep(0.2)      # a sleep that is the test: the rest of the head comes later
        sock.sendall(head[20:])
        assert _read_answer(sock, buffered).endswith(b'[{"email":"c@x"}]')
    finally:
        sock.close()
