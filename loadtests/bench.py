"""The benchmark harness: interleaved rounds of wrk against every target, medians with ranges.

    .venv/bin/python -m loadtests.bench --database-url postgresql://postgres@127.0.0.1:54500/demo \\
        --targets peer,gateway --rounds 5 --duration 10
    .venv/bin/python -m loadtests.bench --block admission --local-pg /tmp/bench-pg
    .venv/bin/python -m loadtests.bench scaleout|oha|faults|controlplane|cache ...   # blocks with their own --help

Blocks (loadtests/blocks/<name>/: run.py, render.py): `oltp` (the default), `admission`, `sync` and `logging` run
here with the arguments below; `scaleout`, `oha`, `faults`, `controlplane` and `cache` take their own. Block `oltp`: the saved query
`account` (SELECT aid, bid, abalance FROM pgbench_accounts WHERE aid = :aid) called as GET
/q/account?aid=<random 1..1,000,000> with an X-API-Key, at 32 connections and at 1.

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
- output: loadtests/results/<block>-<timestamp>/ (gitignored; --out to change) with results.jsonl (one line per run,
  written as it goes), meta.json (machine, versions, settings, targets) and results.md (python -m loadtests.report
  <dir> regenerates it).

Pinning on a 2-core machine: the target on CPU 1; PostgreSQL (postmaster and every child, with `taskset -a -p`, before
the targets open their pools, so new backends inherit it), wrk and Redis on CPU 0.

wrk is a closed loop. Latency against an offered rate (open loop, latency-corrected, free of coordinated omission)
needs oha, which cannot be installed here: this harness doesn't claim it.
"""
from __future__ import annotations

import argparse
import shlex
import signal
import sys
from pathlib import Path

from . import blocks, peer, report, rundir, system, targets, wrk
from .harness import (
    WARMUP_CONNECTIONS,
    Block,
    add_data_source,
    collect_versions,
    ensure_data,
    local_postgres,
    log,
    now_iso,
    pin_postgres,
    require_clean_tree,
)
from .system import REPO
from .targets import TargetError

