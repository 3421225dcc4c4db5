"""The benchmark harness: interleaved rounds of wrk against every target, medians with ranges.

    .venv/bin/python -m loadtests.bench --database-url postgresql://postgres@127.0.0.1:54500/demo \\
        --targets peer,gateway --rounds 5 --duration 10

Block `oltp` (the only one so far): the saved query `account` (SELECT aid, bid, abalance FROM pgbench_accounts WHERE
aid = :aid) called as GET /q/account?aid=<random 1..1,000,000> with an X-API-Key, at 32 connections and at 1.

The method is QueryAPIGate's own (Performance, v3), so our numbers and theirs mean the same thing:
- every target is started by the harness, on its own core (taskset), with its store in its own database on the same
  PostgreSQL as the data (peer: qagstore, ours: gwstore, both recreated empty unless --keep-stores), and provisioned
  through its Management API with the same bodies (targets.py);
- a warm-up per target before the block, then a /health floor on every target (before and after the block);
- rounds: in each round every cell (target x connections) runs once; targets take turns in an order rotated each
  round (A B, then B A), so none always runs first; 5 rounds per cell by default;
- per run: wrk's requests/s and exact p50/p90/p99/p99.9 (Lua done() hook), every error (a run with any non-2xx or
  socket error is flagged `ok: false` and listed in the report), the CPU seconds of the target's processes (gunicorn
  master + workers, from /proc) and PostgreSQL's, and wrk's own CPU;
- output: loadtests/results/<block>-<timestamp>/results.jsonl (one line per run, written as it goes), meta.json
  (machine, versions, settings, targets) and results.md (python -m loadtests.report <dir> regenerates it).

Pinning on a 2-core machine: the target on CPU 1; PostgreSQL (postmaster and every child, with `taskset -a -p`, before
the targets open their pools, so new backends inherit it), wrk and Redis on CPU 0.

wrk is a closed loop. Latency against an offered rate (open loop, latency-corrected, free of coordinated omission)
needs oha, which cannot be installed here: this harness doesn't claim it.
"""
from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from . import peer, report, system, targets, wrk
from .system import REPO
from .targets import Target, TargetError

# admission: loadtests/admission.py; sync: loadtests/sync.py; logging: loadtests/logging_bench.py
BLOCKS = ('oltp', 'admission', 'sync', 'logging')
SUBCOMMANDS = {'scaleout': 'scaleout', 'openloop': 'oha.openloop'}  # first argument -> a module with main()
KNOWN_TARGETS = ('peer', 'gateway')
STORE_DB = {'peer': 'qagstore', 'gateway': 'gwstore'}
WARMUP_CONNECTIONS = 8
NOISY_CORES = 0.10  # CPU of other processes during a run above which the progress line and report point it out


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec='seconds')


def log(message: str):
    print(f'[{datetime.now().strftime("%H:%M:%S")}] {message}', flush=True)


class Block:
    """One block's runs, written to results.jsonl as they happen."""

    def __init__(self, name: str, run_dir: Path, args, pg_root: int | None):
        self.name = name
        self.run_dir = run_dir
        self.args = args
        self.pg_root = pg_root
        self.results = (run_dir / 'results.jsonl').open('a')
        self.done = 0
        self.planned = 0
        self.started = time.monotonic()

    def close(self):
        self.results.close()

    def measure(self, target: Target, *, kind: str, connections: int, duration_s: float, health: bool = False,
                probes=(), **tags) -> dict:
        """One wrk run. `probes`: extra meters with start() and finish(record) -> dict of fields to add."""
        if target.process is not None and target.process.poll() is not None:
            raise TargetError(f'{target.name} has exited ({target.process.returncode}):\n'
                              + targets.log_tail(target.log_path))
        cpu_machine = system.MachineMeter()
        cpu_target = system.CpuMeter(*target.pids)
        cpu_pg = system.CpuMeter(self.pg_root) if self.pg_root else None
        env = {'API_KEY': target.api_key, 'QUERY_PATH': target.query_path, 'PARAM': target.param,
               'MAX_ID': str(self.args.max_id)}
        started_at = now_iso()
        wall = time.monotonic()
        cpu_machine.start()
        cpu_target.start()
        if cpu_pg:
            cpu_pg.start()
        for probe in probes:
            probe.start()
        result = wrk.run(target.url('/health' if health else '/'), connections=connections, duration_s=duration_s,
                         script=wrk.HEALTH if health else wrk.RANDOM_AID, env=None if health else env,
                         cpu=self.args.load_cpu, timeout_s=self.args.wrk_timeout)
        target_cpu = cpu_target.stop()
        pg_cpu = cpu_pg.stop() if cpu_pg else None
        machine_cpu = cpu_machine.stop()
        other_cpu = machine_cpu - (target_cpu or 0) - (pg_cpu or 0) - result.wrk_cpu_s
        problems = wrk.errors_of(result)
        record = {
            'block': self.name, 'kind': kind, **tags, 'target': target.name, 'connections': connections,
            'path': '/health' if health else target.query_path, **result.to_dict(),
            'ok': not problems, 'problems': problems,
            'target_cpu_s': None if target_cpu is None else round(target_cpu, 3),
            'target_cores': None if target_cpu is None else round(target_cpu / result.duration_s, 3),
            'cpu_us_per_call': (round(target_cpu / result.requests * 1e6, 1)
                                if target_cpu is not None and result.requests else None),
            'pg_cpu_s': None if pg_cpu is None else round(pg_cpu, 3),
            'machine_cpu_s': round(machine_cpu, 3),
            'other_cores': round(max(0.0, other_cpu) / result.duration_s, 3),  # everything else on the machine
            'wrk_text': wrk.parse_text(result.text),  # wrk's own rounded summary, a cross-check of the JSON
            'started_at': started_at, 'wall_s': round(time.monotonic() - wall, 3),
        }
        for probe in probes:
            record.update(probe.finish(record))
        self.results.write(json.dumps(record) + '\n')
        self.results.flush()
        return record


