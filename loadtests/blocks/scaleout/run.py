"""The scale-out block: throughput against the number of workers in one gunicorn master, ours and the peer's.

    .venv/bin/python -m loadtests.bench scaleout --local-pg /tmp/bench-pg
    .venv/bin/python -m loadtests.bench scaleout --database-url postgresql://postgres@127.0.0.1:54500/demo \\
        --max-workers 8 --rounds 5 --duration 10

For w = 1, 2, 4, ... up to the cores the gateway may use (and --max-workers), one gunicorn master per target:

- ours: GATEWAY_WORKERS=w, GATEWAY_CPUS=<w cores> (each worker pinned to its own core by fleet/gunicorn_conf.py;
  the master under taskset on the same cores), shared admission ON: a Redis started here, and a key with a rate
  limit and a daily quota far above the load, so every call takes the admission path without ever being refused;
- the peer, QueryAPIGate 0.43.0 (loadtests/peer.py), as its image runs it but with `--workers w`, the master and its
  workers under taskset on the same w cores (it has no per-worker pinning of its own);
- the lookup (GET /q/account?aid=<random>) with wrk at --conns-per-worker x w connections (default 32 x w).

Method (the peer's Performance v3, as every block: loadtests/harness.py): a warm-up per server, a /health floor on
the 1-worker servers before and after, then --rounds rounds (default 5) in which every cell (target x workers) runs
once, in an order rotated each round; medians with [min-max] ranges. Every run records the target's CPU (master +
workers, from /proc), PostgreSQL's, wrk's and everything else's. The report gives per-worker and per-core
throughput, efficiency against linear (throughput(w) / (w x throughput(1))), CPU per call, and which cores each part
had - on a machine without enough cores for the gateway, wrk and PostgreSQL to have their own, it says which runs
shared.

Servers: all of them are started at once and stay up (so rounds can rotate across every cell) when PostgreSQL's
max_connections allows; otherwise (--servers per-workers, or auto when it does not fit) the servers of one worker
count run at a time, and rounds rotate within each worker count. Our gateways share one store and one Redis (they
act as one fleet, as deployed); the peers share one store.

Output: loadtests/results/scaleout-<timestamp>/ (--out) with results.jsonl, meta.json, results.md and scaleout.png
(loadtests/blocks/scaleout/render.py). `python -m loadtests.report <dir>` regenerates results.md and the plot.
"""
from __future__ import annotations

import argparse
import os
import secrets
import shlex
import signal
import sys
import time
from pathlib import Path

from ... import peer, rundir, system, targets, wrk
from ...harness import (
    WARMUP_CONNECTIONS,
    Block,
    Frozen,
    WorkerShares,
    add_data_source,
    collect_versions,
    ensure_data,
    local_postgres,
    log,
    now_iso,
    pin_postgres,
    progress_line,
    require_clean_tree,
    rotated,
)
from ...rundir import write_meta
from ...system import REPO
from ...targets import Target, TargetError
from .render import write as write_report

BLOCK = 'scaleout'
THREADS = 8                      # both targets' default threads per worker
PG_SESSIONS_PER_WORKER = THREADS + 4   # data pool + store + bus/history, roughly: for the max_connections check
HUGE_RATE = '1000000/second'
HUGE_QUOTA = {'calls': 1_000_000_000_000, 'per': 'day'}


def worker_counts(max_workers: int) -> list[int]:
    counts, w = [], 1
    while w <= max_workers:
        counts.append(w)
        w *= 2
    if counts[-1] != max_workers:
        counts.append(max_workers)
    return counts


def cpu_list(text: str | None) -> list[int]:
    if text in (None, '', 'off'):
        return []
    from gateway.settings import parse_cpu_list
    return parse_cpu_list(text)


def cpus_text(cpus: list[int]) -> str:
    return ','.join(str(c) for c in cpus)


