"""The scale-out block: throughput against the number of workers in one gunicorn master, ours and the peer's.

    .venv/bin/python -m loadtests.bench scaleout --local-pg /tmp/bench-pg
    .venv/bin/python -m loadtests.bench scaleout --database-url postgresql://postgres@127.0.0.1:54500/demo \\
        --max-workers 8 --rounds 5 --duration 10

For w = 1, 2, 4, ... up to the cores the gateway may use (and --max-workers), one gunicorn master per target: ours
with GATEWAY_WORKERS=w on w cores (a worker pinned to each by fleet/server/gunicorn_conf.py) and shared admission on (a
Redis started here, a key whose limits are far above the load), and the peer with `--workers w` under taskset on the
same cores; the lookup with wrk at --conns-per-worker x w connections. The harness's method (a warm-up per server,
/health floors on the 1-worker servers, rounds rotated, the other servers frozen during a run). The report
(render.py, with scaleout.png) gives per-worker and per-core throughput, efficiency against linear, CPU per call, and
which cores each part had: cells whose workers share a core with wrk or PostgreSQL are marked.

All servers run at once when PostgreSQL's max_connections allows, else (or with --servers per-workers) those of one
worker count at a time. Our gateways share one store and one Redis (they act as one fleet); the peers share one store.
"""
from __future__ import annotations

import os
import secrets
import sys
import time
from pathlib import Path

from ... import harness, peer, system, targets
from ...harness import WARMUP_CONNECTIONS, Frozen, log, progress_line, rotated
from ...system import REPO
from ...targets import Target, TargetError
from .render import write as write_report

BLOCK = 'scaleout'
THREADS = 8                      # both targets' default threads per worker
PG_SESSIONS_PER_WORKER = THREADS + 4   # data pool + store + bus/history, roughly: for the max_connections check
HUGE_RATE = '1000000/second'
HUGE_QUOTA = {'calls': 1_000_000_000_000, 'per': 'day'}


def worker_counts(max_workers: int) -> list[int]:
    counts = [1 << n for n in range(max_workers.bit_length()) if 1 << n <= max_workers]
    return counts + ([max_workers] if counts[-1] != max_workers else [])


def cpu_list(text: str | None) -> list[int]:
    from gateway.settings import parse_cpu_list
    return [] if text in (None, '', 'off') else parse_cpu_list(text)


def cpus_text(cpus) -> str:
    return ','.join(str(c) for c in cpus)


class Server:
    """One gunicorn master of one target with w workers on its cores."""

    def __init__(self, target_name: str, workers: int, cpus: list[int], port: int, shared_with: set[int]):
        self.target_name, self.workers, self.cpus, self.port = target_name, workers, cpus, port
        self.shared = sorted(set(cpus) & shared_with)
        self.target: Target | None = None
        self.label = f'{target_name} w={workers}'

    def tags(self) -> dict:
        return {'workers': self.workers, 'cpus': cpus_text(self.cpus), 'shared_cpus': cpus_text(self.shared)}


def start_server(server: Server, ctx: dict) -> Target:
    args, run_dir, cpus = ctx['args'], ctx['work_dir'] / f'{server.target_name}-w{server.workers}', cpus_text(server.cpus)
    if server.target_name == 'gateway':
        target = targets.start_gateway(
            port=server.port, cpu=cpus, store_url=ctx['gateway_store'], redis_url=ctx['redis_url'], run_dir=run_dir,
            admin_key=ctx['gateway_admin'], root=args.gateway_root,
            extra_env={'GATEWAY_WORKERS': str(server.workers), 'GATEWAY_SECRET_KEY': ctx['gateway_secret'],
                       'GATEWAY_INSTANCE': f'so-w{server.workers}', 'GATEWAY_ADMISSION': 'on',
                       'GATEWAY_THREADS': str(THREADS)})
        target.description = f'gateway-fleet (this repo), {server.workers} worker(s) pinned one per core'
    else:   # loadtests/peer.py's command with --workers w (the rest as its image runs it)
        home = run_dir / 'peer-home'
        home.mkdir(parents=True, exist_ok=True)
        cmd = peer.command(server.port, home / 'gunicorn.ctl')
        cmd[cmd.index('--workers') + 1] = str(server.workers)
        env = peer.environment(ctx['peer_store'], ctx['peer_admin'], home)
        process = targets.start_process(cmd, env=env, cwd=home, log_path=run_dir / 'peer.log', cpu=cpus)
        target = Target(name='peer', base_url=f'http://127.0.0.1:{server.port}', admin_key=ctx['peer_admin'],
                        pids=[process.pid], process=process, log_path=run_dir / 'peer.log',
                        description=f'QueryAPIGate {peer.VERSION}, {server.workers} worker(s), {THREADS} threads, '
                                    'taskset on the same cores (no per-worker pinning)',
                        info={'command': ' '.join(cmd), 'cpu': cpus,
                              'env': {k: ('***' if k == 'QUERYAPIGATE_API_KEY' else system.redact(v))
                                      for k, v in env.items() if k.startswith('QUERYAPIGATE_')}})
    ctx['cleanup'].append(target.process)
    targets.wait_healthy(target)
    target.info.update(server.tags())
    return target


