"""Latency against offered load where oha is not installed: wrk for capacity, then a small open-loop generator.

    .venv/bin/python -m loadtests.bench openloop --url http://127.0.0.1:8000 --keys-file .bench/keys.env \\
        --scenario lookup --pcts 25,50,75,90,100,110 --duration 20 --rounds 5

Capacity: the median of --capacity-rounds closed-loop wrk runs at --capacity-connections (loadtests/wrk.py), or
--capacity. Then, for each offered rate (a share of capacity, rates rotated each round), requests are *scheduled*
at t0 + i/rate, whatever happens, and handed to --connections keep-alive HTTP/1.1 connections; each request's
latency is measured from its scheduled time, not from when a connection was free to send it - so a slow answer
that delays the requests behind it shows in their latency (no coordinated omission), as `oha -q R
--latency-correction` does. Requests still queued or in flight when the run's time is up are counted neither
way ("unfinished"), as oha counts them.

It is Python (asyncio, one process, pinned to --load-cpu): it can itself fall behind. Every run records the
generator's own lag (scheduled time to the moment it queued the request), the send lag (scheduled time to the
request being written: it also waits for a free connection once the gateway falls behind) and the generator's
CPU; a run whose generator used most of a core, or queued requests more than 1 ms late (p99), is flagged. oha, in compose's `bench` profile
(loadtests/oha/run.sh), is the reference; this is for a quick look on a development machine.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shlex
import time
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

from ... import rundir, system, wrk
from ...stats import rounded_rank_percentile as percentile
from ..oha.run import problems_of
from .render import write as write_report

# The oha block's scenarios (loadtests/oha/scenarios/*.env) in Python:
# (key variable, path maker, wrk query path + param)
SCENARIOS = {
    'lookup': ('KEY_PLAIN', lambda m: f'/q/account?aid={random.randint(1, m)}', ('/q/account', 'aid')),
    'governed': ('KEY_GOVERNED', lambda m: f'/q/account_governed?aid={random.randint(1, m)}',
                 ('/q/account_governed', 'aid')),
    'page': ('KEY_PLAIN', lambda m: f'/q/account_page?start={random.randint(1, m - 99)}&page_size=100',
             ('/q/account_page?page_size=100', 'start')),
    'deposit': ('KEY_WRITER', lambda m: f'/q/deposit?aid={random.randint(1, m)}&delta={random.randint(1, 9)}',
                ('/q/deposit?delta=1', 'aid')),
}
PERCENTILES = ('50', '90', '99', '99.9')


class Tally:
    def __init__(self):
        self.latency: list[float] = []   # seconds, from the scheduled time to the last byte
        self.lag: list[float] = []       # seconds, from the scheduled time to the request being written
        self.dispatch_lag: list[float] = []  # seconds, from the scheduled time to the generator queueing it
        self.status: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.scheduled = 0


async def _connection(host: str, port: int, queue: asyncio.Queue, tally: Tally, headers: bytes, timeout_s: float):
    loop = asyncio.get_running_loop()
    reader = writer = None
    while True:
        scheduled, path = await queue.get()
        try:
            if writer is None:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
            sent = loop.time()
            writer.write(f'GET {path} HTTP/1.1\r\nHost: {host}\r\n'.encode() + headers + b'\r\n')
            head = await asyncio.wait_for(reader.readuntil(b'\r\n\r\n'), timeout_s)
            lines = head.decode('latin-1').split('\r\n')
            status = lines[0].split(' ', 2)[1]
            length, close = 0, False
            for line in lines[1:]:
                name, _, value = line.partition(':')
                name = name.strip().lower()
                if name == 'content-length':
                    length = int(value)
                elif name == 'connection' and value.strip().lower() == 'close':
                    close = True
            if length:
                await asyncio.wait_for(reader.readexactly(length), timeout_s)
            done = loop.time()
            tally.latency.append(done - scheduled)
            tally.lag.append(sent - scheduled)
            tally.status[status] = tally.status.get(status, 0) + 1
            if close:
                writer.close()
                reader = writer = None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
                ValueError, IndexError) as error:
            kind = type(error).__name__
            tally.errors[kind] = tally.errors.get(kind, 0) + 1
            if writer is not None:
                writer.close()
            reader = writer = None


async def _open_loop(url: str, make_path, key: str, rate: float, duration_s: float, connections: int,
                     timeout_s: float) -> Tally:
    parts = urlsplit(url)
    host, port = parts.hostname or '127.0.0.1', parts.port or 80
    headers = f'X-API-Key: {key}\r\n'.encode() if key else b''
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    tally = Tally()
    workers = [asyncio.create_task(_connection(host, port, queue, tally, headers, timeout_s))
               for _ in range(connections)]
    start = loop.time() + 0.05
    deadline = start + duration_s
    total = int(rate * duration_s)
    try:
        for i in range(total):
            scheduled = start + i / rate
            delay = scheduled - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tally.dispatch_lag.append(loop.time() - scheduled)
            queue.put_nowait((scheduled, make_path()))
            tally.scheduled += 1
        left = deadline - loop.time()
        if left > 0:
            await asyncio.sleep(left)
    finally:
        # Cancel until every connection task is gone: in Python 3.11 a wait_for() that completes just as it is
        # cancelled can swallow the cancellation, so one cancel() is not enough.
        pending = set(workers)
        while pending:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=0.5)
    return tally


def open_run(url: str, scenario: str, key: str, max_id: int, rate: float, duration_s: float, connections: int,
             timeout_s: float = 10.0) -> dict:
    """One open-loop run; a record in the shape of the oha block's (loadtests/blocks/oha/run.py)."""
    make = SCENARIOS[scenario][1]
    before = resource.getrusage(resource.RUSAGE_SELF)
    wall = time.monotonic()
    tally = asyncio.run(_open_loop(url, lambda: make(max_id), key, rate, duration_s, connections, timeout_s))
    wall = time.monotonic() - wall
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    latency = sorted(tally.latency)
    lag = sorted(tally.lag)
    ok = sum(v for k, v in tally.status.items() if k.startswith('2'))
    done = sum(tally.status.values())
    problems = problems_of(tally.status, tally.errors)
    generator_cores = cpu / wall if wall else 0.0
    dispatch = sorted(tally.dispatch_lag)
    dispatch_p99 = percentile(dispatch, 99) or 0.0
    suspect = []
    if generator_cores > 0.8:
        suspect.append(f'the generator used {generator_cores:.2f} cores: it may have fallen behind')
    if dispatch_p99 > 0.001:
        suspect.append(f'the generator queued requests late (p99 {dispatch_p99 * 1000:.1f} ms after their time)')
    return {
        'block': 'openloop', 'kind': 'open', 'target': 'gateway', 'scenario': scenario, 'connections': connections,
        'offered_rps': rate, 'duration_s': duration_s, 'rps': done / duration_s, 'served_rps': ok / duration_s,
        'requests': done, 'ok_requests': ok, 'scheduled': tally.scheduled,
        'aborted_at_deadline': max(0, tally.scheduled - done - sum(tally.errors.values())),
        'latency_us': {p: round(percentile(latency, float(p)) * 1e6, 1) for p in PERCENTILES if latency},
        'send_lag_us': {p: round(percentile(lag, float(p)) * 1e6, 1) for p in PERCENTILES if lag},
        'dispatch_lag_us': {p: round(percentile(dispatch, float(p)) * 1e6, 1) for p in PERCENTILES if dispatch},
        'status': tally.status, 'errors': tally.errors, 'ok': not problems, 'problems': problems,
        'generator': 'python asyncio (loadtests/blocks/openloop/run.py)', 'generator_cores': round(generator_cores, 3),
        'suspect': suspect,
    }


