"""psycopg2 as the gateway uses it against psycopg 3 as it could be used, for one saved lookup
(issue #25, part 3: "consider psycopg 3 ... adopt it if the lookup does not regress").

    python -m loadtests.drivers --dsn postgresql://... [--calls 20000] [--rounds 5]

Each driver runs in this process on one pinned core, the same primary-key lookup of
``pgbench_accounts`` with a random ``aid``, one session each, rounds alternating the order:

- ``psycopg2``: what gateway/execution/runner.py does: ``PREPARE`` once, then per call
  ``EXECUTE name('<value>')`` with the value quoted into the text by the client (the simple
  query protocol, text results), rows fetched as tuples;
- ``psycopg3-prepared``: ``cursor.execute(sql, (aid,), prepare=True)``: values as protocol
  parameters (Parse once, then Bind/Execute per call, the extended protocol), text results;
- ``psycopg3-binary``: the same with ``binary=True`` results.

Reported: client CPU per call (``time.process_time``) and wall time per call, median of the
rounds with [min-max], and the ratio against psycopg2 paired per round (worst round). Needs a
venv with both drivers (psycopg2-binary and psycopg[binary]); it imports nothing of the gateway.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

SQL = "SELECT aid, bid, abalance, filler FROM pgbench_accounts WHERE aid = %s"


def run_psycopg2(dsn: str, aids: list[int]) -> tuple[float, float]:
    import psycopg2

    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute("PREPARE lookup(int) AS " + SQL.replace("%s", "$1"))
    started, cpu = time.perf_counter(), time.process_time()
    for aid in aids:
        cur.execute("EXECUTE lookup(%s)", (aid,))
        cur.fetchall()
    result = time.perf_counter() - started, time.process_time() - cpu
    conn.close()
    return result


def run_psycopg3(dsn: str, aids: list[int], binary: bool) -> tuple[float, float]:
    import psycopg

    conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=0)
    cur = conn.cursor(binary=binary)
    started, cpu = time.perf_counter(), time.process_time()
    for aid in aids:
        cur.execute(SQL, (aid,), prepare=True)
        cur.fetchall()
    result = time.perf_counter() - started, time.process_time() - cpu
    conn.close()
    return result


DRIVERS = {"psycopg2": lambda dsn, aids: run_psycopg2(dsn, aids),
           "psycopg3-prepared": lambda dsn, aids: run_psycopg3(dsn, aids, binary=False),
           "psycopg3-binary": lambda dsn, aids: run_psycopg3(dsn, aids, binary=True)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-aid", type=int, default=100_000)
    parser.add_argument("--cpu", type=int, default=1)
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, {args.cpu})
    rng = random.Random(7)
    cpu: dict[str, list[float]] = {name: [] for name in DRIVERS}
    wall: dict[str, list[float]] = {name: [] for name in DRIVERS}
    for n in range(args.rounds):
        aids = [rng.randint(1, args.max_aid) for _ in range(args.calls)]
        names = list(DRIVERS) if n % 2 == 0 else list(reversed(DRIVERS))
        for name in names:
            DRIVERS[name](args.dsn, aids[:500])                      # warm
            elapsed, used = DRIVERS[name](args.dsn, aids)
            wall[name].append(elapsed / args.calls * 1e6)
            cpu[name].append(used / args.calls * 1e6)
            print(f"round {n + 1} {name}: {cpu[name][-1]:.1f} us CPU, {wall[name][-1]:.1f} us wall per call", flush=True)
    print("\n| driver | client CPU µs/call, median [min-max] | wall µs/call | CPU vs psycopg2 (worst round) |")
    print("|---|---|---|---|")
    for name in DRIVERS:
        ratios = [mine / base for mine, base in zip(cpu[name], cpu["psycopg2"], strict=True)]
        print(f"| {name} | {statistics.median(cpu[name]):.1f} [{min(cpu[name]):.1f}-{max(cpu[name]):.1f}] | "
              f"{statistics.median(wall[name]):.1f} [{min(wall[name]):.1f}-{max(wall[name]):.1f}] | "
              f"{statistics.median(ratios):.2f}x ({max(ratios):.2f}x) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
