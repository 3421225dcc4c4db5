"""A master SIGKILLed behind nginx (``fleet up --instances 2``) while 16 keep-alive clients call
through nginx, every body checked: its orphaned workers (told by PR_SET_PDEATHSIG) stop
accepting at once, answer what they hold with ``Connection: close``, close their idle
kept-alive connections at once (nginx sends a GET that meets a closed upstream keep-alive
connection to another server: ``proxy_next_upstream error``) and exit within ``ORPHAN_EXIT_S``;
the supervisor's new master binds the port without waiting for them; no client sees an error.

Idle kept-alive connections are part of the test: a burst of 48 more clients before the kill
leaves nginx with more upstream connections than the 16 use, and 8 connections straight to the
victim's port sit idle after one call. Before the orphan's own exit (fleet/server/worker.py
``_close_idle``) the orphans held those for gunicorn's stop linger: closed 2.005-2.010 s after
the kill, orphans gone after 0.52-2.60 s (load average 17.6; the ``IDLE_CLOSED_S`` assertion
fails there); with it closed after 0.017 s, orphans gone after 0.26-1.20 s (load average 9-22).
nginx's own connections are drained by the traffic itself either way (each answer on them says
``Connection: close``, and nginx reuses the most recently freed one first). The new master did
not wait for the port in either: the orphans shut the listening socket down first, and a bound
socket that no longer listens does not block a ``SO_REUSEADDR`` bind.
"""
from __future__ import annotations

import os
import re
import select
import signal
import socket
import time

import pytest
import requests

from helpers.api import Api
from helpers.fleetup import started
from helpers.load import Load, statuses, until_each_made
from helpers.procs import child_pids, established_by_pid, running

CLIENTS = 16
BURST = 48
IDLE_POOL = 8      # idle keep-alive connections straight to the victim's port
# An orphan finishes the calls it holds (milliseconds), closes its parts (the run history is
# stored) and exits: 0.26-1.20 s measured at a load average of 9-22 on 2 cores, 2.10 s once in
# a full suite run beside another engineer's benchmark. The bound is there to catch orphans that
# linger for a keep-alive or graceful timeout (the issue measured 4.4-10.5 s); IDLE_CLOSED_S is
# the sharp assertion (2.0 s before the orphan's own exit, 0.02 s with it).
ORPHAN_EXIT_S = 4.0
IDLE_CLOSED_S = 0.5        # an idle kept-alive connection is closed within this of the kill
BIND_WAIT_MAX_S = 1.5      # the new master's wait for the port (fleet/server/listen.py BIND_WAIT_S = 10)
SAMPLE_S = 0.005


@pytest.fixture(scope="module")
def fleet(services, tmp_path_factory):
    with started(services, tmp_path_factory.mktemp("orphans-home")) as running_fleet:
        yield running_fleet


@pytest.fixture(scope="module")
def admin(fleet, services):
    api = Api.over_http(fleet.base, services)
    yield api
    api.close()


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def watch_orphans(orphans: list[int], idle_pool: list[socket.socket], killed: float,
                  timeout_s: float = 15) -> tuple[dict, dict]:
    """Seconds from ``killed`` until each orphan is gone, and until each connection of
    ``idle_pool`` is closed by the server ("eof"; "data" or "reset": not a clean close)."""
    gone: dict[int, float] = {}
    closed: dict[socket.socket, tuple[float, str]] = {}
    deadline = killed + timeout_s
    while (len(gone) < len(orphans) or len(closed) < len(idle_pool)) and time.monotonic() < deadline:
        waiting = [sock for sock in idle_pool if sock not in closed]
        readable = select.select(waiting, [], [], SAMPLE_S)[0] if waiting else time.sleep(SAMPLE_S) or []
        now = time.monotonic() - killed
        for sock in readable:
            try:
                closed[sock] = (now, "eof" if sock.recv(65536) == b"" else "data")
            except OSError:
                closed[sock] = (now, "reset")
        for pid in orphans:
            if pid not in gone and not running(pid):
                gone[pid] = now
    return gone, {sock.fileno(): at for sock, at in closed.items()}