def progress_line(record: dict, prefix: str) -> str:
    lat = record['latency_us']
    line = (f'{prefix} {record["target"]} c={record["connections"]}: {record["rps"]:,.0f} req/s, '
            f'p50 {lat["50"] / 1000:.2f} ms, p99 {lat["99"] / 1000:.2f} ms')
    if record.get('cpu_us_per_call') is not None:
        line += f', {record["cpu_us_per_call"]:,.0f} µs CPU/call ({record["target_cores"]:.2f} cores)'
    if record.get('other_cores', 0) > NOISY_CORES:
        line += f'  (other processes: {record["other_cores"]:.2f} cores)'
    if not record['ok']:
        line += '  ⚠ ' + '; '.join(record['problems'])
    return line


def rotated(items: list, round_index: int) -> list:
    k = round_index % len(items)
    return items[k:] + items[:k]


# --------------------------------------------------------------------------------------
# The oltp block
# --------------------------------------------------------------------------------------

def run_oltp(block: Block, live: list[Target], args):
    run_rounds(block, live, args)


def run_rounds(block: Block, live: list[Target], args, probes: dict | None = None, extra=lambda record: ''):
    """The method every closed-loop block shares: a warm-up per target, a /health floor,
    rounds in which every cell (connections x target) runs once in an order rotated each
    round, and the floor again. ``probes``: per target name, extra meters for each run;
    ``extra``: more text for the progress line."""
    probes = probes or {}
    conns = args.connections
    runs_total = args.rounds * len(conns) * len(live)
    per_run = args.duration + 1.0
    for target in live:
        if args.warmup > 0:
            record = block.measure(target, kind='warmup', connections=WARMUP_CONNECTIONS, duration_s=args.warmup,
                                   **_probes(probes, target))
            log(progress_line(record, 'warm-up') + extra(record))
    floor(block, live, 'before', args)
    done = 0
    for r in range(args.rounds):
        order = rotated(live, r)
        position = 0
        for c in conns:
            for target in order:
                record = block.measure(target, kind='run', round=r + 1, position=position, connections=c,
                                       duration_s=args.duration, order=[t.name for t in order],
                                       **_probes(probes, target))
                position += 1
                done += 1
                left = (runs_total - done) * per_run + (len(live) * (args.floor_duration + 1) if args.floor_duration
                                                        else 0)
                log(progress_line(record, f'round {r + 1}/{args.rounds}') + extra(record) +
                    f'  [{done}/{runs_total}, ~{_duration(left)} left]')
    floor(block, live, 'after', args)


def _probes(probes: dict, target: Target) -> dict:
    return {'probes': probes[target.name]} if target.name in probes else {}


def floor(block: Block, live: list[Target], phase: str, args):
    if args.floor_duration <= 0:
        return
    for target in live:
        record = block.measure(target, kind='floor', phase=phase, connections=args.floor_connections,
                               duration_s=args.floor_duration, health=True)
        log(progress_line(record, f'/health floor {phase}:'))


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f'{seconds // 60}m{seconds % 60:02d}s' if seconds >= 60 else f'{seconds}s'


# --------------------------------------------------------------------------------------
# Setup and teardown
# --------------------------------------------------------------------------------------

