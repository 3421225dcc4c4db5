"""Block `logging`: what the access log (and the live event stream) cost a call.

    .venv/bin/python -m loadtests.bench --block logging --local-pg /tmp/bench-pg --rounds 5 --duration 10

Three targets, each our gateway with one worker pinned to CPU 1 (`--target-cpu`), its own store database and its
own Redis (PostgreSQL, every Redis server and wrk on CPU 0), provisioned with the same bodies, differing only in:

- `access-log-on`: GATEWAY_ACCESS_LOG=1, GATEWAY_ACCESS_LOG_SAMPLE=1 (every call logged: one JSON line each,
  formatted by the worker's history thread and written by its log listener thread to the target's log file);
- `access-log-off`: GATEWAY_ACCESS_LOG=0 (the baseline);
- `events-off`: GATEWAY_ACCESS_LOG=0 and GATEWAY_EVENTS=0 (no XADD of each history batch to the fleet's event
  stream either). Metrics have no switch: they are on in every target, so this is the floor the gateway's
  observability can reach without a code change.

GATEWAY_LOG_LEVEL=info everywhere (the access log is written at info). The `account` lookup (the oltp block's) at
wrk -c32 (`--connections`), interleaved rounds in an order rotated each round, after a warm-up of each target and
with a /health floor before and after, as the oltp block.

Per run, besides what every block records: the CPU of the gunicorn *worker* process alone (user + system of every
thread, the master left out) per call served, and the access-log lines the target wrote during the run per call
served (about 1 for `access-log-on`, 0 otherwise: proof the switch did what it says). Target: the access log costs
at most 3% of throughput (req/s on/off >= 0.97).
"""
from __future__ import annotations

from pathlib import Path

from . import system, targets
from .admission import WorkerCpu
from .report import false_clear_chance, median_range, overlap, show_range

ON, OFF, BARE = 'access-log-on', 'access-log-off', 'events-off'
TARGETS = (
    (ON, {'GATEWAY_ACCESS_LOG': '1', 'GATEWAY_ACCESS_LOG_SAMPLE': '1.0'}),
    (OFF, {'GATEWAY_ACCESS_LOG': '0'}),
    (BARE, {'GATEWAY_ACCESS_LOG': '0', 'GATEWAY_EVENTS': '0'}),
)
COMMON = {'GATEWAY_LOG_LEVEL': 'info'}
THROUGHPUT_TARGET = 0.97   # access log on / off, req/s


