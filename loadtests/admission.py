"""Block `admission`: what shared rate limits and quotas cost a call.

    .venv/bin/python -m loadtests.bench --block admission --local-pg /tmp/bench-pg --rounds 5 --duration 10

Two targets, each our gateway with one worker pinned to CPU 1 (`--target-cpu`), its own store database and its
own Redis (PostgreSQL, both Redis servers and wrk on CPU 0), provisioned with the same bodies:

- `admission-on`: GATEWAY_ADMISSION=on, GATEWAY_RATE_LIMIT=1000000/second (the per-IP limit, every call), and the
  key has "rate_limit": "1000000/second" and "quota": {"calls": 10^9, "per": "day"}: three shared buckets per call,
  none of them ever refuses, so the calls served are the same work as without admission;
- `admission-off`: GATEWAY_ADMISSION=off (the same key body; nothing is limited or counted).

The `account` lookup (the oltp block's) at wrk -c32 (`--connections`), interleaved rounds rotated each round,
after a warm-up of each target and with a /health floor before and after, as the oltp block.

Per run, besides what every block records: the CPU of the gunicorn *worker* processes alone (user + system from
/proc, every thread, the master left out) per call served, and Redis' commands during the run (INFO commandstats,
before and after, less the INFO calls themselves) per call served - three ways, as commandstats counts the commands
a script runs too: every command, every command but the event stream's XADD (fleet.events appends every run), and
the scripts alone (EVALSHA: the round trips of the leases and the bus' heartbeat). Targets: CPU per call on/off
<= 1.10, Redis commands per call < 0.1 at steady state (the bus' heartbeats are in the count: Redis traffic too).
"""
from __future__ import annotations


import redis

from . import system, targets
from .report import false_clear_chance, median_range, overlap, show_range

ON, OFF = 'admission-on', 'admission-off'
HUGE_RATE = '1000000/second'
KEY_LIMITS = {'rate_limit': HUGE_RATE, 'quota': {'calls': 10 ** 9, 'per': 'day'}}
CPU_TARGET = 1.10
REDIS_TARGET = 0.1


class WorkerCpu:
    """CPU seconds of a gunicorn master's workers (not the master) during a run."""

    def __init__(self, master_pid: int):
        self.master = master_pid
        self.meter = None

    def start(self):
        workers = [p for p in system.process_tree(self.master) if p != self.master]
        self.meter = system.CpuMeter(*workers)
        self.meter.start()

    def finish(self, record: dict) -> dict:
        cpu = self.meter.stop()
        calls = record.get('requests') or 0
        return {'worker_cpu_s': None if cpu is None else round(cpu, 3),
                'worker_cpu_us_per_call': round(cpu / calls * 1e6, 1) if cpu is not None and calls else None}


class RedisCommands:
    """Commands Redis executed during a run (INFO commandstats delta, the INFO calls left out).

    commandstats also counts the commands a script runs (a lease script is one EVALSHA round trip and about
    five commands inside it), so three numbers per call are kept: every command (`redis_per_call`), every
    command but the event stream's XADDs (`redis_per_call_no_events`: fleet.events appends each run to a
    stream, pipelined per history batch), and the scripts alone (`redis_scripts_per_call`: EVALSHA/EVAL, the
    admission's and the bus' round trips)."""

    def __init__(self, url: str):
        self.client = redis.Redis.from_url(url, socket_timeout=5)
        self.before: dict = {}

    def _snapshot(self) -> dict:
        stats = self.client.info('commandstats')
        return {name.removeprefix('cmdstat_'): int(value['calls']) for name, value in stats.items()}

    def start(self):
        self.before = self._snapshot()

    def finish(self, record: dict) -> dict:
        after = self._snapshot()
        delta = {name: n - self.before.get(name, 0) for name, n in after.items()
                 if name != 'info' and n - self.before.get(name, 0) > 0}
        total = sum(delta.values())
        events = delta.get('xadd', 0)
        scripts = delta.get('evalsha', 0) + delta.get('eval', 0)
        calls = record.get('requests') or 0

        def per_call(n):
            return round(n / calls, 4) if calls else None
        return {'redis_commands': total, 'redis_by_command': dict(sorted(delta.items())),
                'redis_per_call': per_call(total), 'redis_per_call_no_events': per_call(total - events),
                'redis_scripts_per_call': per_call(scripts)}


