"""The load tools run against a real fleet: locust headless for a few seconds (no failure
but the expected 429s, which its rate-limited scenario counts as successes), and a smoke
block of the benchmark harness."""
from __future__ import annotations

import csv
import json
import os
import subprocess

from conftest import ADMIN_KEY, ROOT, free_port

SCENARIOS = ["PlainLookup", "GovernedLookup", "AccountPage", "RateLimited", "ChurnReader", "ManagementChurn"]


def test_locust_headless_against_the_fleet(gunicorn, demo_connection, tmp_path):
    env = {**os.environ, "GATEWAY_ADMIN_KEY": ADMIN_KEY, "LOADTEST_CONNECTION": demo_connection,
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
