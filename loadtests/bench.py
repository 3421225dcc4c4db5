"""The benchmark harness: interleaved rounds of wrk against every target, medians with ranges.

    .venv/bin/python -m loadtests.bench --database-url postgresql://postgres@127.0.0.1:54500/demo \\
        --targets peer,gateway --rounds 5 --duration 10
    .venv/bin/python -m loadtests.bench --block admission --local-pg /tmp/bench-pg
    .venv/bin/python -m loadtests.bench scaleout|oha|faults|controlplane|cache ...   # blocks with their own --help

Blocks (loadtests/blocks/<name>/: run.py, render.py): `oltp` (the default), `admission`, `sync`, `logging` and
`limits` run here with the arguments below; `scaleout`, `oha`, `faults`, `controlplane` and `cache` take their own.
Block `oltp`: the saved query `account` (SELECT aid, bid, abalance FROM pgbench_accounts WHERE aid = :aid) called as
GET /q/account?aid=<random 1..1,000,000> with an X-API-Key, at 32 connections and at 1.

The method is QueryAPIGate's own (Performance, v3), so our numbers and theirs mean the same thing: every target
started by the harness on its own core, its store in its own database, provisioned through its Management API with
the same bodies (targets.py); a warm-up per target, a /health floor before and after; rounds in which every cell
runs once, targets in an order rotated each round; per run wrk's requests/s and exact percentiles, every error (a
run with any non-2xx, socket error or wrong body fails the block), and the CPU of the target's processes, of
PostgreSQL, of wrk and of everything else. Output: loadtests/results/<block>-<timestamp>/ (results.jsonl, meta.json,
results.md; `python -m loadtests.report <dir>` renders it again). loadtests/README.md says more.

wrk is a closed loop. Latency against an offered rate (open loop, latency-corrected, free of coordinated omission)
needs oha, which cannot be installed here: this harness doesn't claim it.
"""
from __future__ import annotations

import sys
from pathlib import Path

from . import blocks, peer, report, targets
from .harness import WARMUP_CONNECTIONS, add_data_source, add_run_options, parse, parser_for, run_block
from .system import REPO

KNOWN_TARGETS = ('peer', 'gateway', 'base')
DEFAULT_CONNECTIONS = {'oltp': '32,1', 'admission': '32', 'sync': '8', 'logging': '32', 'limits': '32,1'}
ONE_GATEWAY = ('admission', 'logging', 'limits', 'sync')     # blocks of their own targets: --targets is not theirs


