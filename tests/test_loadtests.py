"""The load tools run against a real fleet: locust headless for a few seconds (no failure
but the expected 429s, which its rate-limited scenario counts as successes), and a smoke
block of the benchmark harness."""
from __future__ import annotations

import csv
import json
import os
import subprocess

from conftest import ADMIN_KEY, ROOT, free_port, unique
from loadtests.scenarios import provision

SCENARIOS = ["PlainLookup", "GovernedLookup", "AccountPage", "RateLimited", "ChurnReader", "ManagementChurn"]


def test_deposit_runs_on_the_write_connection():
    """deposit is saved on the write connection (demo_writer: a role that may only run it); the
    reads stay on the read connection, and the writer key is granted both."""
    saved = provision.queries("reads", "writes")
    assert {name: q["connection_name"] for name, q in saved.items()} == {
        "account": "reads", "account_governed": "reads", "account_page": "reads", "deposit": "writes",
        "account_versioned": "reads"}
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


def test_harness_smoke_block(settings, services, tmp_path):
    out = tmp_path / "results"
    run = subprocess.run([str(ROOT / ".venv/bin/fleet"), "bench", "--block", "oltp", "--targets", "gateway",
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
    assert (block / "results.md").exists()
