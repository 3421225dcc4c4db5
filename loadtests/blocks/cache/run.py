"""The cache block: issue 14's benchmark of the response cache, side by side in one run.

    .venv/bin/python -m loadtests.bench cache --local-pg /tmp/bench-pg            # the full block, then --publish
    .venv/bin/python -m loadtests.bench cache --database-url postgresql://postgres@127.0.0.1:54500/demo \\
        --rounds 1 --duration 2 --warmup 1 --floor-duration 1 --purges 20 --writes 20 --allow-dirty   # a smoke

Three cells, one gunicorn worker each on --target-cpu, the lookup over a hot set of --hot accounts: `uncached`
(GET /q/account), `cached` (the same process, GET /q/account_cached with cache_ttl --ttl) and `peer` (QueryAPIGate
0.43.0 with its Redis response cache, the same query and TTL); and a fourth server with --workers workers, the shared
tier on and writes allowed, for the purge and write timings (invalidation.py). Each server has its own store and
Redis. The harness's method (warm-up, /health floors, rounds rotated, wrk checking every body, the others frozen),
then in each round --purges/--rounds purges and --writes/--rounds writes. The report (render.py) judges issue 14's
goals on paired per-round ratios (worst round) and the timings on pooled percentiles. A wrong answer fails the block
(exit 1); --publish copies the run to docs/bench/raw/ and writes docs/bench/<date>-cache.md.
"""
from __future__ import annotations

import dataclasses
import http.client
import math
import os
import subprocess
import sys
from pathlib import Path

import redis

from ... import harness, peer, report, rundir, system, targets
from ...harness import WARMUP_CONNECTIONS, Block, log, now_iso
from ...system import REPO
from ...targets import Target, TargetError
from . import CACHED, PEER, UNCACHED, invalidation
from .render import publish, verdicts

BLOCK = 'cache'
CACHED_QUERY = 'account_cached'
DEPOSIT = 'deposit'


def parse_args(argv=None):
    parser = harness.parser_for(BLOCK, __doc__)
    add = parser.add_argument
    harness.add_data_source(parser, local_pg_port=54530)
    harness.add_run_options(parser)
    add('--connections', default='32,1', help='wrk -c values, one cell each (default 32,1)')
    add('--hot', type=int, default=1000, help='accounts of the hot set (default 1,000)')
    add('--ttl', type=int, default=60, help='cache_ttl of the cached query (default 60)')
    add('--no-peer', action='store_true', help='leave QueryAPIGate out (a smoke without it)')
    add('--peer-cache-ttl', default=peer.METADATA_CACHE_TTL, help='the peer\'s QUERYAPIGATE_METADATA_CACHE_TTL')
    add('--workers', type=int, default=4, help='workers of the invalidation server (default 4)')
    add('--purges', type=int, default=1000, help='purges over the whole block (default 1,000)')
    add('--writes', type=int, default=1000, help='writes over the whole block (default 1,000)')
    add('--fill-calls', type=int, default=8, help='calls that cache the entry before each purge or write')
    add('--checks', type=int, default=4, help='calls after each write that must answer the new balance')
    add('--fleet-cpus', default=None, help='CPU list of the invalidation server (default: every usable core)')
    add('--base-port', type=int, default=18200,
        help='the gateway here, the peer +1, the invalidation server +2, their Redis +10..+12')
    add('--keep-stores', action='store_true')
    add('--publish', action='store_true', help='copy the run to docs/bench/raw/ and write docs/bench/<date>-cache.md')
    args = harness.parse(parser, argv)
    args.connections = [int(c) for c in args.connections.split(',')]
    if args.hot < 1 or any(c < 1 for c in args.connections) or args.purges < 0 or args.writes < 0 \
            or args.workers < 1 or args.fill_calls < 1:
        parser.error('--hot, --connections, --workers and --fill-calls must be positive, --purges and --writes not '
                     'negative')
    args.fleet_cpus = args.fleet_cpus or ','.join(str(c) for c in sorted(os.sched_getaffinity(0)))
    args.max_id = args.hot          # what Block.measure hands wrk: keys 1..hot
    args.gateway_root = REPO
    return args


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if targets.gateway_available(REPO):
        raise SystemExit(f'gateway: {targets.gateway_available(REPO)}')
    if not args.no_peer and (not peer.GUNICORN.exists() or subprocess.run(
            [str(peer.PYTHON), '-c', 'import redis'], capture_output=True).returncode):
        raise SystemExit('the peer or its redis package is missing: run `.venv/bin/python -m loadtests.peer setup` '
                         '(or --no-peer)')
    return harness.run_block(BLOCK, args, [BLOCK, *argv], body, report.write, tools=('wrk', 'taskset', 'redis-server'),
                     errors=(OSError, http.client.HTTPException, redis.RedisError, ValueError), publish=publish)