def provision_first(target: Target, data_url: str, *, limits: bool) -> dict:
    """Connection, saved query and key through `target`'s Management API (once per store); the key gets a rate
    limit and quota far above the load when `limits` (ours: shared admission runs on every call)."""
    steps = {}
    for what, path, body in (('connection', '/connections', targets.connection_body(data_url)),
                             ('query', '/queries', targets.query_body())):
        status, answer = targets.management(target, 'POST', path, body)
        if status not in (201, 409):
            raise TargetError(f'{target.name}: create {what} answered {status}: {str(answer)[:400]}')
        steps[what] = status
    key = {**targets.key_body(), **({'rate_limit': HUGE_RATE, 'quota': HUGE_QUOTA} if limits else {})}
    targets.management(target, 'DELETE', f'/api-keys/{targets.KEY}')
    status, answer = targets.management(target, 'POST', '/api-keys', key)
    if status != 201 or not isinstance(answer, dict) or not answer.get('secret'):
        raise TargetError(f'{target.name}: create key answered {status}: {str(answer)[:400]}')
    return {**steps, 'key': {k: v for k, v in key.items() if k != 'name'}, 'secret': answer['secret']}


def ready(server: Server, secret: str) -> str:
    """Give the server its key and check one call answers (a new master loads the catalog as it starts)."""
    server.target.api_key = secret
    deadline = time.monotonic() + 15
    while True:
        try:
            return targets.probe(server.target)
        except TargetError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def plan_groups(servers: list[Server], mode: str, max_connections: int | None) -> tuple[list[list[Server]], str]:
    """Which servers run together: all (one group), or one group per worker count."""
    need = sum(s.workers for s in servers) * PG_SESSIONS_PER_WORKER + 10
    fits = max_connections is None or need <= max_connections
    if (mode if mode != 'auto' else 'all' if fits else 'per-workers') == 'all':
        return [servers], (f'all {len(servers)} servers up together; rounds rotate across every cell (about {need} '
                           f'PostgreSQL sessions of max_connections {max_connections})')
    groups: dict[int, list[Server]] = {}
    for s in servers:
        groups.setdefault(s.workers, []).append(s)
    why = (f'the servers of one worker count at a time (about {need} sessions would exceed max_connections '
           f'{max_connections})' if not fits else 'the servers of one worker count at a time (--servers per-workers)')
    return list(groups.values()), why + '; rounds rotate within each worker count'


