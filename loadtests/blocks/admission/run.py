"""The admission block's run: its two targets (admission on and off, each with its own store and Redis), the
worker CPU and Redis commands of each run (probes), then the closed-loop rounds."""
from __future__ import annotations

import redis

from ...harness import WorkerCpu, record_variants, run_rounds, start_variant
from . import OFF, ON

HUGE_RATE = '1000000/second'
KEY_LIMITS = {'rate_limit': HUGE_RATE, 'quota': {'calls': 10 ** 9, 'per': 'day'}}


class RedisCommands:
    """Commands Redis executed during a run (INFO commandstats delta, the INFO calls left out).

    commandstats also counts the commands a script runs (a lease script is one EVALSHA round trip and about
    five commands inside it), so three numbers per call are kept: every command (`redis_per_call`), every
    command but the event stream's XADDs (`redis_per_call_no_events`: fleet.events appends each run to a
    stream, pipelined per history batch), and the scripts alone (`redis_scripts_per_call`: EVALSHA/EVAL, the
    admission's and the bus' round trips). Round trips of any kind (a script, a pipeline, a plain command) are
    counted as Redis counts its clients' reads (`total_reads_processed`, INFO stats: one read event per request
    or pipeline that arrives at once; a pipeline split over several reads counts more): `redis_reads_per_call`."""

    def __init__(self, url: str):
        self.client = redis.Redis.from_url(url, socket_timeout=5)
        self.before: dict = {}
        self.cpu_before = 0.0
        self.reads_before = 0

    def _snapshot(self) -> dict:
        stats = self.client.info('commandstats')
        return {name.removeprefix('cmdstat_'): int(value['calls']) for name, value in stats.items()}

    def _cpu(self) -> float:
        cpu = self.client.info('cpu')
        return float(cpu['used_cpu_user']) + float(cpu['used_cpu_sys'])

    def _reads(self) -> int:
        return int(self.client.info('stats').get('total_reads_processed', 0))

    def start(self):
        self.before = self._snapshot()
        self.cpu_before = self._cpu()
        self.reads_before = self._reads()

    def finish(self, record: dict) -> dict:
        redis_cpu = self._cpu() - self.cpu_before
        reads = self._reads() - self.reads_before - 2   # less this probe's own two INFO calls since start()
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
                'redis_scripts_per_call': per_call(scripts),
                'redis_reads': reads, 'redis_reads_per_call': per_call(max(reads, 0)),
                # Redis' own CPU (main thread and the rest, INFO cpu): what one call costs the shared Redis
                'redis_cpu_us_per_call': round(redis_cpu / calls * 1e6, 2) if calls else None}


def run(block, args, work_dir, cleanup, meta, save_meta):
    live, probes = [], {}
    for index, (name, extra) in enumerate(((ON, {'GATEWAY_ADMISSION': 'on', 'GATEWAY_RATE_LIMIT': HUGE_RATE}),
                                           (OFF, {'GATEWAY_ADMISSION': 'off'}))):
        target, redis_url = start_variant(args, work_dir, cleanup, index, name, extra,
                                          f'gwstore_adm_{"on" if name == ON else "off"}', key_extra=KEY_LIMITS)
        target.info['key_limits'] = KEY_LIMITS
        live.append(target)
        probes[name] = (WorkerCpu(target.pids[0]), RedisCommands(redis_url))
    record_variants(meta, live, OFF, save_meta)

    run_rounds(block, live, args, probes, _extra)


def _extra(record: dict) -> str:
    cpu = record.get('worker_cpu_us_per_call')
    return (f'; workers {cpu:,.0f} µs CPU/call' if cpu is not None else '') + \
        (f'; Redis {record.get("redis_per_call")} commands/call ({record.get("redis_per_call_no_events")} without '
         f'XADD, {record.get("redis_scripts_per_call")} scripts)')
