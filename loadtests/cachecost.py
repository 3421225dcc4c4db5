"""A quick measurement of the response cache: the lookup with and without ``cache_ttl``, side
by side in one run, on one gateway worker (its own embedded PostgreSQL with the demo data and
its own Redis, all on this machine).

    .venv/bin/python -m loadtests.cachecost [--rounds 3] [--seconds 8] [--hot 1000] [--home /tmp/cachecost]

Per round, in an order rotated each round: wrk with 32 connections and with 1, on
``/q/account`` (no cache) and ``/q/account_cached`` (``cache_ttl`` 60), over a hot set of
``--hot`` accounts drawn uniformly; every body is checked (the row asked for, once). The
cached path is warmed first (every hot account cached). Prints medians with [min-max] over
the rounds, the paired per-round ratios, and the gateway's CPU per call (its process tree).
Closed loop (wrk): latency at a concurrency, not against an offered rate. Not the issue's
full benchmark (no QueryAPIGate, no purge timings): a first number for the hit's cost.
"""
from __future__ import annotations

import argparse
import json
import socket
import time
from pathlib import Path

from fleet.local.demo import create_demo_data
from fleet.local.embedded import LocalPostgres

from . import system, targets, wrk
from .stats import median_range, paired_ratios, show_paired, show_range

CACHED = 'account_cached'


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def _one(target: targets.Target, path: str, hot: int, connections: int, seconds: float, cpu: str) -> dict:
    meter = system.CpuMeter(*target.pids)
    meter.start()
    result = wrk.run(target.url(''), connections=connections, duration_s=seconds, cpu=cpu,
                     env={'API_KEY': target.api_key, 'QUERY_PATH': path, 'PARAM': 'aid', 'MAX_ID': str(hot)})
    used = meter.stop()
    problems = wrk.errors_of(result)
    if problems:
        raise RuntimeError(f'{path} with {connections} connections: {problems}')
    return {'rps': result.rps, 'p50_us': result.latency_us['50'], 'p99_us': result.latency_us['99'],
            'requests': result.requests, 'cpu_us_per_call': (used or 0) / max(1, result.requests) * 1e6,
            'bodies': result.bodies}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog='python -m loadtests.cachecost', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--seconds', type=float, default=8)
    parser.add_argument('--hot', type=int, default=1000)
    parser.add_argument('--home', type=Path, default=Path('/tmp/cachecost'))
    parser.add_argument('--gateway-cpu', default='0')
    parser.add_argument('--wrk-cpu', default='1')
    args = parser.parse_args(argv)
    run_dir = args.home / time.strftime('%Y%m%d-%H%M%S')
    run_dir.mkdir(parents=True, exist_ok=True)
    pg = LocalPostgres(args.home / 'pg', _port())
    pg.start()
    redis_process = target = None
    try:
        system.recreate_database(pg.url('postgres'), 'gateway')   # a fresh store (a new secret key each run)
        pg.ensure_database('demo')
        create_demo_data(pg.url('demo'))
        redis_process, redis_url = targets.start_redis(port=_port(), cpu=None, run_dir=run_dir)
        target = targets.start_gateway(port=_port(), cpu=args.gateway_cpu, store_url=pg.url('gateway'),
                                       redis_url=redis_url, run_dir=run_dir)
        targets.wait_healthy(target)
        targets.provision(target, pg.url('demo'))
        body = dict(targets.query_body(CACHED), cache_ttl=60)
        status, answer = targets.management(target, 'POST', '/queries', body)
        assert status == 201, answer
        status, answer = targets.management(target, 'PATCH', f'/api-keys/{targets.KEY}',
                                            {'queries': [targets.QUERY, CACHED]})
        assert status == 200, answer
        paths = {'uncached': f'/q/{targets.QUERY}', 'cached': f'/q/{CACHED}'}
        for path in paths.values():    # warm: prepared statements, and every hot account cached
            _one(target, path, args.hot, 32, 3, args.wrk_cpu)
        runs: dict[tuple[str, int], list[dict]] = {(name, c): [] for name in paths for c in (32, 1)}
        for n in range(args.rounds):
            order = list(paths.items()) if n % 2 == 0 else list(reversed(paths.items()))
            for connections in (32, 1):
                for name, path in order:
                    got = _one(target, path, args.hot, connections, args.seconds, args.wrk_cpu)
                    got['round'] = n
                    runs[(name, connections)].append(got)
                    print(f'round {n} {name:8} c={connections:2}: {got["rps"]:8.0f}/s p50 {got["p50_us"]:7.0f} us '
                          f'p99 {got["p99_us"]:7.0f} us, gateway CPU {got["cpu_us_per_call"]:6.0f} us/call', flush=True)
        (run_dir / 'runs.json').write_text(json.dumps({f'{k[0]}-c{k[1]}': v for k, v in runs.items()}, indent=1))
        print(f'\none gateway worker (CPU {args.gateway_cpu}), wrk on CPU {args.wrk_cpu}, hot set {args.hot}, '
              f'{args.rounds} rounds of {args.seconds:g} s; medians [min-max]:')
        for (name, connections), rs in runs.items():
            print(f'  {name:8} c={connections:2}: {show_range(median_range([r["rps"] for r in rs]), 0)} calls/s, '
                  f'p50 {show_range(median_range([r["p50_us"] for r in rs]), 0)} us, '
                  f'gateway CPU {show_range(median_range([r["cpu_us_per_call"] for r in rs]), 0)} us/call')
        print('  throughput cached/uncached at 32 connections: ' + show_paired(
            paired_ratios(runs[('cached', 32)], runs[('uncached', 32)], lambda r: r['rps']), goal=1.5))
        print('  single-caller p50 cached/uncached: ' + show_paired(
            paired_ratios(runs[('cached', 1)], runs[('uncached', 1)], lambda r: r['p50_us']), goal=0.7, at_most=True))
        print(f'raw: {run_dir / "runs.json"}')
    finally:
        if target is not None:
            targets.stop_process(target.process)
        if redis_process is not None:
            targets.stop_process(redis_process)
        pg.stop()


if __name__ == '__main__':
    main()