def ensure_data(args) -> dict:
    try:
        return system.check_demo_table(args.database_url)
    except RuntimeError as missing:
        if not args.create_data:
            raise SystemExit(f'{missing}.\nCreate it (fleet.demo.create_demo_data, or pgbench -i) or pass '
                             '--create-data to call fleet.demo.create_demo_data(dsn).')
    try:
        from fleet.demo import create_demo_data
    except ImportError as error:
        raise SystemExit(f'--create-data needs fleet.demo.create_demo_data: {error}')
    log('creating the demo data (fleet.demo.create_demo_data)')
    create_demo_data(args.database_url)
    return system.check_demo_table(args.database_url)


def start_targets(args, work_dir: Path, cleanup: list) -> list[Target]:
    live = []
    for name in args.targets:
        store_url = system.dsn_with_db(args.database_url, STORE_DB[name])
        system.recreate_database(args.database_url, STORE_DB[name], drop=not args.keep_stores)
        log(f'starting {name} (store {system.redact(store_url)}, CPU {args.target_cpu})')
        if name == 'peer':
            extra = {'QUERYAPIGATE_METADATA_CACHE_TTL': str(args.peer_cache_ttl)}
            target = peer.start(port=args.peer_port, cpu=args.target_cpu, store_url=store_url, run_dir=work_dir,
                                extra_env=extra)
            target.info['versions'] = peer.installed()
        else:
            redis_url = args.redis_url
            if not redis_url:
                process, redis_url = targets.start_redis(port=args.redis_port, cpu=args.pg_cpu, run_dir=work_dir)
                cleanup.append(process)
                log(f'started redis-server at {redis_url} (CPU {args.pg_cpu})')
            target = targets.start_gateway(port=args.gateway_port, cpu=args.target_cpu, store_url=store_url,
                                           redis_url=redis_url, run_dir=work_dir, root=args.gateway_root)
            cleanup.append(target.process)
            targets.wait_healthy(target)
        if target.process not in cleanup:
            cleanup.append(target.process)
        steps = targets.provision(target, args.database_url)
        target.info['provisioned'] = steps
        log(f'{name} ready at {target.base_url} (pid {target.pids[0]}): {steps["probe"][:80]}')
        live.append(target)
    return live


def pin_postgres(args) -> tuple[int | None, str]:
    pm = system.postmaster_pid(args.database_url)
    if pm is None:
        return None, 'PostgreSQL is not a process on this machine (or not visible): not pinned, not measured'
    if args.pg_cpu in (None, '', 'off'):
        return pm, f'PostgreSQL (postmaster {pm}) not pinned (--pg-cpu off), CPU measured'
    pinned = system.pin_tree(pm, args.pg_cpu)
    return pm, (f'PostgreSQL postmaster {pm} and {len(pinned) - 1} children pinned to CPU {args.pg_cpu} '
                f'(taskset -a -p; new backends inherit it), now {system.affinity(pm)}')