def gateway_cpu_order(args) -> tuple[list[int], set[int]]:
    """The cores the gateway's workers take, in order: first those neither wrk nor PostgreSQL use; the shared ones
    last. Returns (order, the cores the load generator and the database use)."""
    usable = sorted(os.sched_getaffinity(0))
    others = set(cpu_list(args.load_cpu)) | set(cpu_list(args.pg_cpu))
    if args.gateway_cpus:
        order = cpu_list(args.gateway_cpus)
    else:
        order = [c for c in usable if c not in others] + [c for c in usable if c in others]
    return order, others


# --------------------------------------------------------------------------------------
# Servers
# --------------------------------------------------------------------------------------

class Server:
    """One gunicorn master of one target with w workers."""

    def __init__(self, target_name: str, workers: int, cpus: list[int], port: int, shared_with: set[int]):
        self.target_name = target_name
        self.workers = workers
        self.cpus = cpus
        self.port = port
        self.shared = sorted(set(cpus) & shared_with)
        self.target: Target | None = None

    @property
    def label(self) -> str:
        return f'{self.target_name} w={self.workers}'

    def tags(self) -> dict:
        return {'workers': self.workers, 'cpus': cpus_text(self.cpus), 'shared_cpus': cpus_text(self.shared)}


def start_server(server: Server, args, ctx: dict) -> Target:
    run_dir = ctx['work_dir'] / f'{server.target_name}-w{server.workers}'
    cpus = cpus_text(server.cpus)
    if server.target_name == 'gateway':
        target = targets.start_gateway(
            port=server.port, cpu=cpus, store_url=ctx['gateway_store'], redis_url=ctx['redis_url'], run_dir=run_dir,
            admin_key=ctx['gateway_admin'], root=args.gateway_root,
            extra_env={'GATEWAY_WORKERS': str(server.workers), 'GATEWAY_SECRET_KEY': ctx['gateway_secret'],
                       'GATEWAY_INSTANCE': f'so-w{server.workers}', 'GATEWAY_ADMISSION': 'on',
                       'GATEWAY_THREADS': str(THREADS)})
        target.description = f'gateway-fleet (this repo), {server.workers} worker(s) pinned one per core'
        ctx['cleanup'].append(target.process)
        targets.wait_healthy(target)
    else:
        target = start_peer(server, run_dir, ctx)
        ctx['cleanup'].append(target.process)
    target.info.update(server.tags())
    return target


def start_peer(server: Server, run_dir: Path, ctx: dict) -> Target:
    """loadtests/peer.py's command with --workers w (the rest as its image runs it)."""
    home = run_dir / 'peer-home'
    home.mkdir(parents=True, exist_ok=True)
    cmd = peer.command(server.port, home / 'gunicorn.ctl')
    cmd[cmd.index('--workers') + 1] = str(server.workers)
    env = peer.environment(ctx['peer_store'], ctx['peer_admin'], home)
    log_path = run_dir / 'peer.log'
    process = targets.start_process(cmd, env=env, cwd=home, log_path=log_path, cpu=cpus_text(server.cpus))
    target = Target(name='peer', base_url=f'http://127.0.0.1:{server.port}', admin_key=ctx['peer_admin'],
                    pids=[process.pid], process=process, log_path=log_path,
                    description=f'QueryAPIGate {peer.VERSION}, {server.workers} worker(s), {THREADS} threads, '
                                'taskset on the same cores (no per-worker pinning)',
                    info={'command': ' '.join(cmd), 'cpu': cpus_text(server.cpus),
                          'env': {k: ('***' if k == 'QUERYAPIGATE_API_KEY' else system.redact(v))
                                  for k, v in env.items() if k.startswith('QUERYAPIGATE_')}})
    try:
        targets.wait_healthy(target)
    except Exception:
        targets.stop_process(process)
        raise
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
    key = targets.key_body()
    if limits:
        key = {**key, 'rate_limit': HUGE_RATE, 'quota': HUGE_QUOTA}
    targets.management(target, 'DELETE', f'/api-keys/{targets.KEY}')
    status, answer = targets.management(target, 'POST', '/api-keys', key)
    if status != 201 or not isinstance(answer, dict) or not answer.get('secret'):
        raise TargetError(f'{target.name}: create key answered {status}: {str(answer)[:400]}')
    steps['key'] = {k: v for k, v in key.items() if k != 'name'}
    steps['secret'] = answer['secret']
    return steps


