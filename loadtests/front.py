"""The front under a flood of idle and slow connections (issue #25, part 1): does the fleet keep
serving well-behaved clients while N connections are held open against it?

    python -m loadtests.front [--connections 10000] [--rounds 3] [--duration 8] [--out FILE]

One `fleet up` on its embedded default in a home of its own: GATEWAY_WORKERS workers pinned to
the cores of --gateway-cpus; wrk, the attacker process, PostgreSQL and Redis on --client-cpus.
Each round measures two phases in alternating order (quiet first in odd rounds): **quiet** (no
attacker) and **flood** (the attacker holds --connections connections: a quarter each idle,
part of a head, a head and part of a body, a byte every 3 s; from 127.0.x.y addresses, at most
--per-address each; every connection the gateway closes is opened again at once). In each
phase, wrk -c32 calls the demo lookup (`/q/account?aid=<random>`, every body checked) and a
probe thread calls `/health` on its own kept-alive connection every 10 ms.

Reported per round: the lookup's req/s in the flood against quiet (the goal: at least 0.9x),
`/health` p99 and the lookup's p99 in the flood against quiet (the goal: at most 2x), the
worker CPU per call, the attacker's connections held and re-opened, and what the gateway's
front closed (gateway_front_closed_total by reason). Ratios are paired per round and judged
on the worst round.
"""
from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import re
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from loadtests import wrk
from loadtests.stats import percentile
from loadtests.system import CpuMeter, pin_tree, process_tree

ROOT = Path(__file__).resolve().parent.parent
KINDS = (b"", b"GET /q/account?aid=1 HTTP/1.1\r\nHost: x\r\n",
         b"POST /execute_sql HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n\r\n{\"sql\": ",
         b"G")     # the last kind sends one more byte of a head every TRICKLE_S
TRICKLE_S = 3.0
TRICKLE = b"ET /health HTTP/1.1\r\nHost: x\r\n"


# --- the attacker (its own process) ------------------------------------------------------------
def attack(port: int, count: int, per_address: int, ready: multiprocessing.Event, stop: multiprocessing.Event,
           stats: multiprocessing.Queue) -> None:
    """Hold ``count`` connections open; one closed by the server is opened again at once."""
    selector = selectors.DefaultSelector()
    held: dict[socket.socket, tuple[int, str, int]] = {}
    reopened = 0

    def open_one(n: int) -> None:
        address = f"127.0.{10 + n // (per_address * 250)}.{1 + (n // per_address) % 250}"
        sock = socket.socket()
        sock.setblocking(False)
        sock.bind((address, 0))
        try:
            sock.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        held[sock] = (n, address, 0)
        selector.register(sock, selectors.EVENT_WRITE)

    for n in range(count):
        open_one(n)
    ready_at = time.monotonic()
    next_trickle = time.monotonic() + TRICKLE_S
    signalled = False
    while not stop.is_set():
        for key, events in selector.select(0.2):
            sock = key.fileobj
            n, address, sent = held[sock]
            if events & selectors.EVENT_WRITE:           # connected: send its kind's bytes, then watch for the close
                try:
                    if KINDS[n % len(KINDS)]:
                        sock.send(KINDS[n % len(KINDS)])
                    selector.modify(sock, selectors.EVENT_READ)
                    continue
                except OSError:
                    pass
            else:
                try:
                    if sock.recv(65536):
                        continue
                except BlockingIOError:
                    continue
                except OSError:
                    pass
            selector.unregister(sock)
            sock.close()
            del held[sock]
            reopened += 1
            open_one(n)
        now = time.monotonic()
        if now >= next_trickle:
            next_trickle = now + TRICKLE_S
            for sock, (n, address, sent) in list(held.items()):
                if n % len(KINDS) == 3 and sent < len(TRICKLE):
                    try:
                        sock.send(TRICKLE[sent:sent + 1])
                        held[sock] = (n, address, sent + 1)
                    except OSError:
                        pass
        if not signalled and now - ready_at > 1.0:
            signalled = True
            ready.set()
    stats.put({"held": len(held), "reopened": reopened})
    for sock in held:
        sock.close()