def collect_versions(data: dict) -> dict:
    return {
        'harness': system.venv_versions(Path(sys.executable), ['gunicorn', 'falcon', 'psycopg2-binary', 'sqlglot',
                                                               'orjson', 'redis']),
        'peer': peer.installed(),
        'gateway_fleet': system.our_version(),
        'postgresql': data.get('server_version'),
        'wrk': system.wrk_version(),
        'git': system.git_state(),
    }


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog='python -m loadtests.bench', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--block', choices=BLOCKS, default='oltp')
    parser.add_argument('--database-url',
                        help='postgresql:// URL of the data database (demo, with pgbench_accounts); the targets\' '
                             'stores are created on the same server (needs CREATE DATABASE)')
    parser.add_argument('--local-pg', type=Path, metavar='HOME',
                        help='instead of --database-url: a PostgreSQL of fleet.local.LocalPostgres under HOME '
                             '(started if needed, stopped at the end if the harness started it), its demo database '
                             'filled by fleet.demo.create_demo_data')
    parser.add_argument('--local-pg-port', type=int, default=54510)
    parser.add_argument('--targets', default='peer,gateway',
                        help='comma list of: peer (QueryAPIGate 0.43.0), gateway (ours). Default: both')
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--duration', type=float, default=10, help='seconds per run (default 10)')
    parser.add_argument('--connections', default=None,
                        help='wrk -c values, one cell each (default: 32,1 for oltp, 32 for admission and logging, 8 for sync: '
                             'the background load of its "loaded" cells, 0 for none)')
    parser.add_argument('--warmup', type=float, default=5, help=f'seconds of warm-up per target at '
                        f'{WARMUP_CONNECTIONS} connections before the block (0: none)')
    parser.add_argument('--floor-duration', type=float, default=10, help='seconds of the /health floor (0: none)')
    parser.add_argument('--floor-connections', type=int, default=32)
    parser.add_argument('--max-id', type=int, default=1_000_000, help='keys are drawn from 1..max-id')
    parser.add_argument('--wrk-timeout', type=float, default=None, help='wrk --timeout (its default: 2 s)')
    parser.add_argument('--target-cpu', default='1', help='taskset CPU list of the targets (default 1)')
    parser.add_argument('--load-cpu', default='0', help='taskset CPU list of wrk (default 0)')
    parser.add_argument('--pg-cpu', default='0', help="CPU list to pin PostgreSQL (and Redis) to; 'off' leaves it")
    parser.add_argument('--peer-port', type=int, default=18001)
    parser.add_argument('--gateway-port', type=int, default=18002)
    parser.add_argument('--peer-cache-ttl', default=peer.METADATA_CACHE_TTL,
                        help='QUERYAPIGATE_METADATA_CACHE_TTL for the peer (default 5; 0 turns its cache off)')
    parser.add_argument('--redis-url', default=None,
                        help='Redis for our gateway; default: a throwaway redis-server started by the harness')
    parser.add_argument('--redis-port', type=int, default=18379)
    parser.add_argument('--gateway-root', type=Path, default=REPO,
                        help='checkout of our gateway to run (default: this repo); e.g. a `git worktree` of an older '
                             'commit, to compare builds')
    parser.add_argument('--keep-stores', action='store_true',
                        help='reuse the targets\' store databases instead of recreating them empty')
    parser.add_argument('--create-data', action='store_true',
                        help='if pgbench_accounts is missing, create it with fleet.demo.create_demo_data')
    parser.add_argument('--changes', type=int, default=200,
                        help='sync block: management changes per run (default 200)')
    parser.add_argument('--sync-workers', type=int, default=4, help='sync block: GATEWAY_WORKERS (default 4)')
    parser.add_argument('--sync-pause-ms', type=float, default=10,
                        help='sync block: pause between two changes (default 10 ms)')
    parser.add_argument('--out', type=Path, default=REPO / 'loadtests' / 'results',
                        help='folder for <block>-<timestamp>/ (loadtests/results/tmp/ is gitignored)')
    args = parser.parse_args(argv)
    if bool(args.database_url) == bool(args.local_pg):
        parser.error('give one of --database-url and --local-pg')
    args.out = args.out.resolve()
    args.gateway_root = args.gateway_root.resolve()
    args.targets = [t.strip() for t in args.targets.split(',') if t.strip()]
    unknown = [t for t in args.targets if t not in KNOWN_TARGETS]
    if unknown or not args.targets or len(set(args.targets)) != len(args.targets):
        parser.error(f'--targets: a comma list of {", ".join(KNOWN_TARGETS)}')
    if args.connections is None:
        args.connections = {'oltp': '32,1', 'admission': '32', 'sync': '8', 'logging': '32'}[args.block]
    args.connections = [int(c) for c in args.connections.split(',')]
    if args.block == 'sync':
        args.targets = ['gateway']
        if any(c < 0 for c in args.connections):
            parser.error('--connections must not be negative')
    elif args.block in ('admission', 'logging'):
        args.targets = ['gateway']
    if args.rounds < 1 or args.duration <= 0 or any(c < 1 for c in args.connections if args.block != 'sync'):
        parser.error('--rounds, --duration and --connections must be positive')
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SUBCOMMANDS:  # other blocks with their own harness: `python -m loadtests.bench scaleout`
        import importlib
        return importlib.import_module(f'.{SUBCOMMANDS[argv[0]]}', __package__).main(argv[1:])
    args = parse_args(argv)
    for tool in ('wrk', 'taskset'):
        if not system.tool_path(tool):
            raise SystemExit(f'{tool} not found (apt-get install {"wrk" if tool == "wrk" else "util-linux"})')
    if 'gateway' in args.targets and targets.gateway_available(args.gateway_root):
        raise SystemExit(f'--targets includes gateway, but it is {targets.gateway_available(args.gateway_root)}; '
                         'run with --targets peer until it exists')
    if args.block == 'oltp' and 'peer' in args.targets and not peer.GUNICORN.exists():
        raise SystemExit('the peer is not installed: run `.venv/bin/python -m loadtests.peer setup`')

    stamp = datetime.now().strftime('%Y%m%d-%H%M%S')
    run_dir = args.out / f'{args.block}-{stamp}'
    run_dir.mkdir(parents=True, exist_ok=False)
    work_dir = REPO / '.bench' / 'runs' / f'{args.block}-{stamp}'  # logs, homes: gitignored, not results
    work_dir.mkdir(parents=True, exist_ok=True)
    log(f'block {args.block} -> {run_dir} (target logs in {work_dir})')

    local_pg = start_local_pg(args) if args.local_pg else None
    try:
        return _main(args, run_dir, work_dir)
    finally:
        if local_pg is not None:
            log(f'stopping the local PostgreSQL under {args.local_pg}')
            local_pg.stop()