def parse_args(argv=None):
    parser = parser_for('', __doc__)
    add = parser.add_argument
    add('--block', choices=blocks.FRAMED, default='oltp', help='the block (loadtests/blocks/<name>/); scaleout, oha, '
        'faults, controlplane and cache: `python -m loadtests.bench NAME --help`')
    add_data_source(parser, local_pg_port=54510)
    add('--targets', default='peer,gateway', help='comma list of: peer (QueryAPIGate 0.43.0), gateway (ours), base '
        '(ours from --base-root: an older build in the same run). Default: peer,gateway')
    add_run_options(parser)
    add('--connections', default=None, help='wrk -c values, one cell each (default: 32,1 for oltp and limits, 32 for '
        'admission and logging, 8 for sync: the background load of its "loaded" cells, 0 for none)')
    add('--max-id', type=int, default=1_000_000, help='keys are drawn from 1..max-id')
    add('--peer-port', type=int, default=18001, help='the peer (and the limits block\'s limits-qag)')
    add('--gateway-port', type=int, default=18002)
    add('--peer-cache-ttl', default=peer.METADATA_CACHE_TTL,
        help='QUERYAPIGATE_METADATA_CACHE_TTL for the peer (default 5; 0 turns its cache off)')
    add('--redis-url', default=None, help='Redis for our gateway; default: a throwaway redis-server started here')
    add('--redis-port', type=int, default=18379)
    add('--gateway-root', type=Path, default=REPO, help='checkout of our gateway to run (default: this repo)')
    add('--base-root', type=Path, default=None, help='for the `base` target: a checkout of an older commit')
    add('--base-port', type=int, default=18003)
    add('--keep-stores', action='store_true', help='reuse the targets\' store databases instead of recreating them')
    add('--changes', type=int, default=200, help='sync block: management changes per run (default 200)')
    add('--sync-workers', type=int, default=4, help='sync block: GATEWAY_WORKERS (default 4)')
    add('--sync-pause-ms', type=float, default=10, help='sync block: pause between two changes (default 10 ms)')
    add('--mix', choices=('uniform', 'skewed', 'both'), default='uniform',
        help='limits block: the load (loadtests/blocks/limits/mixes.py): uniform (1,000 keys, 1,000 addresses), '
             'skewed (10,000 keys, the hottest 1%% making half the calls, 10,000 addresses), or both in one run')
    add('--keys', type=int, default=None, help='limits block: at most this many keys per mix (a smoke run; the hot '
        'set keeps its share)')
    add('--qag-keys', type=int, default=None, help='limits block: at most this many keys per mix on limits-qag '
        '(QueryAPIGate 0.43.0 creates n keys in a time in n squared); its hot set stays the mix\'s')
    add('--limits-targets', default='on,off,envoy,qag', help='limits block: comma list of on, off, envoy, qag')
    add('--accuracy-multiples', default='1,2,10',
        help='limits block: offered rate per key over its limit in the accuracy phase (empty: none)')
    add('--accuracy-keys', type=int, default=4, help='limits block: hot keys the accuracy phase drives (default 4)')
    add('--accuracy-duration', type=float, default=5, help='limits block: seconds per accuracy run (default 5)')
    args = parse(parser, argv)
    args.gateway_root = args.gateway_root.resolve()
    args.targets = ['gateway'] if args.block in ONE_GATEWAY else [t.strip() for t in args.targets.split(',')
                                                                    if t.strip()]
    if set(args.targets) - set(KNOWN_TARGETS) or not args.targets or len(set(args.targets)) != len(args.targets):
        parser.error(f'--targets: a comma list of {", ".join(KNOWN_TARGETS)}')
    if 'base' in args.targets:
        if args.base_root is None:
            parser.error('--targets includes base: give --base-root (a checkout of the build to compare with)')
        args.base_root = args.base_root.resolve()
    args.connections = [int(c) for c in (args.connections or DEFAULT_CONNECTIONS[args.block]).split(',')]
    if any(c < (0 if args.block == 'sync' else 1) for c in args.connections):
        parser.error('--connections must be positive (sync: not negative)')
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in blocks.OWN_CLI:  # blocks with arguments of their own: `python -m loadtests.bench scaleout`
        return blocks.run(argv[0]).main(argv[1:])
    args = parse_args(argv)
    if 'gateway' in args.targets and targets.gateway_available(args.gateway_root):
        raise SystemExit(f'--targets includes gateway, but it is {targets.gateway_available(args.gateway_root)}')
    if args.block == 'oltp' and 'peer' in args.targets and not peer.GUNICORN.exists():
        raise SystemExit('the peer is not installed: run `.venv/bin/python -m loadtests.peer setup`')

    def body(run):
        pin = (f'targets (gunicorn master + worker) on CPU {args.target_cpu} (taskset -c); wrk on CPU '
               f'{args.load_cpu} (taskset -c); {run.pg_note}'
               + (f'; Redis on CPU {args.pg_cpu}' if 'gateway' in args.targets and not args.redis_url else ''))
        run.meta['settings'] = {
            'rounds': args.rounds, 'duration_s': args.duration, 'connections': args.connections,
            'warmup_s': args.warmup, 'warmup_connections': WARMUP_CONNECTIONS, 'floor_s': args.floor_duration,
            'floor_connections': args.floor_connections, 'max_id': args.max_id, 'targets': args.targets,
            'baseline': 'peer' if 'peer' in args.targets and len(args.targets) > 1 else None,
            'target_cpu': args.target_cpu, 'load_cpu': args.load_cpu, 'pg_cpu': args.pg_cpu,
            'order_note': 'targets take turns in an order rotated each round; within a round, connections '
                          f'{", ".join(map(str, args.connections))} in that order', 'pinning_note': pin}
        run.meta['notes'].append('wrk is a closed loop: latency against an offered rate (open loop, latency-corrected) '
                                 'needs oha, which is not installable here - no such numbers are claimed.')
        run.save()
        blocks.run(args.block).run(run)   # it starts its targets (into run.cleanup), fills meta['targets'], runs

    return run_block(args.block, args, argv, body, report.write)


if __name__ == '__main__':
    sys.exit(main())
