"""The load tools run against a real fleet: locust headless for a few seconds (no failure
but the expected 429s, which its rate-limited scenario counts as successes), and a smoke
block of the benchmark harness. And loadtests/ stays a house of its own: no import cycle in
it, nothing of the product imports it, and the reports of the runs kept in docs/bench/raw/
render again from their raw data exactly as committed."""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from helpers.imports import arrows, cycles, import_graph
from helpers.ports import free_port
from helpers.util import ADMIN_KEY, ROOT, unique
from loadtests import report
from loadtests.scenarios import provision

SCENARIOS = ["PlainLookup", "GovernedLookup", "AccountPage", "RateLimited", "ChurnReader", "ManagementChurn"]


def test_deposit_runs_on_the_write_connection():
    """deposit is saved on the write connection (demo_writer: a role that may only run it); the
    reads stay on the read connection, and the writer key is granted both."""
    saved = provision.queries("reads", "writes")
    assert {name: q["connection_name"] for name, q in saved.items()} == {
        "account": "reads", "account_governed": "reads", "account_page": "reads", "deposit": "writes",
        "account_versioned": "reads", "account_cached": "reads"}
    granted = provision.keys("reads", "writes")
    assert granted["writer"]["connections"] == ["reads", "writes"]
    assert all(k["connections"] == ["reads"] for scenario, k in granted.items() if scenario != "writer")
    assert provision.keys("one", "one")["writer"]["connections"] == ["one"]


