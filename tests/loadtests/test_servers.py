"""The servers comparison (loadtests/servers.py): its slow clients and /health prober against small
socket servers of the test's own (one that answers, one that never does, one that closes what it
is sent), and its report's arithmetic: ratios paired per round, judged on the worst, a stall shown
as a stall. (The harness itself runs against real servers: `python -m loadtests.servers --quick`.)"""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from loadtests import report, servers, servers_render, slowclients


class Listener:
    """A loopback TCP server on a thread: `mode` "answer" answers every request head with a 200,
    "silent" reads and never answers, "close" closes a connection once it has read its first bytes.
    `received` holds what each connection sent."""

    def __init__(self, mode: str):
        self.mode = mode
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=512)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self.lock = threading.Lock()
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket):
        index = None
        buf = b""
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                with self.lock:
                    if index is None:
                        index = len(self.received)
                        self.received.append(b"")
                    self.received[index] += data
                if self.mode == "close":
                    return
                buf += data
                while self.mode == "answer" and b"\r\n\r\n" in buf:
                    _, _, buf = buf.partition(b"\r\n\r\n")
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    def close(self):
        self.stopped = True
        self.sock.close()


@pytest.fixture
def listener(request):
    server = Listener(request.param)
    yield server
    server.close()


@pytest.mark.parametrize("listener", ["answer"], indirect=True)
def test_the_probe_times_every_answer(listener):
    got = slowclients.probe("127.0.0.1", listener.port, "/health", duration_s=0.3, timeout_s=1.0)
    assert got["answers"] > 10 and got["timeouts"] == 0 and got["errors"] == 0
    assert got["statuses"] == {"200": got["answers"]}
    assert 0 < got["p50_ms"] <= got["p99_ms"] <= got["max_ms"] < 1000
    assert len(listener.received) == 1      # one kept-alive connection for all of them


@pytest.mark.parametrize("listener", ["silent"], indirect=True)
def test_a_server_that_never_answers_is_a_stall_not_a_fast_answer(listener):
    started = time.monotonic()
    got = slowclients.probe("127.0.0.1", listener.port, "/health", duration_s=0.5, timeout_s=0.2)
    assert time.monotonic() - started < 1.5
    assert got["answers"] == 0 and got["timeouts"] >= 2
    assert got["p50_ms"] is None and got["p99_ms"] is None
    assert len(listener.received) == got["timeouts"]      # a new connection after each timeout


def test_timeouts_rank_above_every_answer():
    assert slowclients.ranked([1.0, 2.0, 3.0], 0) == {"p50_ms": 2.0, "p99_ms": 3.0, "max_ms": 3.0}
    assert slowclients.ranked([1.0] * 98, 2) == {"p50_ms": 1.0, "p99_ms": None, "max_ms": None}
    assert slowclients.ranked([1.0] * 99, 1) == {"p50_ms": 1.0, "p99_ms": 1.0, "max_ms": None}
    assert slowclients.ranked([], 0) == {"p50_ms": None, "p99_ms": None, "max_ms": None}


@pytest.mark.parametrize(("listener", "fate"), [("silent", "open"), ("close", "closed")], indirect=["listener"])
def test_the_holder_holds_partial_heads_until_released(listener, fate):
    with slowclients.Holder("127.0.0.1", listener.port, 40, cpu=None) as holder:
        assert holder.held["connected"] == 40 and holder.held["pending"] == 0
        deadline = time.monotonic() + 5
        while len(listener.received) < 40 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)      # the "close" server's closes reach the holder (its FINs: nothing to wait on from here)
    assert listener.received == [slowclients.PARTIAL_HEAD] * 40     # a head begun, never ended
    assert holder.released[fate] == 40
    assert sum(holder.released[k] for k in ("open", "closed", "answered", "reset")) == 40


def test_quick_is_one_short_round_and_unknown_servers_are_refused():
    quick = servers.parse_args(["--quick"])
    assert quick.rounds == 1 and quick.duration == quick.slow_duration == quick.c1_duration == 2
    assert quick.server_names == list(servers.DEFAULT_SERVERS)
    assert servers.parse_args(["--slow", "0,20,2000"]).slow_counts == [20, 2000]
    with pytest.raises(SystemExit):
        servers.parse_args(["--servers", "current,uvicorn"])


def _run(test, server, rnd, **fields):
    return {"kind": "run", "test": test, "server": server, "round": rnd, "ok": True, "problems": [],
            "bodies": {"checked": 10, "bad_body": 0, "unasked": 0}, "requests": 100,
            "latency_us": {"50": 1000}, **fields}


def _health(p99, timeouts=0):
    return {"answers": 10, "timeouts": timeouts, "p50_ms": None if p99 is None else p99 / 2, "p99_ms": p99}


def _records():
    runs = []
    for rnd, (base, other) in enumerate([(100, 150), (200, 220)], start=1):
        runs += [_run("lookup", "current", rnd, rps=base, cpu_us_per_call=500),
                 _run("lookup", "granian", rnd, rps=other, cpu_us_per_call=300)]
        for name in ("current", "granian"):
            runs.append(_run("health", name, rnd, health=_health(2.0)))
        runs.append(_run("slow-20", "current", rnd, slow_clients=20, held={"connected": 20},
                         released={"open": 20}, health=_health(None, 2), recovery_s=0.05,
                         lookup={"rps": 0, "bodies": {}}))
        runs.append(_run("slow-20", "granian", rnd, slow_clients=20, held={"connected": 20},
                         released={"closed": 20}, health=_health(3.0 if rnd == 1 else 5.0), recovery_s=0.0,
                         lookup={"rps": other * 0.95, "bodies": {}}))
    meta = {"block": "servers", "started_at": "2026-12-01T10:00:00+00:00",
            "settings": {"rounds": 2, "slow_counts": [20], "reference": "current"},
            "targets": [{"name": "current", "checks": {}}, {"name": "granian", "checks": {}}], "skipped": {}}
    return meta, runs


def test_the_report_pairs_rounds_and_judges_the_worst():
    meta, runs = _records()
    text = servers_render.render(meta, runs)
    # granian/current per round: 1.50 and 1.10
    assert "| `granian` | 185 [150-220] | 1.30× [1.10×-1.50×]; worst 1.10× |" in text
    assert "0.60× [0.60×-0.60×]; worst 0.60×" in text         # CPU per call, the highest is the worst
    slow = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| `") and " | 20 | " in line}
    assert "stalled in 2 of 2" in slow["| `current`"] and "stalled in every round; misses" in slow["| `current`"]
    # granian's p99 under 20 slow clients: 1.5x then 2.5x its quiet one; the worst round misses 2x
    assert "1.50×-2.50×]; worst 2.50×: misses" in slow["| `granian`"]
    assert "0.95× [0.95×-0.95×]; worst 0.95×: meets" in slow["| `granian`"]
    assert servers_render.page_name(meta) == "2026-12-01-servers.md"


def test_a_servers_run_renders_through_loadtests_report(tmp_path):
    meta, runs = _records()
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    written = report.write(tmp_path)
    assert written.read_text() == servers_render.render(meta, runs)