def run_group(block, group: list[Server], args, ctx: dict, progress: dict):
    live = []
    try:
        for server in group:
            log(f'starting {server.label} on CPU {cpus_text(server.cpus)} (port {server.port})')
            server.target = start_server(server, ctx)
            live.append(server)
        for server in live:
            ready(server, ctx['secrets'][server.target_name])
            ctx['run'].meta['targets'].append({**server.target.summary(), 'label': server.label})
        ctx['run'].save()
        for server in live if args.warmup > 0 else []:
            record = block.measure(server.target, kind='warmup', connections=WARMUP_CONNECTIONS,
                                   duration_s=args.warmup, **server.tags())
            log(progress_line(record, f'warm-up {server.label}:'))
        floor(block, live, 'before', args)
        for r in range(args.rounds):
            order = rotated(live, r)
            for position, server in enumerate(order):
                others = [s.target for s in live if s is not server]
                record = block.measure(server.target, kind='run', round=r + 1, position=position,
                                       connections=args.conns_per_worker * server.workers, duration_s=args.duration,
                                       order=[s.label for s in order], **server.tags(),
                                       probes=[harness.WorkerShares(server.target.pids[0]), Frozen(others)])
                progress['done'] += 1
                log(progress_line(record, f'round {r + 1}/{args.rounds} w={server.workers}') +
                    f'  [{progress["done"]}/{progress["total"]}]')
        floor(block, live, 'after', args)
    finally:
        for server in reversed(live):
            targets.stop_process(server.target.process)


def floor(block, live: list[Server], phase: str, args):
    """/health floors on the 1-worker servers, the others frozen."""
    for server in [s for s in live if s.workers == 1] if args.floor_duration > 0 else []:
        record = block.measure(server.target, kind='floor', phase=phase, connections=args.floor_connections,
                               duration_s=args.floor_duration, health=True, **server.tags(),
                               probes=[Frozen([s.target for s in live if s is not server])])
        log(progress_line(record, f'/health floor {phase} {server.label}:'))


def parse_args(argv=None):
    parser = harness.parser_for(BLOCK, __doc__)
    add = parser.add_argument
    harness.add_data_source(parser, local_pg_port=54520)
    harness.add_run_options(parser, cpus=False)
    add('--targets', default='gateway,peer', help='comma list of gateway, peer (default both)')
    add('--max-workers', type=int, default=0, help='largest worker count (default: the CPUs this process may use)')
    add('--conns-per-worker', type=int, default=32, help='wrk connections per worker (default 32)')
    add('--max-id', type=int, default=1_000_000)
    add('--wrk-threads', type=int, default=1, help='wrk threads (one per load core on a big machine: a thread checks '
        'every body it reads)')
    add('--gateway-cpus', default=None, help='the cores workers take, in order (w workers get the first w); '
        'default: the cores wrk and PostgreSQL do not use first, then the shared ones')
    add('--servers', choices=('auto', 'all', 'per-workers'), default='auto')
    add('--base-port', type=int, default=18100)
    add('--redis-url', default=None, help='default: a throwaway redis-server started here')
    add('--redis-port', type=int, default=18380)
    add('--gateway-root', type=Path, default=REPO)
    add('--no-plots', action='store_true', help='skip the PNG plots')
    args = harness.parse(parser, argv)
    args.targets = [t.strip() for t in args.targets.split(',') if t.strip()]
    if not args.targets or set(args.targets) - {'gateway', 'peer'}:
        parser.error('--targets: a comma list of gateway, peer')
    if args.conns_per_worker < 1:
        parser.error('--conns-per-worker must be positive')
    args.gateway_root, args.keep_stores = args.gateway_root.resolve(), False
    return args


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if 'gateway' in args.targets and targets.gateway_available(args.gateway_root):
        raise SystemExit(f'gateway: {targets.gateway_available(args.gateway_root)}')
    if 'peer' in args.targets and not peer.GUNICORN.exists():
        raise SystemExit('the peer is not installed: run `.venv/bin/python -m loadtests.peer setup` '
                         '(or --targets gateway)')
    return harness.run_block(BLOCK, args, [BLOCK, *argv], body, lambda d: write_report(d, plots=not args.no_plots),
                             errors=(OSError,))


