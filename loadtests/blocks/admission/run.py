"""The admission block's run: its two targets (admission on and off, each with its own store and Redis), the
worker CPU and Redis commands of each run (probes), then the closed-loop rounds."""
from __future__ import annotations

import redis

from ...harness import WorkerCpu, record_variants, run_rounds, start_variant
from . import OFF, ON

HUGE_RATE = '1000000/second'
KEY_LIMITS = {'rate_limit': HUGE_RATE, 'quota': {'calls': 10 ** 9, 'per': 'day'}}


class RedisCommands:
    """What Redis did during a run, per call served: commands (INFO commandstats, the INFO calls left out), its CPU
    (INFO cpu) and the round trips it read (INFO stats' total_reads_processed: one a script, pipeline or plain
    command that arrives at once). commandstats counts the commands a script runs too (a lease script is one EVALSHA
    and about five commands inside it), so three counts are kept: every command (`redis_per_call`), every command but
    the event stream's XADDs (`redis_per_call_no_events`), and the scripts alone (`redis_scripts_per_call`)."""

    def __init__(self, url: str):
        self.client = redis.Redis.from_url(url, socket_timeout=5)
        self.before: tuple = ()

    def _commands(self) -> dict:
        stats = self.client.info('commandstats')
        return {name.removeprefix('cmdstat_'): int(value['calls']) for name, value in stats.items()}

    def _cpu_and_reads(self) -> tuple[float, int]:
        cpu = self.client.info('cpu')
        return (float(cpu['used_cpu_user']) + float(cpu['used_cpu_sys']),
                int(self.client.info('stats').get('total_reads_processed', 0)))

    def start(self):
        self.before = (self._commands(), *self._cpu_and_reads())

    def finish(self, record: dict) -> dict:
        cpu, reads = self._cpu_and_reads()
        commands, (commands0, cpu0, reads0) = self._commands(), self.before
        reads -= reads0 + 2     # less this probe's own two INFO calls since the reads were counted at start()
        delta = {name: n - commands0.get(name, 0) for name, n in commands.items()
                 if name != 'info' and n - commands0.get(name, 0) > 0}
        total, calls = sum(delta.values()), record.get('requests') or 0

        def per_call(n):
            return round(n / calls, 4) if calls else None
        return {'redis_commands': total, 'redis_by_command': dict(sorted(delta.items())),
                'redis_per_call': per_call(total), 'redis_per_call_no_events': per_call(total - delta.get('xadd', 0)),
                'redis_scripts_per_call': per_call(delta.get('evalsha', 0) + delta.get('eval', 0)),
                'redis_reads': reads, 'redis_reads_per_call': per_call(max(reads, 0)),
                'redis_cpu_us_per_call': round((cpu - cpu0) / calls * 1e6, 2) if calls else None}


def run(run):
    live, probes = [], {}
    for index, (name, extra) in enumerate(((ON, {'GATEWAY_ADMISSION': 'on', 'GATEWAY_RATE_LIMIT': HUGE_RATE}),
                                           (OFF, {'GATEWAY_ADMISSION': 'off'}))):
        target, redis_url = start_variant(run, index, name, extra, f'gwstore_adm_{"on" if name == ON else "off"}',
                                          key_extra=KEY_LIMITS)
        target.info['key_limits'] = KEY_LIMITS
        live.append(target)
        probes[name] = (WorkerCpu(target.pids[0]), RedisCommands(redis_url))
    record_variants(run, live, OFF)
    run_rounds(run.block, live, run.args, probes, _extra)


def _extra(record: dict) -> str:
    cpu = record.get('worker_cpu_us_per_call')
    return (f'; workers {cpu:,.0f} µs CPU/call' if cpu is not None else '') + \
        (f'; Redis {record.get("redis_per_call")} commands/call ({record.get("redis_per_call_no_events")} without '
         f'XADD, {record.get("redis_scripts_per_call")} scripts)')