def ready(server: Server, secret: str) -> str:
    """Give the server its key and check one call answers (headers of admission included, for ours)."""
    target = server.target
    target.api_key = secret
    deadline = time.monotonic() + 15
    while True:
        try:
            return targets.probe(target)
        except TargetError:
            if time.monotonic() > deadline:   # a new master loads the catalog as it starts; give it a moment
                raise
            time.sleep(0.5)


# --------------------------------------------------------------------------------------
# The block
# --------------------------------------------------------------------------------------

def plan_groups(servers: list[Server], args, max_connections: int | None) -> tuple[list[list[Server]], str]:
    """Which servers run together: all (one group), or one group per worker count."""
    need = sum(s.workers for s in servers) * PG_SESSIONS_PER_WORKER + 10
    fits = max_connections is None or need <= max_connections
    mode = args.servers if args.servers != 'auto' else ('all' if fits else 'per-workers')
    if mode == 'all':
        why = (f'all {len(servers)} servers up together; rounds rotate across every cell (about {need} PostgreSQL '
               f'sessions of max_connections {max_connections})')
        return [servers], why
    groups: dict[int, list[Server]] = {}
    for s in servers:
        groups.setdefault(s.workers, []).append(s)
    why = (f'the servers of one worker count at a time (about {need} sessions would exceed max_connections '
           f'{max_connections})' if not fits else 'the servers of one worker count at a time (--servers per-workers)')
    return list(groups.values()), why + '; rounds rotate within each worker count'


def run_group(block: Block, group: list[Server], args, ctx: dict, progress: dict):
    live = []
    try:
        for server in group:
            log(f'starting {server.label} on CPU {cpus_text(server.cpus)} (port {server.port})')
            server.target = start_server(server, args, ctx)
            live.append(server)
        for server in live:
            ready(server, ctx['secrets'][server.target_name])
            ctx['meta']['targets'].append({**server.target.summary(), 'label': server.label})
        write_meta(block.run_dir, ctx['meta'])
        for server in live:
            if args.warmup > 0:
                record = block.measure(server.target, kind='warmup', connections=WARMUP_CONNECTIONS,
                                       duration_s=args.warmup, **server.tags())
                log(progress_line(record, f'warm-up {server.label}:'))
        floors = [s for s in live if s.workers == 1]
        floor(block, floors, 'before', args, live)
        for r in range(args.rounds):
            order = rotated(live, r)
            for position, server in enumerate(order):
                connections = args.conns_per_worker * server.workers
                extra = _idle_probe([s for s in live if s is not server], args.idle)
                extra.setdefault('probes', []).append(WorkerShares(server.target.pids[0]))
                if args.idle == 'frozen':     # last: the others are continued after every meter has stopped
                    extra['probes'].append(Frozen([s.target for s in live if s is not server]))
                record = block.measure(server.target, kind='run', round=r + 1, position=position,
                                       connections=connections, duration_s=args.duration,
                                       order=[s.label for s in order], **extra, **server.tags())
                progress['done'] += 1
                log(progress_line(record, f'round {r + 1}/{args.rounds} w={server.workers}') +
                    f'  [{progress["done"]}/{progress["total"]}]')
        floor(block, floors, 'after', args, live)
    finally:
        for server in reversed(live):
            targets.stop_process(server.target.process)