class AccessLines:
    """Access-log lines a target appended to its log file during a run (lines holding a request id)."""

    def __init__(self, log_path: Path):
        self.path = log_path
        self.offset = 0

    def _size(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def start(self):
        self.offset = self._size()

    def finish(self, record: dict) -> dict:
        lines = 0
        try:
            with self.path.open('rb') as log:
                log.seek(self.offset)
                while True:
                    chunk = log.read(1 << 20)
                    if not chunk:
                        break
                    lines += chunk.count(b'"request_id"')
        except OSError:
            return {'access_lines': None, 'access_lines_per_call': None}
        calls = record.get('requests') or 0
        return {'access_lines': lines, 'log_bytes': self._size() - self.offset,
                'access_lines_per_call': round(lines / calls, 3) if calls else None}


def run(block, args, work_dir, cleanup, meta, save_meta):
    from .bench import log, run_rounds
    live, probes = [], {}
    for index, (name, extra) in enumerate(TARGETS):
        extra = {**COMMON, **extra}
        store_db = f'gwstore_log_{index}'
        store_url = system.dsn_with_db(args.database_url, store_db)
        system.recreate_database(args.database_url, store_db, drop=not args.keep_stores)
        process, redis_url = targets.start_redis(port=args.redis_port + index, cpu=args.pg_cpu,
                                                 run_dir=work_dir / name)
        cleanup.append(process)
        target = targets.start_gateway(port=args.gateway_port + index, cpu=args.target_cpu, store_url=store_url,
                                       redis_url=redis_url, run_dir=work_dir / name, extra_env=extra,
                                       root=args.gateway_root)
        cleanup.append(target.process)
        target.name = name
        target.description = f'gateway-fleet, 1 worker, {", ".join(f"{k}={v}" for k, v in extra.items())}'
        targets.wait_healthy(target)
        target.info['provisioned'] = targets.provision(target, args.database_url)
        target.info['redis'] = system.redact(redis_url)
        log(f'{name} ready at {target.base_url} (pid {target.pids[0]}), Redis {redis_url}')
        live.append(target)
        probes[name] = (WorkerCpu(target.pids[0]), AccessLines(target.log_path))
    meta['targets'] = [t.summary() for t in live]
    meta['settings'].update({
        'targets': [t.name for t in live], 'baseline': OFF,
        'order_note': 'targets take turns in an order rotated each round',
        'pinning_note': meta['settings']['pinning_note'] + ' (each target has its own Redis)',
    })
    save_meta()

    run_rounds(block, live, args, probes, _extra)


def _extra(record: dict) -> str:
    cpu = record.get('worker_cpu_us_per_call')
    lines = record.get('access_lines_per_call')
    return ((f'; worker {cpu:,.0f} µs CPU/call' if cpu is not None else '') +
            (f'; {lines} access lines/call' if lines is not None else ''))


# --------------------------------------------------------------------------------------
# The report's section (loadtests/report.py puts it first in the block's results.md)
# --------------------------------------------------------------------------------------

def report_section(meta: dict, runs: list[dict]) -> list[str]:
    measured = [r for r in runs if r.get('kind') == 'run']
    names = [name for name, _ in TARGETS]
    out = ['## Access log and events: what they cost', '',
           'Worker CPU per call: user + system CPU of the gunicorn worker (the master left out) over the calls served. '
           'Access lines per call: lines with a request id the target appended to its log file during the run, '
           'over the calls served (written a flush interval after the call, so a run\'s last calls may land in the '
           'next). Median [min-max] of the rounds.', '']
    connections = sorted({r['connections'] for r in measured}, reverse=True)
    out += ['| Connections | Target | req/s | Worker CPU per call (µs) | Access lines per call |',
            '|---|---|---|---|---|']
    verdicts = []
    for c in connections:
        cells = {t: [r for r in measured if r['target'] == t and r['connections'] == c] for t in names}
        for t in names:
            if cells[t]:
                out.append(f'| {c} | {t} | {show_range(median_range([r["rps"] for r in cells[t]]), 0)} | '
                           f'{show_range(median_range([r.get("worker_cpu_us_per_call") for r in cells[t]]))} | '
                           f'{show_range(median_range([r.get("access_lines_per_call") for r in cells[t]]), 3)} |')
        rounds = min((len(cells[t]) for t in (ON, OFF)), default=0)
        for other, what in ((ON, 'access log on'), (BARE, 'events off (and access log off)')):
            rps = median_range([r['rps'] for r in cells[other]]), median_range([r['rps'] for r in cells[OFF]])
            cpu = (median_range([r.get('worker_cpu_us_per_call') for r in cells[other]]),
                   median_range([r.get('worker_cpu_us_per_call') for r in cells[OFF]]))
            if not (rps[0] and rps[1]):
                continue
            ratio = rps[0][0] / rps[1][0]
            line = (f'- c={c}, {what} / access log off: req/s **{ratio:.3f}** (ratio of medians; ranges '
                    f'{"overlap" if overlap(*rps) else "clear"})')
            if cpu[0] and cpu[1]:
                line += f', worker CPU per call **{cpu[0][0] / cpu[1][0]:.3f}**'
            if other == ON:
                line += (f'. Target: the access log costs at most {(1 - THROUGHPUT_TARGET) * 100:.0f}% of throughput '
                         f'(>= {THROUGHPUT_TARGET:.2f}): {"met" if ratio >= THROUGHPUT_TARGET else "NOT met"}')
            verdicts.append(line + '.')
        if rounds:
            chance = false_clear_chance(rounds) * 100
            verdicts.append(f'- With {rounds} round(s), equal targets look clear {chance:.1f}% of the time.')
    out += [''] + verdicts + ['']
    return out