# --- the well-behaved side -----------------------------------------------------------------------
class HealthProbe(threading.Thread):
    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.latencies: list[float] = []
        self.failures = 0
        self.running = threading.Event()
        self.running.set()

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        while self.running.is_set():
            started = time.perf_counter()
            try:
                conn.request("GET", "/health")
                response = conn.getresponse()
                body = response.read()
                if response.status != 200 or body != b'{"status":"ok"}':
                    self.failures += 1
                self.latencies.append(time.perf_counter() - started)
            except (OSError, http.client.HTTPException):
                self.failures += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            time.sleep(0.01)
        conn.close()


def front_closed(base: str, token: str) -> dict[str, float]:
    request = http.client.HTTPConnection(base.split("//")[1], timeout=10)
    request.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"} if token else {})
    text = request.getresponse().read().decode()
    return {reason: float(value) for reason, value in
            re.findall(r'^gateway_front_closed_total\{reason="([^"]+)"\} (\S+)$', text, re.M)}


def phase(args, port: int, key: str, worker_pids: list[int], flood: bool, base: str, token: str) -> dict:
    stop, ready = multiprocessing.Event(), multiprocessing.Event()
    stats: multiprocessing.Queue = multiprocessing.Queue()
    attacker = None
    if flood:
        attacker = multiprocessing.Process(target=attack, args=(port, args.connections, args.per_address,
                                                                  ready, stop, stats), daemon=True)
        attacker.start()
        os.sched_setaffinity(attacker.pid, {int(c) for c in args.client_cpus.split(",")})
        if not ready.wait(60):
            raise SystemExit("the attacker did not open its connections within 60 s")
        time.sleep(1.0)
    closed_before = front_closed(base, token)
    probe = HealthProbe(port)
    meter = CpuMeter(*worker_pids)
    meter.start()
    probe.start()
    result = wrk.run(f"{base}/q/account?aid=1", connections=32, duration_s=args.duration, cpu=args.client_cpus,
                     env={"API_KEY": key, "MAX_ID": "100000"})
    cpu = meter.stop() or 0.0
    probe.running.clear()
    probe.join()
    closed = {k: v - closed_before.get(k, 0.0) for k, v in front_closed(base, token).items()}
    attacker_stats = {}
    if attacker is not None:
        stop.set()
        attacker_stats = stats.get(timeout=30)
        attacker.join(30)
    problems = wrk.errors_of(result)
    return {"phase": "flood" if flood else "quiet", "rps": result.rps, "lookup_p50_ms": result.latency_us["50"] / 1e3,
            "lookup_p99_ms": result.latency_us["99"] / 1e3,
            "health_p50_ms": percentile(probe.latencies, 50) * 1e3, "health_p99_ms": percentile(probe.latencies, 99) * 1e3,
            "health_calls": len(probe.latencies), "health_failures": probe.failures,
            "cpu_us_per_call": cpu / max(1, result.requests) * 1e6, "problems": problems,
            "closed": {k: v for k, v in closed.items() if v}, **attacker_stats}


