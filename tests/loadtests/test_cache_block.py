"""The cache block (loadtests/blocks/cache/): how it reads the cache bus's acknowledgements (a worker
still pending after a write's answer is waited for and timed), the X-Cache-Invalidated header, and
its verdicts: goals judged on the worst round, the timings pooled, any wrong answer a failure.
(Its smoke run: tests/loadtests/test_loadtests.py.)"""
from __future__ import annotations

import threading
import time

import pytest

from helpers.ports import free_port
from loadtests import targets
from loadtests.blocks.cache import invalidation, render
from loadtests.targets import Target


@pytest.fixture
def caller(tmp_path):
    process, url = targets.start_redis(port=free_port(), cpu=None, run_dir=tmp_path)
    try:
        yield invalidation.Caller(Target("fleet", "http://127.0.0.1:1"), url, "/q/c", "/q/w")
    finally:
        targets.stop_process(process)


@pytest.mark.integration     # a redis-server of its own (``caller``)
def test_pending_workers_are_waited_for_and_timed(caller):
    r = caller.redis
    now_ms = int(time.time() * 1000)
    r.hset(invalidation.ALIVE, mapping={"w1": now_ms + 60_000, "w2": now_ms + 60_000, "gone": now_ms - 5_000})
    r.hset(invalidation.ACKS, mapping={"w1": 5, "w2": 3, "gone": 0})
    r.set(invalidation.SEQ, 5)
    assert caller.seq() == 5 and caller.live_workers() == 2
    assert caller.pending(5) == (2, 1) and caller.pending(3) == (2, 0)
    since = time.perf_counter()
    assert caller.until_acknowledged(3, since) == 0.0          # all there at the first look
    written = []

    def acknowledge():   # timed before the write: the waiter may see it before append() runs
        written.append(time.perf_counter() - since)
        r.hset(invalidation.ACKS, "w2", 5)
    threading.Timer(0.15, acknowledge).start()
    waited = caller.until_acknowledged(5, since)
    # Timed up to the look that saw it (a Timer fires late on a busy machine: timed from its write).
    assert waited >= 0.15 and written and written[0] - 0.01 <= waited <= written[0] + 0.1, (waited, written)
    assert caller.until_acknowledged(6, time.perf_counter(), limit_s=0.2) is None   # never acknowledged


def test_x_cache_invalidated_is_read():
    assert invalidation.invalidated({"x-cache-invalidated": "acked=4; pending=0; ms=3.2"}) == \
        {"acked": "4", "pending": "0", "ms": "3.2"}
    assert invalidation.invalidated({"x-cache-invalidated": "degraded"}).get("degraded")
    assert invalidation.invalidated({}) == {}


def run(target: str, c: int, round_: int, rps: float, p50_ms: float, cpu: float = 200.0) -> dict:
    return {"kind": "run", "target": target, "connections": c, "round": round_, "rps": rps, "ok": True,
            "latency_us": {"50": p50_ms * 1000}, "cpu_us_per_call": cpu}


def test_verdicts_judge_the_worst_round_and_pool_the_timings():
    runs = [run("uncached", 32, 1, 1000, 10), run("cached", 32, 1, 1600, 5), run("peer", 32, 1, 300, 50),
            run("uncached", 32, 2, 1000, 10), run("cached", 32, 2, 1400, 5), run("peer", 32, 2, 300, 50),
            run("uncached", 1, 1, 2000, 1.0), run("cached", 1, 1, 3000, 0.6),
            run("uncached", 1, 2, 2000, 1.0), run("cached", 1, 2, 3000, 0.8),
            {"kind": "purges", "round": 1, "samples_ms": [5.0] * 99 + [300.0], "wrong": []},
            {"kind": "writes", "round": 1, "samples_ms": [0.0] * 98 + [150.0, 150.0], "wrong": []}]
    lines = render.verdicts({"settings": {"workers": 4}}, runs)
    text = "\n".join(lines)
    assert "1.50× [1.40×-1.60×], 2 round(s); worst round 1.40×: misses >= 1.50×" in lines[0]   # the median meets
    assert "worst round 0.80×: misses <= 0.70×" in lines[1]
    assert "worst round 4.67×: misses >= 5.00×" in lines[2]
    assert "100 purges pooled (fewer than the issue's 1,000: not a result): p50 5.0 ms, p99 5.0 ms, max 300.0 ms" \
        in text
    assert "100 writes pooled: p50 0.0 ms, p99 150.0 ms, max 150.0 ms; misses p99 <= 100 ms" in text
    assert "FAILED" not in text
    runs[-1]["wrong"] = ["aid 7: after the write answered 200, balance 1 (the database: 2)"]
    assert "the block FAILED" in render.verdicts({}, runs)[-1]
    runs[-1]["wrong"] = []
    runs[3]["ok"] = False
    assert "1 wrk run(s) with a non-2xx" in render.verdicts({}, runs)[-1]