def body(run) -> None:
    args, meta = run.args, run.meta
    usable = sorted(os.sched_getaffinity(0))
    others = set(cpu_list(args.load_cpu)) | set(cpu_list(args.pg_cpu))
    # the cores the workers take, in order: first those neither wrk nor PostgreSQL use, the shared ones last
    order = cpu_list(args.gateway_cpus) or [c for c in usable if c not in others] + [c for c in usable if c in others]
    max_workers = min(args.max_workers or len(usable), len(order))
    counts = worker_counts(max(1, max_workers))
    own = [c for c in order if c not in others]
    servers = [Server(name, w, order[:w], args.base_port + n, others)
               for n, (w, name) in enumerate((w, name) for w in counts for name in args.targets)]
    max_connections = int(system.pg_query(args.database_url, 'SHOW max_connections')[0][0])
    groups, grouping = plan_groups(servers, args.servers, max_connections)
    if max_workers > len(own):
        meta['notes'].append(f'Not enough cores for a clean scale-out: from {len(own) + 1} workers on, gateway workers '
                             f'share CPU(s) {cpus_text(sorted(others))} with wrk and PostgreSQL, so those cells measure '
                             'contention as well as scaling; their efficiency is a lower bound, not the gateway\'s.')
    if args.max_workers and args.max_workers > len(order):
        meta['notes'].append(f'--max-workers {args.max_workers} asked for more workers than the {len(order)} cores '
                             f'here: capped at {max_workers}.')
    meta['notes'].append('wrk is a closed loop: this block measures throughput; latency against offered load (open '
                         'loop, latency-corrected) needs oha (loadtests/oha/).')
    meta['settings'] = {
        'rounds': args.rounds, 'duration_s': args.duration, 'worker_counts': counts,
        'conns_per_worker': args.conns_per_worker, 'wrk_threads': args.wrk_threads, 'idle_servers': 'frozen',
        'warmup_s': args.warmup, 'warmup_connections': WARMUP_CONNECTIONS, 'floor_s': args.floor_duration,
        'floor_connections': args.floor_connections, 'max_id': args.max_id, 'targets': args.targets,
        'load_cpu': args.load_cpu, 'pg_cpu': args.pg_cpu, 'gateway_cpu_order': order, 'shared_cpus': sorted(others),
        'grouping': grouping, 'pinning_note': run.pg_note,
        'cores_note': f'{len(usable)} CPUs usable ({cpus_text(usable)}); wrk on {args.load_cpu}, PostgreSQL and Redis '
                      f'on {args.pg_cpu}; gateway workers take {cpus_text(order)} in that order, so {len(own)} '
                      f'core(s) ({cpus_text(own) or "none"}) are the gateway\'s alone',
        'admission': f'gateway: shared admission ON (Redis leases), key rate_limit {HUGE_RATE}, quota '
                     f'{HUGE_QUOTA["calls"]:,} calls/day; peer: a plain key'}
    run.save()
    ctx = {'args': args, 'run': run, 'work_dir': run.work_dir, 'cleanup': run.cleanup, 'secrets': {},
           'gateway_admin': 'adm_' + secrets.token_urlsafe(24), 'gateway_secret': secrets.token_urlsafe(32),
           'peer_admin': 'adm_' + secrets.token_urlsafe(24), 'redis_url': args.redis_url}
    for name, store in (('gateway', 'gwstore'), ('peer', 'qagstore')):
        if name in args.targets:
            ctx[f'{name}_store'] = system.dsn_with_db(args.database_url, store)
            system.recreate_database(args.database_url, store)
    if 'gateway' in args.targets and not ctx['redis_url']:
        process, ctx['redis_url'] = targets.start_redis(port=args.redis_port, cpu=args.pg_cpu, run_dir=run.work_dir)
        run.cleanup.append(process)
        log(f'redis-server at {ctx["redis_url"]} (CPU {args.pg_cpu})')
    for name in args.targets:   # each store provisioned once, through a 1-worker server started for it
        first = next(s for s in servers if s.target_name == name)
        probe = Server(name, 1, first.cpus[:1], system.free_port(), set())   # not base+n: --redis-port may be there
        log(f'provisioning {name}\'s store through a 1-worker server on port {probe.port}')
        target = start_server(probe, {**ctx, 'work_dir': run.work_dir / 'provision'})
        try:
            steps = provision_first(target, args.database_url, limits=(name == 'gateway'))
        finally:
            targets.stop_process(target.process)
        ctx['secrets'][name] = steps.pop('secret')
        meta.setdefault('provisioned', {})[name] = steps
    progress = {'done': 0, 'total': args.rounds * len(servers)}
    for group in groups:
        run_group(run.block, group, args, ctx, progress)
