"""The cache block: issue 14's benchmark of the response cache, side by side in one run.

    .venv/bin/python -m loadtests.bench cache --local-pg /tmp/bench-pg            # the full block, then --publish
    .venv/bin/python -m loadtests.bench cache --database-url postgresql://postgres@127.0.0.1:54500/demo \\
        --rounds 1 --duration 2 --warmup 1 --floor-duration 1 --purges 20 --writes 20 --allow-dirty   # a smoke

Three targets, one gunicorn worker each on --target-cpu, the lookup (SELECT aid, bid, abalance FROM
pgbench_accounts WHERE aid = :aid) over a hot set of --hot accounts (default 1,000) drawn uniformly:

- `uncached`: our gateway, GET /q/account (no cache_ttl);
- `cached`: the same gateway process, GET /q/account_cached (the same SQL, cache_ttl --ttl, default 60);
- `peer`: QueryAPIGate 0.43.0 (loadtests/peer.py) with its Redis response cache on (QUERYAPIGATE_REDIS_URL, a
  Redis of its own) and the same query and TTL, GET /q/account_cached;

and a fourth server for the invalidation timings: our gateway with --workers workers (default 4) on every usable
core, the shared tier on (GATEWAY_CACHE_SHARED=on) and writes allowed, the same queries plus the saved write
`deposit` (UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid).

Each server has its own store database and its own Redis. Method (the harness's, loadtests/harness.py): a warm-up
per target (every hot account cached), a /health floor before and after, then --rounds rounds (default 5); in each,
every cell (target x --connections, default 32 and 1) runs once, targets in an order rotated each round, wrk
(loadtests/wrk/random_aid.lua) checking every body; while one runs, the other servers are stopped (SIGSTOP, as every
block does). Then, in the same round, --purges/--rounds purges and --writes/--rounds writes on the 4-worker server
(invalidation.py: how each is timed and checked). The report (render.py): paired per-round ratios (median
[min-max]) judged on the worst round - cached/uncached throughput at 32 connections (goal >= 1.5x), single-caller
p50 (goal <= 0.7x), cached/peer throughput at 32 (goal >= 5x) - the gateway's CPU per call of a hit and of a miss,
and the purge and write timings pooled over every round (p50, p99, max; the write's goal: p99 <= 100 ms).

A run with any non-2xx answer, socket error or wrong body, a purge or write answered wrongly, or a stale answer
after a write fails (exit 1). A dirty tree is refused (--allow-dirty for a smoke; such numbers are not a result);
the commit is recorded. Output: loadtests/results/cache-<timestamp>/ (--out): results.jsonl, meta.json, results.md;
--publish copies it to docs/bench/raw/ and writes docs/bench/<date>-cache.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import http.client
import math
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import redis

from ... import peer, rundir, system, targets, wrk
from ...harness import (
    WARMUP_CONNECTIONS,
    Block,
    Frozen,
    WorkerCpu,
    add_data_source,
    collect_versions,
    ensure_data,
    floor,
    local_postgres,
    log,
    now_iso,
    pin_postgres,
    progress_line,
    require_clean_tree,
    rotated,
)
from ...system import REPO
from ...targets import Target, TargetError
from . import CACHED, PEER, UNCACHED, invalidation
from .render import publish, verdicts
from .render import write as write_report

BLOCK = 'cache'
CACHED_QUERY = 'account_cached'
DEPOSIT = 'deposit'


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog='python -m loadtests.bench cache', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_source(parser, local_pg_port=54530)
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--duration', type=float, default=10, help='seconds per wrk run (default 10)')
    parser.add_argument('--connections', default='32,1', help='wrk -c values, one cell each (default 32,1)')
    parser.add_argument('--hot', type=int, default=1000, help='accounts of the hot set (default 1,000)')
    parser.add_argument('--ttl', type=int, default=60, help='cache_ttl of the cached query (default 60)')
    parser.add_argument('--warmup', type=float, default=5, help='seconds of warm-up per target (0: none)')
    parser.add_argument('--floor-duration', type=float, default=10, help='seconds of the /health floor (0: none)')
    parser.add_argument('--floor-connections', type=int, default=32)
    parser.add_argument('--no-peer', action='store_true', help='leave QueryAPIGate out (a smoke without it)')
    parser.add_argument('--peer-cache-ttl', default=peer.METADATA_CACHE_TTL,
                        help='the peer\'s QUERYAPIGATE_METADATA_CACHE_TTL (default 5)')
    parser.add_argument('--workers', type=int, default=4, help='workers of the invalidation server (default 4)')
    parser.add_argument('--purges', type=int, default=1000, help='purges over the whole block (default 1,000)')
    parser.add_argument('--writes', type=int, default=1000, help='writes over the whole block (default 1,000)')
    parser.add_argument('--fill-calls', type=int, default=8,
                        help='calls that cache the entry on the workers before each purge or write (default 8)')
    parser.add_argument('--checks', type=int, default=4,
                        help='calls after each write that must answer the new balance (default 4)')
    parser.add_argument('--target-cpu', default='1', help='taskset CPU list of the 1-worker targets (default 1)')
    parser.add_argument('--fleet-cpus', default=None,
                        help='CPU list of the invalidation server (default: every usable core)')
    parser.add_argument('--load-cpu', default='0', help='taskset CPU list of wrk (default 0)')
    parser.add_argument('--pg-cpu', default='0', help="CPU list for PostgreSQL and the Redis servers; 'off' leaves them")
    parser.add_argument('--wrk-timeout', type=float, default=None)
    parser.add_argument('--base-port', type=int, default=18200,
                        help='the gateway here, the peer +1, the invalidation server +2, their Redis +10..+12')
    parser.add_argument('--keep-stores', action='store_true')
    parser.add_argument('--allow-dirty', action='store_true',
                        help='run from a tree with uncommitted changes (a smoke run; not a result)')
    parser.add_argument('--publish', action='store_true',
                        help='copy the run to docs/bench/raw/ and write docs/bench/<date>-cache.md')
    parser.add_argument('--out', type=Path, default=rundir.RESULTS)
    args = parser.parse_args(argv)
    if bool(args.database_url) == bool(args.local_pg):
        parser.error('give one of --database-url and --local-pg')
    args.connections = [int(c) for c in args.connections.split(',')]
    if args.rounds < 1 or args.duration <= 0 or args.hot < 1 or any(c < 1 for c in args.connections):
        parser.error('--rounds, --duration, --hot and --connections must be positive')
    if args.purges < 0 or args.writes < 0 or args.workers < 1 or args.fill_calls < 1:
        parser.error('--purges and --writes must not be negative, --workers and --fill-calls positive')
    args.fleet_cpus = args.fleet_cpus or ','.join(str(c) for c in sorted(os.sched_getaffinity(0)))
    args.out = args.out.resolve()
    args.max_id = args.hot          # what Block.measure hands wrk: keys 1..hot
    args.gateway_root = REPO
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    require_clean_tree(args.allow_dirty)
    if args.publish and system.git_state()['dirty']:
        raise SystemExit('--publish needs a committed tree')
    for tool in ('wrk', 'taskset', 'redis-server'):
        if not system.tool_path(tool):
            raise SystemExit(f'{tool} not found')
    if targets.gateway_available(REPO):
        raise SystemExit(f'gateway: {targets.gateway_available(REPO)}')
    if not args.no_peer and not peer.GUNICORN.exists():
        raise SystemExit('the peer is not installed: run `.venv/bin/python -m loadtests.peer setup` (or --no-peer)')
    if not args.no_peer and subprocess.run([str(peer.PYTHON), '-c', 'import redis'], capture_output=True).returncode:
        raise SystemExit('the peer has no redis package (its Redis cache needs it): run `.venv/bin/python -m '
                         'loadtests.peer setup`')
    run_dir, work_dir = rundir.new(args.out, BLOCK)
    log(f'block {BLOCK} -> {run_dir} (server logs in {work_dir})')
    with local_postgres(args):
        code = _main(args, argv, run_dir, work_dir)
    if code == 0 and args.publish:
        log(f'published: {publish(run_dir)}')
    return code


def _main(args, argv: list[str], run_dir: Path, work_dir: Path) -> int:
    data = ensure_data(args)
    if data['max_aid'] < args.hot:
        raise SystemExit(f'pgbench_accounts ends at aid {data["max_aid"]}, below --hot {args.hot}')
    data['database_url'] = system.redact(args.database_url)
    pg_root, pg_note = pin_postgres(args)
    log(pg_note)
    names = [UNCACHED, CACHED] + ([] if args.no_peer else [PEER])
    meta = {
        'block': BLOCK, 'started_at': now_iso(), 'finished_at': None,
        'command': ' '.join(shlex.quote(a) for a in [sys.executable, '-m', 'loadtests.bench', BLOCK, *argv]),
        'settings': {'rounds': args.rounds, 'duration_s': args.duration, 'connections': args.connections,
                     'hot': args.hot, 'max_id': args.hot, 'cache_ttl': args.ttl, 'targets': names,
                     'baseline': UNCACHED, 'warmup_s': args.warmup, 'warmup_connections': WARMUP_CONNECTIONS,
                     'floor_s': args.floor_duration, 'floor_connections': args.floor_connections,
                     'workers': args.workers, 'purges': args.purges, 'writes': args.writes,
                     'fill_calls': args.fill_calls, 'checks': args.checks,
                     'target_cpu': args.target_cpu, 'fleet_cpus': args.fleet_cpus, 'load_cpu': args.load_cpu,
                     'pg_cpu': args.pg_cpu,
                     'order_note': 'targets take turns in an order rotated each round; within a round, connections '
                                   f'{", ".join(map(str, args.connections))} in that order, then the purges, then '
                                   'the writes',
                     'pinning_note': f'the 1-worker targets on CPU {args.target_cpu}, the '
                                     f'{args.workers}-worker server on {args.fleet_cpus}, wrk on {args.load_cpu} '
                                     f'(taskset -c); {pg_note}; the Redis servers on {args.pg_cpu}'},
        'machine': system.machine_info(), 'versions': collect_versions(data), 'data': data, 'targets': [],
        'work_dir': str(work_dir), 'load_average': {'start': [round(x, 2) for x in os.getloadavg()]},
        'notes': ['`uncached` and `cached` are one gateway process (one worker) called on two paths; while a cell '
                  'runs, the other servers are stopped (SIGSTOP); they run (idle) during the purges and writes, and the '
                  'invalidation server runs (idle) during the /health floors.',
                  'wrk is a closed loop: latency at a concurrency, not against an offered rate.'],
    }
    rundir.write_meta(run_dir, meta)

    def on_term(signum, frame):
        raise KeyboardInterrupt(f'signal {signum}')
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)

    cleanup: list = []
    balances: dict[int, list[int]] = {}
    block = Block(BLOCK, run_dir, args, pg_root)
    failed = None
    try:
        servers = start_servers(args, work_dir, cleanup)
        meta['targets'] = [t.summary() for t in servers['cells']]
        meta['invalidation_server'] = servers['fleet'].summary()
        rundir.write_meta(run_dir, meta)
        run_block(block, args, servers, balances)
        meta['finished_at'] = now_iso()
        meta['load_average']['end'] = [round(x, 2) for x in os.getloadavg()]
        failed = block.verdict()
    except KeyboardInterrupt as stop:
        failed = f'interrupted ({stop})'
    except (TargetError, wrk.WrkError, OSError, http.client.HTTPException, redis.RedisError, ValueError) as error:
        failed = f'{type(error).__name__}: {error}'
    finally:
        block.close()
        restore(args.database_url, balances)
        for process in reversed(cleanup):
            targets.stop_process(process)
        if failed:
            meta['notes'].append(f'Stopped early: {failed.splitlines()[0]}')
        rundir.write_meta(run_dir, meta)
        path = write_report(run_dir)
        log(f'report: {path}')
    for line in verdicts(*rundir.load(run_dir)):
        log(line)
    if failed:
        log(f'FAILED: {failed}')
        return 1
    return 0


# --------------------------------------------------------------------------------------
# Servers
# --------------------------------------------------------------------------------------

def start_servers(args, work_dir: Path, cleanup: list) -> dict:
    cached_body = {**targets.query_body(CACHED_QUERY), 'cache_ttl': args.ttl,
                   'description': f'The lookup, cache_ttl {args.ttl}'}
    deposit_body = {'name': DEPOSIT, 'description': 'Add :delta to one account (a write)',
                    'sql': invalidation.DEPOSIT_SQL, 'connection_name': targets.CONNECTION,
                    'parameters': {'aid': 'int', 'delta': 'int'}, 'publish': True}

    one, _ = start_gateway(args, work_dir, cleanup, 'gateway', 0, {})
    provision(one, args, [cached_body], {})
    uncached = dataclasses.replace(one, name=UNCACHED, info={**one.info, 'process': 'gateway'})
    cached = dataclasses.replace(one, name=CACHED, query_path=f'/q/{CACHED_QUERY}',
                                 info={**one.info, 'process': 'gateway'})
    uncached.description = 'gateway-fleet (this repo), 1 worker: GET /q/account (no cache_ttl)'
    cached.description = f'the same process: GET /q/{CACHED_QUERY} (cache_ttl {args.ttl})'
    cells = [uncached, cached]
    if not args.no_peer:
        cells.append(start_peer(args, work_dir, cleanup, cached_body))
    fleet, fleet_redis = start_gateway(args, work_dir, cleanup, 'fleet', 2, {
        'GATEWAY_WORKERS': str(args.workers), 'GATEWAY_CACHE_SHARED': 'on', 'GATEWAY_ALLOW_WRITES': 'on'},
        cpu=args.fleet_cpus)
    fleet.description = (f'gateway-fleet (this repo), {args.workers} workers on {args.fleet_cpus}, shared tier on, '
                         'writes allowed: the purge and write timings')
    provision(fleet, args, [cached_body, deposit_body], {'allow_writes': True})
    for target in cells:
        if target.name != UNCACHED:
            target.info['x_cache_second_call'] = cached_twice(target)
    caller = invalidation.Caller(fleet, fleet_redis, f'/q/{CACHED_QUERY}', f'/q/{DEPOSIT}')
    return {'cells': cells, 'fleet': fleet, 'caller': caller, 'gateway': one}


def start_gateway(args, work_dir: Path, cleanup: list, name: str, offset: int, extra: dict,
                  cpu: str | None = None) -> tuple[Target, str]:
    store = f'gwcache{offset}'
    system.recreate_database(args.database_url, store, drop=not args.keep_stores)
    process, redis_url = targets.start_redis(port=args.base_port + 10 + offset, cpu=args.pg_cpu,
                                             run_dir=work_dir / name)
    cleanup.append(process)
    target = targets.start_gateway(port=args.base_port + offset, cpu=cpu or args.target_cpu,
                                   store_url=system.dsn_with_db(args.database_url, store), redis_url=redis_url,
                                   run_dir=work_dir / name, extra_env=extra, name=name)
    cleanup.append(target.process)
    targets.wait_healthy(target)
    target.info['redis'] = system.redact(redis_url)
    log(f'{name} ready at {target.base_url} (pid {target.pids[0]}), Redis {redis_url}')
    return target, redis_url


def start_peer(args, work_dir: Path, cleanup: list, cached_body: dict) -> Target:
    store = 'qagcache'
    system.recreate_database(args.database_url, store, drop=not args.keep_stores)
    process, redis_url = targets.start_redis(port=args.base_port + 11, cpu=args.pg_cpu, run_dir=work_dir / 'peer')
    cleanup.append(process)
    target = peer.start(port=args.base_port + 1, cpu=args.target_cpu,
                        store_url=system.dsn_with_db(args.database_url, store), run_dir=work_dir / 'peer',
                        extra_env={'QUERYAPIGATE_METADATA_CACHE_TTL': str(args.peer_cache_ttl),
                                   'QUERYAPIGATE_REDIS_URL': redis_url})
    cleanup.append(target.process)
    target.name = PEER
    target.description = (f'QueryAPIGate {peer.VERSION}, 1 worker, 8 threads, its Redis response cache on: '
                          f'GET /q/{CACHED_QUERY} (cache_ttl {args.ttl})')
    target.info.update({'versions': peer.installed(), 'redis': system.redact(redis_url)})
    provision(target, args, [cached_body], {})
    target.query_path = f'/q/{CACHED_QUERY}'
    log(f'peer ready at {target.base_url} (pid {target.pids[0]}), its cache in Redis {redis_url}')
    return target


def provision(target: Target, args, queries: list[dict], key_extra: dict) -> None:
    """The connection and `queries` first, then targets.provision (the lookup and a key granted all of them)."""
    for path, body in [('/connections', targets.connection_body(args.database_url)),
                       *[('/queries', q) for q in queries]]:
        status, answer = targets.management(target, 'POST', path, body)
        if status not in (201, 409):
            raise TargetError(f'{target.name}: POST {path} answered {status}: {str(answer)[:300]}')
    granted = [targets.QUERY, *[q['name'] for q in queries]]
    target.info['provisioned'] = targets.provision(target, args.database_url,
                                                   key_extra={'queries': granted, **key_extra})


def cached_twice(target: Target) -> str:
    """The cached path called twice: the second answer must say it came from the cache (X-Cache), or the block
    would measure something else than a cache."""
    seen = []
    for _ in range(2):
        status, headers = _get(target, f'{target.query_path}?aid=42')
        seen.append(headers.get('x-cache', ''))
        if status != 200:
            raise TargetError(f'{target.name}: {target.query_path}?aid=42 answered {status}')
    if seen[1].lower() != 'hit':
        raise TargetError(f'{target.name}: a second call of {target.query_path} was not a cache hit (X-Cache '
                          f'{seen})')
    return seen[1]


def _get(target: Target, path: str) -> tuple[int, dict]:
    import urllib.error
    import urllib.request
    request = urllib.request.Request(target.url(path), headers={'X-API-Key': target.api_key})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
            return response.status, {k.lower(): v for k, v in response.getheaders()}
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}


def restore(database_url: str, balances: dict[int, list[int]]) -> None:
    """Put back the balances the writes changed (the demo data is shared with other blocks)."""
    changed = {aid: now - start for aid, (start, now) in balances.items() if now != start}
    if not changed:
        return
    conn = system.pg_connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            for aid, delta in changed.items():
                cur.execute('UPDATE pgbench_accounts SET abalance = abalance - %s WHERE aid = %s', (delta, aid))
    finally:
        conn.close()
    log(f'put back the balances of {len(changed)} accounts')


# --------------------------------------------------------------------------------------
# The rounds
# --------------------------------------------------------------------------------------

def run_block(block: Block, args, servers: dict, balances: dict) -> None:
    cells, fleet, caller = servers['cells'], servers['fleet'], servers['caller']
    processes = [t for t in cells if t.name in (UNCACHED, PEER)]    # one target per process (floors, freezing)

    def frozen(target: Target) -> list:
        mine = set(target.pids)
        return [Frozen([p for p in processes + [fleet] if not set(p.pids) & mine])]

    def probes(target: Target) -> list:
        return frozen(target) + ([] if target.name == PEER else [WorkerCpu(target.pids[0])])

    for target in cells:
        if args.warmup > 0:
            record = block.measure(target, kind='warmup', connections=WARMUP_CONNECTIONS, duration_s=args.warmup,
                                   probes=probes(target))
            log(progress_line(record, 'warm-up'))
    floor(block, processes, 'before', args)
    per_round = {'purges': math.ceil(args.purges / args.rounds), 'writes': math.ceil(args.writes / args.rounds)}
    for r in range(args.rounds):
        order = rotated(cells, r)
        position = 0
        for c in args.connections:
            for target in order:
                record = block.measure(target, kind='run', round=r + 1, position=position, connections=c,
                                       duration_s=args.duration, order=[t.name for t in order],
                                       probes=probes(target))
                position += 1
                log(progress_line(record, f'round {r + 1}/{args.rounds}'))
        for kind in ('purges', 'writes'):
            if not per_round[kind]:
                continue
            if kind == 'purges':
                result = invalidation.purges(caller, per_round[kind], args.hot, args.fill_calls, args.workers)
            else:
                result = invalidation.writes(caller, per_round[kind], args.hot, args.fill_calls, args.workers,
                                             balances, args.checks)
            record = {'block': BLOCK, 'kind': kind, 'round': r + 1, 'target': fleet.name, 'workers': args.workers,
                      'started_at': now_iso(), **result}    # no 'ok': the closed-loop report reads that of wrk runs
            block.write(record)
            if result['wrong']:
                block.failures.append(f'{kind} of round {r + 1}: {len(result["wrong"])} wrong, first: '
                                      f'{result["wrong"][0]}')
            log(timing_line(record, f'round {r + 1}/{args.rounds}'))
    floor(block, processes, 'after', args)


def timing_line(record: dict, prefix: str) -> str:
    from ...stats import percentile
    samples = record['samples_ms']
    line = f'{prefix} {record["kind"]} on {record["workers"]} workers ({record["live_workers"]} live): {len(samples)}'
    if samples:
        line += (f', p50 {percentile(samples, 50):.1f} ms, p99 {percentile(samples, 99):.1f} ms, '
                 f'max {max(samples):.1f} ms; {record["pending_at_answer"]} answered with a worker pending')
    if record['wrong']:
        line += f'  ⚠ {len(record["wrong"])} wrong: {record["wrong"][0]}'
    return line