class IdleServers:
    """The CPU the block's other (idle) servers used during a run: their bus, history and lease threads. It is
    part of "other cores"; recorded apart so it can be told from the rest of the machine."""

    def __init__(self, servers: list[Server]):
        self.meter = system.CpuMeter(*[p for s in servers for p in s.target.pids])

    def start(self):
        self.meter.start()

    def finish(self, record: dict) -> dict:
        used = self.meter.stop()
        return {'idle_servers_cores': None if used is None else round(used / record['duration_s'], 3)}


def _idle_probe(others: list[Server], idle: str) -> dict:
    """{'probes': [...]} measuring the idle servers' CPU when they keep running, else {}."""
    return {'probes': [IdleServers(others)]} if others and idle == 'running' else {}


def floor(block: Block, servers: list[Server], phase: str, args, live: list[Server]):
    if args.floor_duration <= 0:
        return
    for server in servers:
        others = [s.target for s in live if s is not server]
        record = block.measure(server.target, kind='floor', phase=phase, connections=args.floor_connections,
                               duration_s=args.floor_duration, health=True,
                               probes=[Frozen(others)] if args.idle == 'frozen' else [], **server.tags())
        log(progress_line(record, f'/health floor {phase} {server.label}:'))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog='python -m loadtests.bench scaleout', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_source(parser, local_pg_port=54520)
    parser.add_argument('--targets', default='gateway,peer', help='comma list of gateway, peer (default both)')
    parser.add_argument('--max-workers', type=int, default=0,
                        help='largest worker count (default: the CPUs this process may use)')
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--duration', type=float, default=10, help='seconds per run (default 10)')
    parser.add_argument('--conns-per-worker', type=int, default=32, help='wrk connections per worker (default 32)')
    parser.add_argument('--warmup', type=float, default=5, help='seconds of warm-up per server (0: none)')
    parser.add_argument('--floor-duration', type=float, default=10, help='seconds of each /health floor (0: none)')
    parser.add_argument('--floor-connections', type=int, default=32)
    parser.add_argument('--max-id', type=int, default=1_000_000)
    parser.add_argument('--wrk-timeout', type=float, default=None)
    parser.add_argument('--idle', choices=('frozen', 'running'), default='frozen',
                        help="the servers not being measured: stopped (SIGSTOP) for each run and continued after "
                             "(default), or left running (their CPU is then measured as 'idle servers')")
    parser.add_argument('--wrk-threads', type=int, default=1,
                        help='wrk threads (default 1; give one per load core on a big machine: a thread checks '
                             'every body it reads)')
    parser.add_argument('--gateway-cpus', default=None,
                        help='the cores workers take, in order (w workers get the first w); default: the cores wrk '
                             'and PostgreSQL do not use first, then the shared ones')
    parser.add_argument('--load-cpu', default='0', help='taskset CPU list of wrk (default 0)')
    parser.add_argument('--pg-cpu', default='0', help="CPU list for PostgreSQL and Redis; 'off' leaves them")
    parser.add_argument('--servers', choices=('auto', 'all', 'per-workers'), default='auto')
    parser.add_argument('--base-port', type=int, default=18100)
    parser.add_argument('--redis-url', default=None, help='default: a throwaway redis-server started here')
    parser.add_argument('--redis-port', type=int, default=18380)
    parser.add_argument('--gateway-root', type=Path, default=REPO)
    parser.add_argument('--no-plots', action='store_true', help='skip the PNG plots')
    parser.add_argument('--allow-dirty', action='store_true',
                        help='run from a tree with uncommitted changes (a smoke run; such numbers are not a result)')
    parser.add_argument('--out', type=Path, default=rundir.RESULTS,
                        help='folder for scaleout-<timestamp>/ (default loadtests/results/, gitignored)')
    args = parser.parse_args(argv)
    if bool(args.database_url) == bool(args.local_pg):
        parser.error('give one of --database-url and --local-pg')
    args.targets = [t.strip() for t in args.targets.split(',') if t.strip()]
    if not args.targets or set(args.targets) - {'gateway', 'peer'}:
        parser.error('--targets: a comma list of gateway, peer')
    if args.rounds < 1 or args.duration <= 0 or args.conns_per_worker < 1:
        parser.error('--rounds, --duration and --conns-per-worker must be positive')
    args.out = args.out.resolve()
    args.gateway_root = args.gateway_root.resolve()
    args.keep_stores = False
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    require_clean_tree(args.allow_dirty)
    for tool in ('wrk', 'taskset'):
        if not system.tool_path(tool):
            raise SystemExit(f'{tool} not found')
    if 'gateway' in args.targets and targets.gateway_available(args.gateway_root):
        raise SystemExit(f'gateway: {targets.gateway_available(args.gateway_root)}')
    if 'peer' in args.targets and not peer.GUNICORN.exists():
        raise SystemExit('the peer is not installed: run `.venv/bin/python -m loadtests.peer setup` '
                         '(or --targets gateway)')
    run_dir, work_dir = rundir.new(args.out, BLOCK)
    log(f'block {BLOCK} -> {run_dir} (server logs in {work_dir})')
    with local_postgres(args):
        return _main(args, run_dir, work_dir)