KNOWN_TARGETS = ('peer', 'gateway', 'base')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog='python -m loadtests.bench', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--block', choices=blocks.FRAMED, default='oltp',
                        help='the block (loadtests/blocks/<name>/); scaleout, oha, faults, controlplane and cache: `python -m '
                             'loadtests.bench NAME --help`')
    add_data_source(parser, local_pg_port=54510)
    parser.add_argument('--targets', default='peer,gateway',
                        help='comma list of: peer (QueryAPIGate 0.43.0), gateway (ours), base (ours from --base-root: '
                             'an older build in the same run). Default: peer,gateway')
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
    parser.add_argument('--peer-port', type=int, default=18001, help='the peer (and the limits block\'s limits-qag)')
    parser.add_argument('--gateway-port', type=int, default=18002)
    parser.add_argument('--peer-cache-ttl', default=peer.METADATA_CACHE_TTL,
                        help='QUERYAPIGATE_METADATA_CACHE_TTL for the peer (default 5; 0 turns its cache off)')
    parser.add_argument('--redis-url', default=None,
                        help='Redis for our gateway; default: a throwaway redis-server started by the harness')
    parser.add_argument('--redis-port', type=int, default=18379)
    parser.add_argument('--gateway-root', type=Path, default=REPO,
                        help='checkout of our gateway to run (default: this repo); e.g. a `git worktree` of an older '
                             'commit, to compare builds')
    parser.add_argument('--base-root', type=Path, default=None,
                        help='for the `base` target: a checkout of an older commit (e.g. a `git worktree`)')
    parser.add_argument('--base-port', type=int, default=18003)
    parser.add_argument('--keep-stores', action='store_true',
                        help='reuse the targets\' store databases instead of recreating them empty')
    parser.add_argument('--changes', type=int, default=200,
                        help='sync block: management changes per run (default 200)')
    parser.add_argument('--sync-workers', type=int, default=4, help='sync block: GATEWAY_WORKERS (default 4)')
    parser.add_argument('--sync-pause-ms', type=float, default=10,
                        help='sync block: pause between two changes (default 10 ms)')
    parser.add_argument('--mix', choices=('uniform', 'skewed', 'both'), default='uniform',
                        help='limits block: the load (loadtests/blocks/limits/mixes.py): uniform (1,000 keys, '
                             '1,000 addresses, the default), skewed (10,000 keys, the hottest 1%% making half the '
                             'calls, 10,000 addresses), or both in one run')
    parser.add_argument('--keys', type=int, default=None,
                        help='limits block: at most this many keys per mix (default: the mix\'s own, 1,000 or '
                             '10,000; fewer for a smoke run, the hot set keeping its share)')
    parser.add_argument('--qag-keys', type=int, default=None,
                        help='limits block: at most this many keys per mix on limits-qag (QueryAPIGate 0.43.0 '
                             'creates n keys in a time in n squared: 10,000 take over an hour here); its hot set '
                             'stays the mix\'s (default: the mix\'s keys)')
    parser.add_argument('--limits-targets', default='on,off,envoy,qag',
                        help='limits block: comma list of on, off, envoy, qag (default all four)')
    parser.add_argument('--accuracy-multiples', default='1,2,10',
                        help='limits block: offered rate per key over its limit in the accuracy phase (empty: none)')
    parser.add_argument('--accuracy-keys', type=int, default=4,
                        help='limits block: hot keys the accuracy phase drives (default 4)')
    parser.add_argument('--accuracy-duration', type=float, default=5,
                        help='limits block: seconds per accuracy run (default 5)')
    parser.add_argument('--allow-dirty', action='store_true',
                        help='run from a tree with uncommitted changes (a smoke run; such numbers are not a result)')
    parser.add_argument('--out', type=Path, default=rundir.RESULTS,
                        help='folder for <block>-<timestamp>/ (default loadtests/results/, gitignored)')
    args = parser.parse_args(argv)
    if bool(args.database_url) == bool(args.local_pg):
        parser.error('give one of --database-url and --local-pg')
    args.out = args.out.resolve()
    args.gateway_root = args.gateway_root.resolve()
    if 'base' in (args.targets or ''):
        if args.base_root is None:
            raise SystemExit('--targets includes base: give --base-root (a checkout of the build to compare with)')
        args.base_root = args.base_root.resolve()
    args.targets = [t.strip() for t in args.targets.split(',') if t.strip()]
    unknown = [t for t in args.targets if t not in KNOWN_TARGETS]
    if unknown or not args.targets or len(set(args.targets)) != len(args.targets):
        parser.error(f'--targets: a comma list of {", ".join(KNOWN_TARGETS)}')
    if args.connections is None:
        args.connections = {'oltp': '32,1', 'admission': '32', 'sync': '8', 'logging': '32', 'limits': '32,1'}[args.block]
    args.connections = [int(c) for c in args.connections.split(',')]
    if args.block == 'sync':
        args.targets = ['gateway']
        if any(c < 0 for c in args.connections):
            parser.error('--connections must not be negative')
    elif args.block in ('admission', 'logging', 'limits'):
        args.targets = ['gateway']
    if args.rounds < 1 or args.duration <= 0 or any(c < 1 for c in args.connections if args.block != 'sync'):
        parser.error('--rounds, --duration and --connections must be positive')
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in blocks.OWN_CLI:  # blocks with arguments of their own: `python -m loadtests.bench scaleout`
        return blocks.run(argv[0]).main(argv[1:])
    args = parse_args(argv)
    require_clean_tree(args.allow_dirty)
    for tool in ('wrk', 'taskset'):
        if not system.tool_path(tool):
            raise SystemExit(f'{tool} not found (apt-get install {"wrk" if tool == "wrk" else "util-linux"})')
    if 'gateway' in args.targets and targets.gateway_available(args.gateway_root):
        raise SystemExit(f'--targets includes gateway, but it is {targets.gateway_available(args.gateway_root)}; '
                         'run with --targets peer until it exists')
    if args.block == 'oltp' and 'peer' in args.targets and not peer.GUNICORN.exists():
        raise SystemExit('the peer is not installed: run `.venv/bin/python -m loadtests.peer setup`')

    run_dir, work_dir = rundir.new(args.out, args.block)  # work_dir: logs, homes (gitignored, not results)
    log(f'block {args.block} -> {run_dir} (target logs in {work_dir})')

    with local_postgres(args):
        return _main(args, run_dir, work_dir)


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
    rundir.write_meta(run_dir, meta)

    def on_term(signum, frame):
        raise KeyboardInterrupt(f'signal {signum}')
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)  # also when started in the background, where SIGINT is ignored

    cleanup: list = []
    block = Block(args.block, run_dir, args, pg_root)
    failed = None
    try:
        # the block starts its targets (appending to cleanup what is to stop), fills meta['targets'] and runs
        blocks.run(args.block).run(block, args, work_dir, cleanup, meta, lambda: rundir.write_meta(run_dir, meta))
        meta['finished_at'] = now_iso()
        failed = block.verdict()
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
        rundir.write_meta(run_dir, meta)
        path = report.write(run_dir)
        log(f'report: {path}')
    if failed:
        log(f'FAILED: {failed}')
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