# --- the fleet -------------------------------------------------------------------------------------
def fleet_env(args, home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update({"GATEWAY_HOME": str(home), "GATEWAY_BIND": f"127.0.0.1:{args.port}",
                "GATEWAY_PG_PORT": str(args.pg_port), "GATEWAY_REDIS_PORT": str(args.redis_port),
                "GATEWAY_WORKERS": str(args.workers), "GATEWAY_CPUS": args.gateway_cpus,
                "GATEWAY_METRICS_TOKEN": "front-bench", "GATEWAY_LOG_LEVEL": "warning"})
    return env


def fleet(env: dict, *command: str) -> str:
    done = subprocess.run([sys.executable, "-m", "fleet.ops.cli", *command], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"fleet {' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def gateway_workers(home: Path) -> list[int]:
    masters = [int(p.read_text()) for p in (home / "run").glob("gunicorn-*.pid")]
    return [pid for pid in process_tree(*masters) if pid not in masters]


def render(rounds: list[list[dict]], args, commit: str) -> str:
    lines = [f"# The front under {args.connections:,} held connections ({time.strftime('%Y-%m-%d')})", "",
             f"`python -m loadtests.front --connections {args.connections} --rounds {args.rounds} "
             f"--duration {args.duration}` at {commit}: {args.workers} worker(s) on CPU {args.gateway_cpus}, wrk -c32 "
             f"(the demo lookup, bodies checked), the attacker, PostgreSQL and Redis on CPU {args.client_cpus}; "
             f"/health probed every 10 ms on its own connection. Flood: a quarter each idle, part of a head, "
             f"a head and part of a body, a byte every {TRICKLE_S:.0f} s; at most {args.per_address} per address; "
             "re-opened at once when closed.", "",
             "| round | lookup req/s quiet → flood (ratio) | lookup p99 ms | /health p99 ms | worker CPU µs/call | "
             "held / re-opened | front closed (flood) | problems |", "|---|---|---|---|---|---|---|---|"]
    worst = {"rps": None, "lookup_p99": None, "health_p99": None}
    for n, pair in enumerate(rounds, 1):
        quiet = next(p for p in pair if p["phase"] == "quiet")
        flood = next(p for p in pair if p["phase"] == "flood")
        ratio = flood["rps"] / quiet["rps"]
        lookup = flood["lookup_p99_ms"] / quiet["lookup_p99_ms"]
        health = flood["health_p99_ms"] / quiet["health_p99_ms"]
        for name, value, pick in (("rps", ratio, min), ("lookup_p99", lookup, max), ("health_p99", health, max)):
            worst[name] = value if worst[name] is None else pick(worst[name], value)
        problems = "; ".join(quiet["problems"] + flood["problems"]) or "none"
        if quiet["health_failures"] or flood["health_failures"]:
            problems += f"; /health failures {quiet['health_failures']}/{flood['health_failures']}"
        lines.append(f"| {n} | {quiet['rps']:,.0f} → {flood['rps']:,.0f} ({ratio:.2f}x) | "
                     f"{quiet['lookup_p99_ms']:.1f} → {flood['lookup_p99_ms']:.1f} ({lookup:.2f}x) | "
                     f"{quiet['health_p99_ms']:.1f} → {flood['health_p99_ms']:.1f} ({health:.2f}x) | "
                     f"{quiet['cpu_us_per_call']:.0f} → {flood['cpu_us_per_call']:.0f} | "
                     f"{flood.get('held', 0):,} / {flood.get('reopened', 0):,} | "
                     f"{', '.join(f'{k} {v:,.0f}' for k, v in sorted(flood['closed'].items())) or '-'} | {problems} |")
    lines += ["", f"Worst round: throughput in the flood **{worst['rps']:.2f}x** quiet (goal ≥ 0.9x), lookup p99 "
              f"**{worst['lookup_p99']:.2f}x**, /health p99 **{worst['health_p99']:.2f}x** (goal ≤ 2x).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--per-address", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--gateway-cpus", default="1")
    parser.add_argument("--client-cpus", default="0")
    parser.add_argument("--port", type=int, default=18431)
    parser.add_argument("--pg-port", type=int, default=25431)
    parser.add_argument("--redis-port", type=int, default=63831)
    parser.add_argument("--out", help="write the report here (default: print it)")
    args = parser.parse_args(argv)
    home = Path(tempfile.mkdtemp(prefix="front-bench-"))
    env = fleet_env(args, home)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    try:
        out = fleet(env, "up")
        key = re.search(r"X-API-Key: ([^']+)'", out).group(1)
        for pidfile in ("pg/postmaster.pid", "redis.pid"):
            path = home / pidfile
            if path.exists():
                pin_tree(int(path.read_text().split()[0]), args.client_cpus)
        workers = gateway_workers(home)
        base = f"http://127.0.0.1:{args.port}"
        rounds = []
        for n in range(args.rounds):
            order = (False, True) if n % 2 == 0 else (True, False)
            pair = [phase(args, args.port, key, workers, flood, base, "front-bench") for flood in order]
            for p in pair:
                print(json.dumps(p), flush=True)
            rounds.append(pair)
        report = render(rounds, args, commit)
        if args.out:
            Path(args.out).write_text(report)
        print(report)
    finally:
        fleet(env, "down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