def idle_connections(port: int, count: int) -> list[socket.socket]:
    """``count`` kept-alive connections to ``port``, each after one answered call, left idle
    (a balancer's pool after a peak: nginx keeps up to ``keepalive 64`` of them)."""
    made: list[socket.socket] = []
    shed = 0
    while len(made) < count:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = sock.recv(65536)
            assert chunk, reply
            reply += chunk
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        if b"connection: close" in head.lower():   # a worker over its share moved it (fleet/server/worker.py): another
            sock.close()
            shed += 1
            assert shed <= 4 * count, "every new connection was moved"
            continue
        length = int(re.search(rb"(?i)content-length: *([0-9]+)", head).group(1))
        while len(body) < length:        # the whole answer: the socket must be left with nothing to read
            chunk = sock.recv(65536)
            assert chunk, reply
            body += chunk
        made.append(sock)
    return made


def answers(base: str) -> bool:
    try:
        return requests.get(base + "/ready", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def bind_wait(log_text: str) -> float:
    """The new master's wait for the port (fleet/server/listen.py logs it when it had to wait)."""
    waits = [float(m) for m in re.findall(r"after waiting ([0-9.]+)s for the port", log_text)]
    return max(waits, default=0.0)


@pytest.mark.slow
def test_a_master_killed_behind_nginx_its_orphans_leave_at_once(fleet, admin):
    connection = admin.connection()
    query = admin.query("SELECT 7 AS v", connection=connection)
    _, secret = admin.named_key([query], [connection])
    victim = fleet.masters()[0]
    orphans = child_pids(victim)
    port = port_of(fleet.instances[0])
    log = fleet.home / "gunicorn-i0.log"
    log_at = log.stat().st_size
    load = Load(fleet.base, f"/q/{query}", secret, threads=CLIENTS, keep_bodies=True)
    # A burst first, so that nginx keeps more upstream connections than the 16 clients use:
    # idle ones, as after any peak (nginx reuses the most recently freed one first).
    burst = Load(fleet.base, f"/q/{query}", secret, threads=BURST, keep_bodies=True)
    with load:
        with burst:
            until_each_made([load, burst], 200)
        until_each_made([load], 30, since=time.monotonic())   # the burst's upstream connections idle in nginx
        held_before = established_by_pid(orphans, port)     # nginx's (and the clients') connections
        idle_pool = idle_connections(port, IDLE_POOL)
        load_average = os.getloadavg()[0]
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        gone, idle = watch_orphans(orphans, idle_pool, killed)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                master = fleet.masters()[0]
            except (OSError, ValueError):       # between the supervisor's start and gunicorn's pid file
                master = victim
            if master != victim and running(master) and len(child_pids(master)) == 4 and answers(fleet.instances[0]):
                break
            time.sleep(0.05)
        rebound = time.monotonic() - killed
        until_each_made([load], 50, since=time.monotonic())   # through both instances again
    for sock in idle_pool:
        sock.close()
    calls = load.calls + burst.calls
    with log.open() as f:
        f.seek(log_at)
        waited = bind_wait(f.read())
    after = [c for c in calls if c.started > killed]
    print(f"\nload average {load_average:.2f}; orphans held {held_before} connections on :{port}; "
          f"idle connections closed after {sorted((round(at, 3), how) for at, how in idle.values())} s, "
          f"gone after {sorted(round(v, 3) for v in gone.values())} s; the new master waited "
          f"{waited:.2f}s for the port and served on it after {rebound:.2f}s; {len(calls)} calls ({len(after)} after the kill): {statuses(calls)}")
    assert sum(held_before.values()) > 0, "nginx held no connection to the victim: nothing tested"
    assert len(after) > 200
    # Every call answered right, through the kill: nginx retries a GET that met a closed
    # upstream keep-alive connection, and the refused port sends new ones to instance 1.
    assert statuses(calls) == {(200, None): len(calls)}, statuses(calls)
    assert all(c.body == [{"v": 7}] for c in calls)
    assert len(gone) == len(orphans), f"orphans still running 15 s after the kill: {set(orphans) - set(gone)}"
    assert len(idle) == IDLE_POOL, f"idle connections still open 15 s after the kill: {idle}"
    assert {how for _, how in idle.values()} == {"eof"}, idle
    assert max(at for at, _ in idle.values()) <= IDLE_CLOSED_S, f"orphans held idle connections: {idle}"
    assert max(gone.values()) <= ORPHAN_EXIT_S, f"orphans gone after {gone}"
    assert rebound < 30 and fleet.masters()[0] != victim, "no new master served on the port within 30 s"
    assert waited <= BIND_WAIT_MAX_S, f"the new master waited {waited:.2f}s for the port"