def test_connections_to_create_log_in_as_the_demo_roles(monkeypatch):
    for var in ("GATEWAY_DEMO_PG_USER", "GATEWAY_DEMO_PG_PASSWORD", "GATEWAY_DEMO_WRITER_PG_USER",
                "GATEWAY_DEMO_WRITER_PG_PASSWORD"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GATEWAY_DEMO_PG_HOST", "db")
    reads, writes = provision.connection_body("demo"), provision.connection_body("demo_writer", writer=True)
    assert (reads["user"], reads["password"]) == ("demo_reader", "${GATEWAY_DEMO_PG_PASSWORD}")
    assert (writes["user"], writes["password"]) == ("demo_writer", "${GATEWAY_DEMO_WRITER_PG_PASSWORD}")
    assert writes["host"] == "db" and writes["name"] == "demo_writer"
    monkeypatch.setenv("GATEWAY_DEMO_WRITER_PG_PASSWORD", "w")
    assert provision.connection_body("w", writer=True)["password"] == "w"


def test_locust_headless_against_the_fleet(gunicorn, demo_connection, api, tmp_path):
    # deposit goes to a connection of its own (fleet up's demo_writer), here another one to the demo database.
    env = {**os.environ, "GATEWAY_ADMIN_KEY": ADMIN_KEY, "LOADTEST_CONNECTION": demo_connection,
           "LOADTEST_WRITE_CONNECTION": api.connection(unique("demo_writer")),
           "LOADTEST_KEY_PREFIX": f"ci{free_port()}"}
    run = subprocess.run([str(ROOT / ".venv/bin/locust"), "-f", "loadtests/locustfile.py", "--headless",
                          "-u", "8", "-r", "8", "-t", "6s", "--host", gunicorn.base, "--csv", str(tmp_path / "run"),
                          "--only-summary", *SCENARIOS],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    with open(tmp_path / "run_stats.csv") as fh:
        rows = {row["Name"]: row for row in csv.DictReader(fh)}
    total = rows["Aggregated"]
    assert int(total["Request Count"]) > 50, total
    assert int(total["Failure Count"]) == 0, total


@pytest.mark.fleet     # the harness starts its targets: a 4-worker gateway, its own Redis
def test_harness_smoke_block(settings, services, tmp_path):
    out = tmp_path / "results"
    run = subprocess.run([sys.executable, "-m", "loadtests.bench", "--allow-dirty", "--block", "oltp",
                          "--targets", "gateway",
                          "--database-url", services.pg.url("demo"), "--rounds", "1", "--duration", "2",
                          "--connections", "8", "--warmup", "1", "--floor-duration", "1",
                          "--gateway-port", str(free_port()), "--redis-port", str(free_port()),
                          "--pg-cpu", "off", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (block,) = list(out.iterdir())
    records = [json.loads(line) for line in (block / "results.jsonl").read_text().splitlines()]
    calls = [r for r in records if r.get("target") == "gateway" and r.get("kind", "run") == "run"]
    assert calls and all(r.get("ok") for r in calls), records
    # the meters (psutil): the gateway's CPU per call and busy cores, and the machine's, all measured
    assert all(r["cpu_us_per_call"] > 0 and 0 < r["target_cores"] <= 2 and r["machine_cpu_s"] > 0 for r in calls)
    assert (block / "results.md").exists()


@pytest.mark.slow
@pytest.mark.fleet     # the harness starts its targets: 4-worker gateways, the peer, Redis
def test_cache_block_smoke(settings, services, tmp_path):
    """`python -m loadtests.bench cache` end to end, short: every cell ran once with every body right, the
    purges and writes on the 4-worker server were timed and checked, the balances written were put back, and the
    report judges issue 14's goals. With the peer when it is installed with its Redis package."""
    peer = ROOT / ".bench/qag-venv/bin/python"
    with_peer = peer.exists() and subprocess.run([str(peer), "-c", "import redis"], capture_output=True).returncode == 0
    out = tmp_path / "results"
    base = free_port()
    while any(not _port_free(base + n) for n in (0, 1, 2, 10, 11, 12)):
        base = free_port()
    balance = "SELECT sum(abalance) FROM pgbench_accounts WHERE aid <= 1000"
    before = services.sql(balance, db="demo")[0][0]
    run = subprocess.run([sys.executable, "-m", "loadtests.bench", "cache", "--allow-dirty",
                          "--database-url", services.pg.url("demo"), "--rounds", "1", "--duration", "2",
                          "--warmup", "1", "--floor-duration", "1", "--purges", "10", "--writes", "10",
                          "--base-port", str(base), "--pg-cpu", "off", "--out", str(out),
                          *([] if with_peer else ["--no-peer"])],
                         cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (block,) = list(out.iterdir())
    records = [json.loads(line) for line in (block / "results.jsonl").read_text().splitlines()]
    cells = {(r["target"], r["connections"]) for r in records if r["kind"] == "run" and r["ok"]}
    expected = {(t, c) for t in ("uncached", "cached", *(("peer",) if with_peer else ())) for c in (32, 1)}
    assert cells == expected, records
    timings = {r["kind"]: r for r in records if r["kind"] in ("purges", "writes")}
    assert set(timings) == {"purges", "writes"}
    for record in timings.values():
        assert len(record["samples_ms"]) == 10 and record["wrong"] == [] and record["live_workers"] == 4, record
    assert services.sql(balance, db="demo")[0][0] == before
    report = (block / "results.md").read_text()
    assert "Throughput cached / uncached, 32 connections, paired per round: " in report
    assert "A write's answer to no worker serving the older body, 10 writes pooled" in report
    (peer_line,) = [line for line in report.splitlines() if line.startswith("- Throughput cached / QueryAPIGate")]
    assert ("worst round" in peer_line) == with_peer, peer_line


def _port_free(port: int) -> bool:
    import socket
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# --- wrk's body check: the attack on it -------------------------------------------------------

class AccountServer:
    """A plain HTTP server answering GET /q/account?aid=N with the row pgbench's layout gives N, or
    with the wrong answer `lie` makes of it (an answer for another account, a wrong branch, two rows)."""

    def __init__(self, lie=None):
        import http.server
        import socketserver
        import threading
        from urllib.parse import parse_qs, urlparse

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                aid = int(parse_qs(urlparse(self.path).query)["aid"][0])
                rows = [{"aid": aid, "bid": (aid - 1) // 100000 + 1, "abalance": 0}]
                body = json.dumps({"rows": lie(rows) if lie else rows}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def other_account(rows):
    aid = rows[0]["aid"] % 1000 + 1     # a real row, of an account this call did not ask for
    return [{"aid": aid, "bid": (aid - 1) // 100000 + 1, "abalance": 0}]


@pytest.mark.parametrize("lie, found", [
    (None, None),
    (lambda rows: [{**rows[0], "bid": rows[0]["bid"] + 1}], "bad_body"),
    (lambda rows: rows + rows, "bad_body"),
    (lambda rows: [], "bad_body"),
    (other_account, "unasked"),
])
def test_wrk_checks_every_body_it_is_answered(lie, found):
    from loadtests import wrk
    if not shutil.which("wrk"):
        pytest.skip("wrk is not installed")
    server = AccountServer(lie)
    try:
        result = wrk.run(server.url, connections=4, duration_s=1,
                         env={"QUERY_PATH": "/q/account", "PARAM": "aid", "MAX_ID": "1000000"})
    finally:
        server.close()
    problems = wrk.errors_of(result)
    assert result.bodies["checked"] > 0, result.bodies
    if found is None:
        assert problems == [] and result.bodies["bad_body"] == result.bodies["unasked"] == 0, result.bodies
    else:
        assert result.bodies[found] > 0 and any(found in p for p in problems), (result.bodies, problems)


# --- the offline bundle: a machine without PostgreSQL, Redis or wrk ----------------------------

@pytest.mark.slow
@pytest.mark.integration     # its own redis-server and PostgreSQL
def test_offline_bundle_runs_its_own_servers(tmp_path):
    """The carried PostgreSQL, redis-server and wrk start from the bundle alone: the system's are
    off PATH, each carried binary finds every library it loads inside the bundle (the C library
    aside), and PostgreSQL finds its share/ and lib/ relative to where it was unpacked."""
    from fleet.ops.local import LocalPostgres
    from helpers.services import port_for
    from helpers.util import wait_until
    out = tmp_path / "offline"
    packed = subprocess.run([sys.executable, "-m", "loadtests.offline", "pack", "--no-wheels", "--no-compress",
                             "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert packed.returncode == 0, packed.stdout[-2000:] + packed.stderr[-2000:]
    bundle = out / "bundle"
    moved = tmp_path / "elsewhere"
    shutil.move(str(bundle), str(moved))     # it must not depend on where it was made
    os.chmod(tmp_path, 0o755)
    libs = moved / "lib"
    real = [p for p in moved.rglob("*.bin")] + list((moved / "bin" / "real").iterdir())
    assert {p.name for p in real} >= {"postgres.bin", "initdb.bin", "pg_ctl.bin", "redis-server", "wrk"}
    for binary in real:
        ldd = subprocess.run(["ldd", str(binary)], capture_output=True, text=True,
                             env={"LD_LIBRARY_PATH": str(libs)}).stdout
        assert "not found" not in ldd, ldd
        outside = [line for line in ldd.splitlines() if "=> /" in line and str(libs) not in line
                   and not re.search(r"\b(libc|libm|libpthread|libdl|librt|libresolv)\.so", line)]
        assert outside == [], (binary, outside)
    pg_bin = next(moved.rglob("initdb")).parent
    path = f"{pg_bin}:{moved / 'bin'}:/usr/bin:/bin:/usr/sbin:/sbin"
    version = subprocess.run(["wrk", "--version"], capture_output=True, text=True, env={"PATH": path})
    assert "wrk" in version.stdout + version.stderr
    assert shutil.which("redis-server", path=path) == str(moved / "bin" / "redis-server")
    redis_port = port_for("offline_redis")
    redis = subprocess.Popen(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", ""],
                             env={"PATH": path}, stdout=subprocess.DEVNULL)
    try:
        import redis as redis_client
        client = redis_client.Redis(port=redis_port)

        def answers():
            try:
                return client.ping()
            except redis_client.ConnectionError:
                return False
        wait_until(answers, 10, 0.1, "the carried redis-server")
        assert client.info()["executable"].startswith(str(moved))
    finally:
        redis.terminate()
        redis.wait(10)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", path)
        pg = LocalPostgres(tmp_path / "pg-home", port_for("offline_pg"))
        assert str(pg.bindir).startswith(str(moved))
        pg.start()
        try:
            import psycopg2
            with psycopg2.connect(pg.url()) as conn, conn.cursor() as cur:
                cur.execute("SELECT setting FROM pg_settings WHERE name = 'data_directory'")
                assert cur.fetchone()[0].startswith(str(tmp_path / "pg-home"))
                cur.execute("SELECT 'a'::text COLLATE \"und-x-icu\" < 'b'")   # ICU, from the carried libraries
                assert cur.fetchone()[0] is True
        finally:
            pg.stop()


# --- the house: imports and raw data ---------------------------------------------------------

def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_loadtests_has_no_import_cycle():
    graph = import_graph(ROOT / "loadtests")
    # relative imports resolved (a block's run imports the harness, bench the registry), or the check means nothing
    assert "loadtests.harness" in graph["loadtests.blocks.oltp.run"]
    assert "loadtests.blocks" in graph["loadtests.bench"]
    assert cycles(graph) == []
    # Blocks are reached through their registry only: no module outside loadtests/blocks/ imports one.
    outside = {name: {m for m in edges if m.startswith("loadtests.blocks.")}
               for name, edges in graph.items() if not name.startswith("loadtests.blocks")}
    assert {name: found for name, found in outside.items() if found} == {}


def test_the_product_does_not_import_loadtests():
    importers = sorted({f"{a.source}:{a.line}" for package in ("gateway", "fleet") for a in arrows(ROOT / package)
                        if a.target.split(".")[0] == "loadtests"})
    assert importers == []


# The folders of block runs (a meta.json beside results.jsonl); other raw data (the balance
# measurements' JSON lines) is kept as measured.
RAW = sorted(p for p in (ROOT / "docs" / "bench" / "raw").iterdir() if (p / "meta.json").exists())


@pytest.mark.parametrize("raw", RAW, ids=[p.name for p in RAW])
def test_committed_runs_render_as_committed(raw, tmp_path):
    """Each folder the reports in docs/bench/ cite renders again, from its results.jsonl and
    meta.json, into the very results.md kept beside them."""
    pytest.importorskip("matplotlib")  # the scale-out report links its plot
    folder = tmp_path / raw.name
    folder.mkdir()
    for name in ("meta.json", "results.jsonl"):
        shutil.copy(raw / name, folder / name)
    written = report.write(folder)
    assert written.read_text() == (raw / "results.md").read_text()
