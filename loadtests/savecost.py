"""Save-time cost: reading and analysing a statement, as a query save does it, in this checkout
and (optionally) in another one, each in its own interpreter, interleaved.

    .venv/bin/python -m loadtests.savecost [--base-root /tmp/old-worktree] [--rounds 7]

The statements: the saved-mode lines of tests/corpus/hostile.jsonl (the first 60) and the
demo's lookup and join. Per statement: the reader (PostgreSQL's parser through gateway.sql,
or gateway.sqltext's scanner in a checkout from before it) and the analysis
(gateway.governance.analyze) against a fixed schema, refusals included (they cost too).
Prints medians of per-round means with their ranges, in microseconds; no database needed.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from .stats import median_range, show_range
from .system import REPO

_PROBE = r'''
import json, os, re, sys, time
sys.path.insert(0, sys.argv[1])
from gateway.governance import analyze, Schema
# By the checkout's files, not by an import: the venv's editable install would lend a
# module that the other checkout lacks.
if os.path.isdir(os.path.join(sys.argv[1], "gateway", "sql")):
    from gateway.sql import read
    def reader(sql, names):
        return read(sql, names)
    def save(sql, names):
        analyze(read(sql, names), SCHEMA)
else:                                     # a checkout from before gateway.sql
    from gateway.sqltext import prepare_text
    def reader(sql, names):
        return prepare_text(sql, names)
    def save(sql, names):
        analyze(prepare_text(sql, names).positional, SCHEMA)
SCHEMA = Schema({"public.pgbench_accounts": ("aid", "bid", "abalance", "filler"),
                 "public.customers": ("id", "name", "email", "country", "plan", "created_at"),
                 "public.orders": ("id", "customer_id", "amount", "status", "created_at")})
LOOKUP = "SELECT aid, bid, abalance FROM pgbench_accounts WHERE aid = :aid"
cases = [json.loads(line) for line in open(sys.argv[2])]
sqls = [c["sql"] for c in cases if c["mode"] == "saved"][:60] + [LOOKUP,
        "SELECT c.id, c.name, count(o.id) AS n FROM customers c JOIN orders o ON o.customer_id = c.id "
        "WHERE c.country = :c GROUP BY c.id, c.name ORDER BY n DESC"]
def names(sql):
    return frozenset(re.findall(r":([A-Za-z_]\w*)", sql))
def timed(fn, sql):
    try:
        fn(sql, names(sql))
    except Exception:
        pass
for sql in sqls:
    timed(save, sql)
t = time.perf_counter()
for sql in sqls:
    timed(save, sql)
per_save = (time.perf_counter() - t) / len(sqls) * 1e6
t = time.perf_counter()
for _ in range(500):
    reader(LOOKUP, frozenset({"aid"}))
print(json.dumps({"save_us": per_save, "reader_lookup_us": (time.perf_counter() - t) / 500 * 1e6,
                  "statements": len(sqls)}))
'''


def measure(root: Path) -> dict:
    corpus = REPO / 'tests' / 'corpus' / 'hostile.jsonl'
    out = subprocess.run([sys.executable, '-c', _PROBE, str(root), str(corpus)], check=True,
                         capture_output=True, text=True, cwd=root)
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog='python -m loadtests.savecost', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--base-root', type=Path, default=None, help='another checkout to measure alongside')
    parser.add_argument('--rounds', type=int, default=7)
    args = parser.parse_args(argv)
    roots = {'this checkout': REPO}
    if args.base_root:
        roots['base'] = args.base_root.resolve()
    results: dict[str, list[dict]] = {name: [] for name in roots}
    for _ in range(args.rounds):
        for name, root in roots.items():
            results[name].append(measure(root))
    for name, runs in results.items():
        save = median_range([r['save_us'] for r in runs])
        read = median_range([r['reader_lookup_us'] for r in runs])
        print(f'{name}: read + analyse {show_range(save)} µs per statement ({runs[0]["statements"]} statements); '
              f'the reader alone on the lookup query {show_range(read)} µs')


if __name__ == '__main__':
    main()
