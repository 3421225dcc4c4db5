"""Deterministic cost of a cache hit against an uncached lookup in one worker's app (issue 14), for one or more
checkouts side by side: what timing cannot attribute on a noisy machine, counted.

    .venv/bin/python -m loadtests.cachecost --pg-url postgresql://postgres:...@127.0.0.1:5432/postgres \\
        --redis-url redis://:...@127.0.0.1:6379/0 [--root /path/to/base-checkout --root .] \\
        [--calls 3000] [--measure profile,opcodes,tracemalloc,cpu,callgrind]

The app in process as loadtests.callcost builds it (its child, on a store database ``cachecost_<n>`` of its own),
provisioned with the cache block's lookup twice, ``account`` (no cache_ttl) and ``account_cached`` (cache_ttl 600),
and one key granted both; then one identical call many times: ``uncached`` is ``/q/account?aid=42`` (a database call
each time), ``hit`` is ``/q/account_cached?aid=42`` (after the warm-up, one hot entry; every answer must say
X-Cache: hit). The cyclic collector is off for the calls. Per call: ``profile`` (Python calls), ``opcodes``
(bytecodes executed), ``tracemalloc`` (the peak of traced memory above the start of a call, median), ``cpu`` (the
calling thread's and the whole process's CPU, µs: timing, so noisy) and ``callgrind`` (the calling thread's
instructions, a run of twice --calls minus a run of --calls). What a real server adds per call is the same for both
and is not here: the cache block (``python -m loadtests.bench cache``) measures it.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from .callcost import CACHE_PATHS, HERE, run_child

MEASURES = {'profile': ('Python calls', 'calls_per_call'), 'opcodes': ('bytecodes', 'calls_per_call'),
            'tracemalloc': ('peak bytes', 'peak_per_call'), 'cpu': ('CPU us thread / process', 'cpu_us'),
            'callgrind': ('instructions (thread)', 'ir_main')}
CALLGRIND = ['valgrind', '--tool=callgrind', '--separate-threads=yes', '--dump-line=no',
             '--callgrind-out-file={tmp}/callgrind.out.%p']


def measure(root: Path, index: int, args: argparse.Namespace, target: str, what: str) -> str:
    if what == 'callgrind':
        low, high = (run_child(root, index, args, 'plain', calls, CALLGRIND, target)['ir_main']
                     for calls in (args.calls, 2 * args.calls))
        return f'{(high - low) / args.calls:,.0f}'
    value = run_child(root, index, args, what, args.calls, [], target)[MEASURES[what][1]]
    if what == 'cpu':
        return f'{value[0]:.1f} / {value[1]:.1f}'
    return f'{value:,.1f}' if isinstance(value, float) else f'{value:,}'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--root', action='append', type=Path, help='a checkout to measure (repeatable)')
    parser.add_argument('--pg-url', required=True)
    parser.add_argument('--redis-url', required=True)
    parser.add_argument('--calls', type=int, default=3000)
    parser.add_argument('--warmup', type=int, default=200)
    parser.add_argument('--measure', default='profile,opcodes,tracemalloc,cpu')
    args = parser.parse_args()
    measures = args.measure.split(',')
    if set(measures) - set(MEASURES):
        parser.error(f'unknown measure(s): {", ".join(sorted(set(measures) - set(MEASURES)))} (known: '
                     f'{", ".join(MEASURES)})')
    print(f'| checkout | call | {" | ".join(MEASURES[m][0] for m in measures)} |')
    print(f'|---|---|{"---|" * len(measures)}')
    for index, root in enumerate(r.resolve() for r in (args.root or [HERE.parent.parent])):
        for target in sorted(CACHE_PATHS):
            cells = [measure(root, index, args, target, m) for m in measures]
            print(f'| {root} | {target} | {" | ".join(cells)} |', flush=True)


if __name__ == '__main__':
    main()