def _max_connections(url: str) -> int | None:
    try:
        conn = system.pg_connect(url)
        try:
            with conn.cursor() as cur:
                cur.execute('SHOW max_connections')
                return int(cur.fetchone()[0])
        finally:
            conn.close()
    except Exception:
        return None


def _main(args, run_dir: Path, work_dir: Path) -> int:
    data = ensure_data(args)
    if data['max_aid'] < args.max_id:
        args.max_id = data['max_aid']
    data['database_url'] = system.redact(args.database_url)
    pg_root, pg_note = pin_postgres(args)
    log(pg_note)

    order, others = gateway_cpu_order(args)
    usable = sorted(os.sched_getaffinity(0))
    max_workers = min(args.max_workers or len(usable), len(order))
    counts = worker_counts(max(1, max_workers))
    own = [c for c in order if c not in others]
    servers, port = [], args.base_port
    for w in counts:
        for name in args.targets:
            servers.append(Server(name, w, order[:w], port, others))
            port += 1
    groups, grouping = plan_groups(servers, args, _max_connections(args.database_url))

    cores_note = (f'{len(usable)} CPUs usable ({cpus_text(usable)}); wrk on {args.load_cpu}, PostgreSQL and Redis on '
                  f'{args.pg_cpu}; gateway workers take {cpus_text(order)} in that order, so '
                  f'{len(own)} core(s) ({cpus_text(own) or "none"}) are the gateway\'s alone')
    honesty = []
    if max_workers > len(own):
        honesty.append(f'Not enough cores for a clean scale-out: from {len(own) + 1} workers on, gateway workers share '
                       f'CPU(s) {cpus_text(sorted(others))} with wrk and PostgreSQL, so those cells measure '
                       'contention as well as scaling; their efficiency is a lower bound, not the gateway\'s.')
    if args.max_workers and args.max_workers > len(order):
        honesty.append(f'--max-workers {args.max_workers} asked for more workers than the {len(order)} cores here: '
                       f'capped at {max_workers}.')
    meta = {
        'block': BLOCK, 'started_at': now_iso(), 'finished_at': None,
        'command': ' '.join(shlex.quote(a) for a in [sys.executable, '-m', 'loadtests.bench', 'scaleout', *args.argv]),
        'settings': {'rounds': args.rounds, 'duration_s': args.duration, 'worker_counts': counts,
                     'conns_per_worker': args.conns_per_worker, 'wrk_threads': args.wrk_threads,
                     'idle_servers': args.idle,
                     'warmup_s': args.warmup,
                     'warmup_connections': WARMUP_CONNECTIONS, 'floor_s': args.floor_duration,
                     'floor_connections': args.floor_connections, 'max_id': args.max_id, 'targets': args.targets,
                     'load_cpu': args.load_cpu, 'pg_cpu': args.pg_cpu, 'gateway_cpu_order': order,
                     'shared_cpus': sorted(others), 'grouping': grouping, 'cores_note': cores_note,
                     'pinning_note': pg_note, 'admission': 'gateway: shared admission ON (Redis leases), key '
                     f'rate_limit {HUGE_RATE}, quota {HUGE_QUOTA["calls"]:,} calls/day; peer: a plain key'},
        'machine': system.machine_info(), 'versions': collect_versions(data), 'data': data, 'targets': [],
        'work_dir': str(work_dir), 'notes': honesty + [
            'wrk is a closed loop: this block measures throughput; latency against offered load (open loop, '
            'latency-corrected) needs oha (loadtests/oha/).'],
    }
    write_meta(run_dir, meta)

    def on_term(signum, frame):
        raise KeyboardInterrupt(f'signal {signum}')
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)

    cleanup: list = []
    ctx = {'work_dir': work_dir, 'cleanup': cleanup, 'meta': meta, 'secrets': {},
           'gateway_admin': 'adm_' + secrets.token_urlsafe(24), 'gateway_secret': secrets.token_urlsafe(32),
           'peer_admin': 'adm_' + secrets.token_urlsafe(24)}
    block = Block(BLOCK, run_dir, args, pg_root)
    failed = None
    try:
        if 'gateway' in args.targets:
            ctx['gateway_store'] = system.dsn_with_db(args.database_url, 'gwstore')
            system.recreate_database(args.database_url, 'gwstore')
            ctx['redis_url'] = args.redis_url
            if not ctx['redis_url']:
                process, ctx['redis_url'] = targets.start_redis(port=args.redis_port, cpu=args.pg_cpu, run_dir=work_dir)
                cleanup.append(process)
                log(f'redis-server at {ctx["redis_url"]} (CPU {args.pg_cpu})')
        if 'peer' in args.targets:
            ctx['peer_store'] = system.dsn_with_db(args.database_url, 'qagstore')
            system.recreate_database(args.database_url, 'qagstore')
        provision_stores(servers, args, ctx)
        progress = {'done': 0, 'total': args.rounds * len(servers)}
        for group in groups:
            run_group(block, group, args, ctx, progress)
        meta['finished_at'] = now_iso()
        failed = block.verdict()
    except KeyboardInterrupt as stop:
        failed = f'interrupted ({stop})'
    except (TargetError, wrk.WrkError, OSError) as error:
        failed = str(error)
    finally:
        block.close()
        for process in reversed(cleanup):
            targets.stop_process(process)
        if failed:
            meta.setdefault('notes', []).append(f'Stopped early: {failed.splitlines()[0]}')
        write_meta(run_dir, meta)
        path = write_report(run_dir, plots=not args.no_plots)
        log(f'report: {path}')
    if failed:
        log(f'FAILED: {failed}')
        return 1
    return 0


def provision_stores(servers: list[Server], args, ctx: dict):
    """Provision each store once, through a 1-worker server started for it and stopped after (the real servers
    load the catalog when they start)."""
    for name in args.targets:
        first = next(s for s in servers if s.target_name == name)
        probe = Server(name, 1, first.cpus[:1], system.free_port(), set())   # not base+n: --redis-port may be there
        log(f'provisioning {name}\'s store through a 1-worker server on port {probe.port}')
        target = start_server(probe, args, {**ctx, 'work_dir': ctx['work_dir'] / 'provision'})
        try:
            steps = provision_first(target, args.database_url, limits=(name == 'gateway'))
        finally:
            targets.stop_process(target.process)
        ctx['secrets'][name] = steps.pop('secret')
        ctx['meta'].setdefault('provisioned', {})[name] = steps