def measure_capacity(url: str, scenario: str, key: str, max_id: int, args) -> tuple[float, list[dict]]:
    """The median of closed-loop wrk runs (loadtests/wrk.py) at args.capacity_connections."""
    query_path, param = SCENARIOS[scenario][2]
    env = {'API_KEY': key, 'QUERY_PATH': query_path, 'PARAM': param,
           'MAX_ID': str(max_id - 99 if scenario == 'page' else max_id),
           # random_aid.lua checks the body of the plain lookup only (the others answer other rows)
           'CHECK_BODY': 'account' if scenario == 'lookup' else 'off'}
    runs = []
    for r in range(args.capacity_rounds):
        result = wrk.run(url.rstrip('/') + '/', connections=args.capacity_connections,
                         duration_s=args.capacity_duration, env=env, cpu=args.load_cpu)
        record = {'block': 'openloop', 'kind': 'closed', 'target': 'gateway', 'scenario': scenario,
                  'round': r + 1, 'connections': args.capacity_connections, **result.to_dict(),
                  'ok': not wrk.errors_of(result),
                  'problems': wrk.errors_of(result), 'generator': 'wrk'}
        runs.append(record)
        print(f'capacity {scenario} round {r + 1}: {result.rps:,.0f} req/s (wrk -c {args.capacity_connections})',
              flush=True)
    rates = sorted(r['rps'] for r in runs)
    return rates[len(rates) // 2], runs


def read_keys(path: Path) -> dict:
    keys = {}
    for line in path.read_text().splitlines():
        if '=' in line and not line.lstrip().startswith('#'):
            name, value = line.split('=', 1)
            keys[name.strip()] = ' '.join(shlex.split(value)) if value else ''
    return keys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog='python -m loadtests.bench openloop', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--url', required=True, help='the gateway, e.g. http://127.0.0.1:8000')
    parser.add_argument('--keys-file', type=Path, required=True,
                        help='KEY_*=... lines from python -m loadtests.scenarios.provision --out FILE')
    parser.add_argument('--scenario', default='lookup', choices=sorted(SCENARIOS))
    parser.add_argument('--capacity', type=float, default=None, help='req/s; default: measured with wrk first')
    parser.add_argument('--capacity-rounds', type=int, default=3)
    parser.add_argument('--capacity-duration', type=float, default=10)
    parser.add_argument('--capacity-connections', type=int, default=32)
    parser.add_argument('--pcts', default='25,50,75,90,100,110', help='offered rates, percent of capacity')
    parser.add_argument('--duration', type=float, default=20, help='seconds per rate')
    parser.add_argument('--rounds', type=int, default=1)
    parser.add_argument('--connections', type=int, default=128)
    parser.add_argument('--max-id', type=int, default=None, help='default: MAX_ID from the keys file, or 1,000,000')
    parser.add_argument('--load-cpu', default='0', help="CPU list for wrk and this generator ('off': no pinning)")
    parser.add_argument('--out', type=Path, default=rundir.RESULTS,
                        help='folder for openloop-<timestamp>/ (default loadtests/results/, gitignored)')
    args = parser.parse_args(argv)
    keys = read_keys(args.keys_file)
    key_var = SCENARIOS[args.scenario][0]
    key = keys.get(key_var)
    if not key:
        raise SystemExit(f'{args.keys_file} has no {key_var}')
    max_id = args.max_id or int(keys.get('MAX_ID') or 1_000_000)
    if args.load_cpu not in ('', 'off'):
        from gateway.settings import parse_cpu_list
        os.sched_setaffinity(0, set(parse_cpu_list(args.load_cpu)))
    run_dir = args.out.resolve() / f'openloop-{datetime.now().strftime("%Y%m%d-%H%M%S")}'
    run_dir.mkdir(parents=True)
    pcts = [float(p) for p in args.pcts.split(',') if p.strip()]
    settings = {'TARGET': args.url,
                'GENERATOR': 'python asyncio open loop (loadtests/blocks/openloop/run.py); wrk for capacity',
                'SCENARIOS': args.scenario, 'CONNECTIONS': args.capacity_connections,
                'DURATION': f'{args.capacity_duration:g}s', 'ROUNDS': args.capacity_rounds,
                'OPEN_PCTS': ' '.join(f'{p:g}' for p in pcts), 'OPEN_ROUNDS': args.rounds,
                'OPEN_DURATION': f'{args.duration:g}s', 'OPEN_CONNECTIONS': args.connections,
                'CAPACITY': args.capacity or '', 'STARTED': datetime.now().isoformat(timespec='seconds'),
                'LOAD_CPU': args.load_cpu, 'MACHINE': system.machine_info()}
    (run_dir / 'meta.json').write_text(json.dumps({'block': 'openloop', 'settings': settings}, indent=2) + '\n')
    results = (run_dir / 'results.jsonl').open('a')
    try:
        if args.capacity:
            capacity = args.capacity
        else:
            capacity, runs = measure_capacity(args.url, args.scenario, key, max_id, args)
            for record in runs:
                results.write(json.dumps(record) + '\n')
        print(f'capacity {capacity:,.0f} req/s; open loop at {args.pcts} % of it', flush=True)
        for r in range(args.rounds):
            k = r % len(pcts)
            for pct in pcts[k:] + pcts[:k]:
                rate = max(1.0, capacity * pct / 100)
                record = open_run(args.url, args.scenario, key, max_id, rate, args.duration, args.connections)
                record.update(round=r + 1, offered_pct=pct)
                results.write(json.dumps(record) + '\n')
                results.flush()
                lat = record['latency_us']
                print(f'open {args.scenario} {pct:g}% ({rate:,.0f} req/s offered): served {record["served_rps"]:,.0f}'
                      f' req/s, p50 {lat.get("50", 0) / 1000:.2f} ms, p99 {lat.get("99", 0) / 1000:.2f} ms, '
                      f'unfinished {record["aborted_at_deadline"]}, generator {record["generator_cores"]:.2f} cores'
                      + ('  ⚠ ' + '; '.join(record['suspect'] + record['problems'])
                         if record['suspect'] or record['problems'] else ''), flush=True)
    finally:
        results.close()
        print(write_report(run_dir))
    return 0