def start_local_pg(args):
    """fleet.local's PostgreSQL, as the gateway's embedded default runs it; returns it if the harness started it
    (so it stops it at the end), None if it was already running."""
    from fleet.local import LocalPostgres
    pg = LocalPostgres(args.local_pg, args.local_pg_port)
    was_running = pg.is_running()
    pg.start()
    pg.ensure_database('demo')
    args.database_url = pg.url('demo')
    args.create_data = True
    return None if was_running else pg


def _main(args, run_dir: Path, work_dir: Path) -> int:
    data = ensure_data(args)
    if data['max_aid'] < args.max_id:
        log(f'pgbench_accounts ends at aid {data["max_aid"]}: drawing keys from 1..{data["max_aid"]}')
        args.max_id = data['max_aid']
    data['database_url'] = system.redact(args.database_url)
    pg_root, pg_note = pin_postgres(args)
    log(pg_note)

    meta = {
        'block': args.block, 'started_at': now_iso(), 'finished_at': None,
        'command': ' '.join(shlex.quote(a) for a in [sys.executable, '-m', 'loadtests.bench', *sys.argv[1:]]),
        'settings': {'rounds': args.rounds, 'duration_s': args.duration, 'connections': args.connections,
                     'warmup_s': args.warmup, 'warmup_connections': WARMUP_CONNECTIONS,
                     'floor_s': args.floor_duration, 'floor_connections': args.floor_connections,
                     'max_id': args.max_id, 'targets': args.targets,
                     'baseline': 'peer' if 'peer' in args.targets and len(args.targets) > 1 else None,
                     'target_cpu': args.target_cpu, 'load_cpu': args.load_cpu, 'pg_cpu': args.pg_cpu,
                     'order_note': 'targets take turns in an order rotated each round; within a round, '
                                   f'connections {", ".join(map(str, args.connections))} in that order',
                     'pinning_note': f'targets (gunicorn master + worker) on CPU {args.target_cpu} (taskset -c); '
                                     f'wrk on CPU {args.load_cpu} (taskset -c); {pg_note}'
                                     + ('; Redis on CPU ' + str(args.pg_cpu) if 'gateway' in args.targets
                                        and not args.redis_url else '')},
        'machine': system.machine_info(), 'versions': collect_versions(data), 'data': data, 'targets': [],
        'work_dir': str(work_dir),
        'notes': ['wrk is a closed loop: latency against an offered rate (open loop, latency-corrected) needs oha, '
                  'which is not installable here - no such numbers are claimed.'],
    }
    write_meta(run_dir, meta)

    def on_term(signum, frame):
        raise KeyboardInterrupt(f'signal {signum}')
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)  # also when started in the background, where SIGINT is ignored

    cleanup: list = []
    block = Block(args.block, run_dir, args, pg_root)
    failed = None
    try:
        if args.block == 'oltp':
            live = start_targets(args, work_dir, cleanup)
            meta['targets'] = [t.summary() for t in live]
            write_meta(run_dir, meta)
            run_oltp(block, live, args)
        else:  # blocks that start their own targets
            runner = {'admission': 'loadtests.admission', 'sync': 'loadtests.sync',
                      'logging': 'loadtests.logging_bench'}[args.block]
            import importlib
            importlib.import_module(runner).run(block, args, work_dir, cleanup, meta,
                                                lambda: write_meta(run_dir, meta))
        meta['finished_at'] = now_iso()
    except KeyboardInterrupt as stop:
        failed = f'interrupted ({stop})'
    except (TargetError, wrk.WrkError) as error:
        failed = str(error)
    finally:
        block.close()
        for process in reversed(cleanup):
            targets.stop_process(process)
        if failed:
            meta.setdefault('notes', []).append(f'Stopped early: {failed.splitlines()[0]}')
        write_meta(run_dir, meta)
        path = report.write(run_dir)
        log(f'report: {path}')
    if failed:
        log(f'FAILED: {failed}')
        return 1
    return 0


def write_meta(run_dir: Path, meta: dict):
    (run_dir / 'meta.json').write_text(json.dumps(meta, indent=2, default=str) + '\n')


if __name__ == '__main__':
    sys.exit(main())