def body(run) -> None:
    args, meta = run.args, run.meta
    if run.data['max_aid'] < args.hot:
        raise ValueError(f'pgbench_accounts ends at aid {run.data["max_aid"]}, below --hot {args.hot}')
    names = [UNCACHED, CACHED] + ([] if args.no_peer else [PEER])
    meta['settings'] = {
        'rounds': args.rounds, 'duration_s': args.duration, 'connections': args.connections, 'hot': args.hot,
        'max_id': args.hot, 'cache_ttl': args.ttl, 'targets': names, 'baseline': UNCACHED, 'warmup_s': args.warmup,
        'warmup_connections': WARMUP_CONNECTIONS, 'floor_s': args.floor_duration,
        'floor_connections': args.floor_connections, 'workers': args.workers, 'purges': args.purges,
        'writes': args.writes, 'fill_calls': args.fill_calls, 'checks': args.checks, 'target_cpu': args.target_cpu,
        'fleet_cpus': args.fleet_cpus, 'load_cpu': args.load_cpu, 'pg_cpu': args.pg_cpu,
        'order_note': 'targets take turns in an order rotated each round; within a round, connections '
                      f'{", ".join(map(str, args.connections))} in that order, then the purges, then the writes',
        'pinning_note': f'the 1-worker targets on CPU {args.target_cpu}, the {args.workers}-worker server on '
                        f'{args.fleet_cpus}, wrk on {args.load_cpu} (taskset -c); {run.pg_note}; the Redis servers '
                        f'on {args.pg_cpu}'}
    meta['load_average'] = {'start': [round(x, 2) for x in os.getloadavg()]}
    meta['notes'] += ['`uncached` and `cached` are one gateway process (one worker) called on two paths; while a cell '
                      'runs, the other servers are stopped (SIGSTOP); they run (idle) during the purges and writes, '
                      'and the invalidation server runs (idle) during the /health floors.',
                      'wrk is a closed loop: latency at a concurrency, not against an offered rate.']
    run.save()
    balances: dict[int, list[int]] = {}
    try:
        servers = start_servers(args, run.work_dir, run.cleanup)
        meta['targets'] = [t.summary() for t in servers['cells']]
        meta['invalidation_server'] = servers['fleet'].summary()
        run.save()
        run_rounds(run.block, args, servers, balances)
        meta['load_average']['end'] = [round(x, 2) for x in os.getloadavg()]
    finally:
        restore(args.database_url, balances)
    for line in verdicts(meta, rundir.load(run.run_dir)[1]):
        log(line)


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
        status, headers, _ = targets.get(target.url(f'{target.query_path}?aid=42'), target.api_key)
        seen.append(headers.get('x-cache', ''))
        if status != 200:
            raise TargetError(f'{target.name}: {target.query_path}?aid=42 answered {status}')
    if seen[1].lower() != 'hit':
        raise TargetError(f'{target.name}: a second call of {target.query_path} was not a cache hit (X-Cache '
                          f'{seen})')
    return seen[1]


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

def run_rounds(block: Block, args, servers: dict, balances: dict) -> None:
    """The closed-loop rounds of the three cells (one process for `uncached` and `cached`), and after each round's
    cells its share of the purges and the writes on the invalidation server."""
    cells, fleet, caller = servers['cells'], servers['fleet'], servers['caller']
    processes = [t for t in cells if t.name in (UNCACHED, PEER)]    # one target per process (floors, freezing)
    per_round = {'purges': math.ceil(args.purges / args.rounds), 'writes': math.ceil(args.writes / args.rounds)}

    def timings(r: int) -> None:
        for kind in (k for k in ('purges', 'writes') if per_round[k]):
            result = (invalidation.purges(caller, per_round[kind], args.hot, args.fill_calls, args.workers)
                      if kind == 'purges' else
                      invalidation.writes(caller, per_round[kind], args.hot, args.fill_calls, args.workers, balances,
                                          args.checks))
            record = {'block': BLOCK, 'kind': kind, 'round': r + 1, 'target': fleet.name, 'workers': args.workers,
                      'started_at': now_iso(), **result}    # no 'ok': the closed-loop report reads that of wrk runs
            block.write(record)
            if result['wrong']:
                block.failures.append(f'{kind} of round {r + 1}: {len(result["wrong"])} wrong, first: '
                                      f'{result["wrong"][0]}')
            log(timing_line(record, f'round {r + 1}/{args.rounds}'))
    harness.run_rounds(block, cells, args, {t.name: [harness.WorkerCpu(t.pids[0])] for t in cells if t.name != PEER},
                       others=lambda t: [p for p in processes + [fleet] if not set(p.pids) & set(t.pids)],
                       floors=processes, after_round=timings)


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