def run(block, args, work_dir, cleanup, meta, save_meta):
    from .bench import log, run_rounds
    live, probes = [], {}
    for index, (name, extra) in enumerate(((ON, {'GATEWAY_ADMISSION': 'on', 'GATEWAY_RATE_LIMIT': HUGE_RATE}),
                                           (OFF, {'GATEWAY_ADMISSION': 'off'}))):
        store_db = f'gwstore_adm_{"on" if name == ON else "off"}'
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
        target.info['provisioned'] = targets.provision(target, args.database_url, key_extra=KEY_LIMITS)
        target.info['key_limits'] = KEY_LIMITS
        target.info['redis'] = system.redact(redis_url)
        log(f'{name} ready at {target.base_url} (pid {target.pids[0]}), Redis {redis_url}')
        live.append(target)
        probes[name] = (WorkerCpu(target.pids[0]), RedisCommands(redis_url))
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
    return (f'; workers {cpu:,.0f} µs CPU/call' if cpu is not None else '') + \
        (f'; Redis {record.get("redis_per_call")} commands/call ({record.get("redis_per_call_no_events")} without '
         f'XADD, {record.get("redis_scripts_per_call")} scripts)')


# --------------------------------------------------------------------------------------
# The report's section (loadtests/report.py appends it to the block's results.md)
# --------------------------------------------------------------------------------------

def report_section(meta: dict, runs: list[dict]) -> list[str]:
    measured = [r for r in runs if r.get('kind') == 'run']
    out = ['## Admission: what it costs', '',
           'Worker CPU per call: user + system CPU of the gunicorn workers (the master left out) over the calls '
           'served. Redis commands per call: INFO commandstats before and after the run (less the INFO calls), over '
           'the calls served; they include the bus\' heartbeat (a script and a PING every 250 ms per worker). '
           'Median [min-max] of the rounds.', '']
    connections = sorted({r['connections'] for r in measured}, reverse=True)
    out += ['| Connections | Target | req/s | Worker CPU per call (µs) | Redis commands per call | '
            'without the event stream (XADD) | scripts (EVALSHA) per call | Redis commands by kind (median run) |',
            '|---|---|---|---|---|---|---|---|']
    verdicts = []
    for c in connections:
        cells = {t: [r for r in measured if r['target'] == t and r['connections'] == c] for t in (ON, OFF)}
        for t, cell in cells.items():
            if not cell:
                continue
            by_kind = sorted(cell, key=lambda r: r.get('redis_per_call') or 0)[len(cell) // 2].get('redis_by_command', {})
            out.append(f'| {c} | {t} | {show_range(median_range([r["rps"] for r in cell]), 0)} | '
                       f'{show_range(median_range([r.get("worker_cpu_us_per_call") for r in cell]))} | '
                       f'{show_range(median_range([r.get("redis_per_call") for r in cell]), 4)} | '
                       f'{show_range(median_range([r.get("redis_per_call_no_events") for r in cell]), 4)} | '
                       f'{show_range(median_range([r.get("redis_scripts_per_call") for r in cell]), 4)} | '
                       f'{", ".join(f"{k} {v:,}" for k, v in by_kind.items()) or "-"} |')
        on = median_range([r.get('worker_cpu_us_per_call') for r in cells[ON]])
        off = median_range([r.get('worker_cpu_us_per_call') for r in cells[OFF]])
        if on and off:
            ratio = on[0] / off[0]
            rounds = min(len(cells[ON]), len(cells[OFF]))
            verdicts.append(
                f'- c={c}: worker CPU per call on/off = **{ratio:.3f}** (ratio of medians; ranges '
                f'{"overlap" if overlap(on, off) else "clear"}; with {rounds} round(s) equal targets look clear '
                f'{false_clear_chance(rounds) * 100:.1f}% of the time). Target <= {CPU_TARGET:.2f}: '
                f'{"met" if ratio <= CPU_TARGET else "NOT met"}.')
        for field, what in (('redis_per_call', 'every command'),
                            ('redis_per_call_no_events', 'every command but the event stream\'s XADD'),
                            ('redis_scripts_per_call', 'scripts (round trips of the admission and the bus)')):
            stat = median_range([r.get(field) for r in cells[ON]])
            if stat:
                verdicts.append(f'- c={c}, admission on, Redis {what}: **{stat[0]:.4f}** per call (median). '
                                f'Target < {REDIS_TARGET}: {"met" if stat[0] < REDIS_TARGET else "NOT met"}.')
    out += [''] + verdicts + ['']
    return out
