"""The faults block: one fault at a time under a closed-loop load that checks every body.

    .venv/bin/python -m loadtests.bench faults                      # every fault, then --publish to docs/bench
    .venv/bin/python -m loadtests.bench faults --faults worker-kill --quiet 2 --after 2 --allow-dirty   # a smoke

The fleet: ``fleet up --instances 2`` (nginx in front of two gunicorn masters, --workers each, GATEWAY_CPUS=auto; the
embedded PostgreSQL and Redis of fleet.ops.local) in a home under .bench/runs/, on ports from --base-port (rig.py). The
load: --clients keep-alive clients through nginx (or --via direct), each 200 checked against the row PostgreSQL
holds (load.py, its own process; --rate paces it). Per fault (inject.py), each on a fleet made whole first and with
its own API key: --quiet seconds of load, the fault, then load until it is over and --after seconds passed with no
failed call (at most --max-observe); then the key's run history read back, three management calls, the fleet made
whole again, --settle quiet seconds. `max-requests` restarts the fleet with GATEWAY_MAX_REQUESTS and runs the load
--recycle-window seconds: the whole window is the fault. Output: results.jsonl (one line a fault), meta.json,
results.md (render.py); the calls stay in the work folder. --publish writes docs/bench/<date>-faults.md.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ... import harness, report, system
from ...harness import log, now_iso
from . import calls as seen_calls
from .inject import FAULTS, MASTER_WAIT_S, Fault
from .quota import CALLS as QUOTA_CALLS
from .quota import SPENT as QUOTA_SPENT
from .quota import QuotaCaller
from .render import publish
from .rig import Rig, RigError

BLOCK, QUERY, CONNECTION = 'faults', 'account', 'demo'


def parse_args(argv=None):
    parser = harness.parser_for(BLOCK, __doc__)
    add = parser.add_argument
    add('--faults', default=','.join(FAULTS), help=f'comma list of {", ".join(FAULTS)} (default all)')
    add('--clients', type=int, default=16, help='keep-alive clients of the load (default 16)')
    add('--rate', type=float, default=0.0, help='pace the load at this many calls a second, all clients together, '
        'each call timed from when it was due (default 0: a closed loop)')
    add('--fleet-env', action='append', default=[], metavar='GATEWAY_NAME=VALUE',
        help='a setting of the fleet under test (repeatable; recorded in the report)')
    add('--workers', type=int, default=2, help='workers per master (default 2)')
    add('--via', choices=('nginx', 'direct'), default='nginx',
        help='the load through nginx (default), or half the clients straight to each master')
    add('--quiet', type=float, default=3.0, help='seconds of load before each fault (default 3)')
    add('--after', type=float, default=5.0, help='seconds without a failed call that end an observation (default 5)')
    add('--max-observe', type=float, default=60.0, help='longest observation after a fault, seconds (default 60)')
    add('--settle', type=float, default=3.0, help='quiet seconds between faults (default 3)')
    add('--max-requests', type=int, default=1000, help='GATEWAY_MAX_REQUESTS of the max-requests fault')
    add('--recycle-window', type=float, default=15.0, help='seconds of load on the max_requests fleet (default 15)')
    add('--max-id', type=int, default=100_000, help='aids drawn from 1..N (default 100,000)')
    # Below Linux's ephemeral range (32768-60999): a port in it can be held by any outgoing connection's
    # local end, and PostgreSQL then fails to bind it ("Address already in use").
    add('--base-port', type=int, default=25100,
        help='PostgreSQL here, Redis +1, nginx +10, the masters +11 and +12 (default 25100)')
    add('--publish', action='store_true', help='copy the run to docs/bench/raw/ and write docs/bench/<date>-faults.md')
    add('--keep-data', action='store_true', help="keep the fleet's PostgreSQL data folder (about 400 MB)")
    harness.add_output(parser)
    args = harness.parse(parser, argv, data=False)
    args.faults = [f.strip() for f in args.faults.split(',') if f.strip()]
    if not args.faults or set(args.faults) - set(FAULTS):
        parser.error(f'--faults: a comma list of {", ".join(FAULTS)}')
    # max-requests restarts the fleet with another setting: it goes last
    args.faults = sorted(args.faults, key=lambda f: f == 'max-requests')
    if any('=' not in pair or not pair.startswith('GATEWAY_') for pair in args.fleet_env):
        parser.error('--fleet-env wants GATEWAY_NAME=VALUE')
    args.fleet_env = dict(pair.partition('=')[::2] for pair in args.fleet_env)
    return args


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    return harness.run_block(BLOCK, args, [BLOCK, *argv], body, report.write, data=False, tools=('nginx', 'redis-server'),
                             errors=(RigError, RuntimeError, OSError, subprocess.SubprocessError), publish=publish)


def body(run) -> None:
    args, meta = run.args, run.meta
    rig = Rig(run.work_dir / 'home', args.base_port, args.workers, run.work_dir / 'fleet.log')
    rig.fleet_env = args.fleet_env
    meta['settings'] = {'faults': args.faults, 'clients': args.clients, 'rate': args.rate, 'via': args.via,
                        'workers': args.workers, 'instances': 2, 'quiet_s': args.quiet, 'after_s': args.after,
                        'max_observe_s': args.max_observe, 'settle_s': args.settle, 'max_requests': args.max_requests,
                        'recycle_window_s': args.recycle_window, 'max_id': args.max_id, 'hold_s': seen_calls.HOLD_S,
                        'master_wait_s': MASTER_WAIT_S, 'quota': f'{QUOTA_CALLS} calls/day, {QUOTA_SPENT} spent before',
                        'fleet': rig.settings()}
    meta['versions'] = {'harness': system.venv_versions(Path(sys.executable), ['gunicorn', 'falcon', 'psycopg2-binary',
                                                                               'redis']),
                        'gateway_fleet': system.our_version(), 'git': system.git_state(), 'nginx': _nginx_version()}
    run.save()
    try:
        run_faults(rig, run)
    finally:
        try:
            rig.down()
            if not args.keep_data and not rig.pg.is_running():
                shutil.rmtree(rig.pg.data_dir, ignore_errors=True)
        except (RigError, OSError, subprocess.SubprocessError) as error:
            log(f'fleet down failed: {error}')


def run_faults(rig: Rig, run) -> None:
    args, meta = run.args, run.meta
    log(f'fleet up --instances 2 ({args.workers} workers each) in {rig.home}')
    rig.up()
    meta['versions']['postgresql'] = rig.sql('SHOW server_version')[0][0]
    rows = rig.sql('SELECT aid, bid, abalance FROM pgbench_accounts WHERE aid <= %s ORDER BY aid', (args.max_id,),
                   db='demo')
    if not rows:
        raise RigError('the demo database has no pgbench_accounts rows')
    expected = run.work_dir / 'expected.json'
    expected.write_text(json.dumps([list(r) for r in rows]))
    keys = {name: make_key(rig, f'faults-{name}') for name in args.faults}
    quota_secret = make_key(rig, 'faults-quota', quota={'calls': QUOTA_CALLS, 'per': 'day'}) \
        if 'redis-kill' in args.faults else None
    total = rig.sql('SELECT count(*), min(aid), max(aid) FROM pgbench_accounts', db='demo')[0]
    meta['data'] = {'rows': total[0], 'min_aid': total[1], 'max_aid': total[2], 'drawn': [rows[0][0], rows[-1][0]],
                    'database_url': system.redact(rig.pg.url('demo'))}
    meta['targets'] = [{'name': 'fleet', 'base_url': rig.url, 'cpu': 'all (GATEWAY_CPUS=auto)',
                        'description': f'fleet up --instances 2: nginx in front of two gunicorn masters '
                                       f'({", ".join(rig.instance_urls)}), {args.workers} workers each',
                        'command': 'python -m fleet.ops.cli up --instances 2',
                        'env': {k: v for k, v in rig.settings().items() if k != 'GATEWAY_HOME'}}]
    run.save()
    for n, name in enumerate(args.faults):
        fault = FAULTS[name]
        log(f'[{n + 1}/{len(args.faults)}] {name}: {fault.what}')
        record = run_fault(rig, fault, keys[name], args, expected, run.work_dir,
                           quota_secret if name == 'redis-kill' else None)
        run.block.write(record)
        log(summary_line(record))
        time.sleep(args.settle)


# --------------------------------------------------------------------------------------
# What runs beside a fault: the load, the logs, the machine, the workers
# --------------------------------------------------------------------------------------

class Load:
    """load.py in a process of its own, writing its calls to `path`."""

    def __init__(self, rig: Rig, secret: str, expected: Path, path: Path, args):
        urls = [rig.url] if args.via == 'nginx' else rig.instance_urls
        cmd = [sys.executable, '-m', 'loadtests.blocks.faults.load', *[a for u in urls for a in ('--url', u)],
               '--key', secret, '--expected', str(expected), '--out', str(path), '--clients', str(args.clients),
               '--rate', str(args.rate)]
        self.path = path
        with open(path.with_suffix('.err'), 'w') as err:
            self.proc = subprocess.Popen(cmd, cwd=system.REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=err)
        self.reader = seen_calls.Reader(path)

    def wait_started(self, timeout_s: float = 30) -> float:
        deadline = time.monotonic() + timeout_s
        while not self.reader.poll():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RigError(f'the load did not start; see {self.path.with_suffix(".err")}')
            time.sleep(0.05)
        return time.monotonic()

    def stop(self) -> list:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.reader.poll()


class Logs:
    """What the masters and their workers logged at warning or above while a fault's load ran (their logs in the
    fleet home, read from where they ended when the load started): a fault that makes every worker log on every call
    shows here."""

    LEVELS = ('warning', 'error', 'critical')

    def __init__(self, rig: Rig):
        self.start = {p: p.stat().st_size for p in sorted(rig.home.glob('gunicorn-*.log'))}

    def count(self) -> dict:
        out = dict.fromkeys(self.LEVELS, 0) | {'traceback': 0}
        for path, offset in self.start.items():
            with open(path, 'rb') as fh:
                fh.seek(offset)
                for line in (raw.decode('utf-8', 'replace') for raw in fh):
                    out['traceback'] += line.startswith('Traceback')
                    for level in self.LEVELS:
                        out[level] += f'"level":"{level}"' in line or f'[{level.upper()}]' in line
        return out


class Poller(threading.Thread):
    """`sample()` now and every `every` seconds until stop()."""

    def __init__(self, every: float):
        super().__init__(daemon=True)
        self.every, self._halt = every, threading.Event()
        self.sample()
        self.start()

    def sample(self) -> None:
        raise NotImplementedError

    def run(self) -> None:
        while not self._halt.wait(self.every):
            self.sample()

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
        self.sample()


class Contention(Poller):
    """How busy the machine was while a fault's load ran, and how much of that was not this block. The block's
    processes - the fleet (masters, workers, nginx), PostgreSQL, Redis, this harness and its load generator - are
    found as process trees every 0.2 s and each one's CPU counted up to the last time it was seen, so a worker that
    was replaced or a master that was killed keeps most of its share; the rest of the machine's busy CPU is "other
    work"."""

    def __init__(self, rig: Rig, load_pid: int):
        self.rig, self.load_pid = rig, load_pid
        self.machine = system.MachineMeter()
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.load_pids: set[int] = set()
        self.loadavg, self.started = os.getloadavg()[0], time.monotonic()
        self.machine.start()
        super().__init__(0.2)

    def sample(self) -> None:
        rig = self.rig
        self.load_pids.update(system.process_tree(self.load_pid))
        for pid in system.process_tree(rig.master(0), rig.master(1), rig.nginx(), rig.pg._pid(), rig.redis._pid(),
                                       os.getpid()):
            if (cpu := system.cpu_seconds(pid)) is not None:
                self.first.setdefault(pid, cpu)
                self.last[pid] = cpu

    def summary(self) -> dict:
        self.stop()
        wall, machine = time.monotonic() - self.started, self.machine.stop()
        used = {pid: self.last[pid] - self.first[pid] for pid in self.last}
        ours = sum(used.values())
        return {'cpus': os.cpu_count(), 'machine_busy_cores': round(machine / wall, 2),
                'block_cores': round(ours / wall, 2), 'other_cores': round(max(0.0, machine - ours) / wall, 2),
                'load_generator_cores': round(sum(v for pid, v in used.items() if pid in self.load_pids) / wall, 2),
                'loadavg_1m': [round(self.loadavg, 2), round(os.getloadavg()[0], 2)]}


class Recycles(Poller):
    """Worker pids of both masters, polled: every new one is a worker started (a recycle)."""

    def __init__(self, rig: Rig):
        self.rig = rig
        self.first = {p for i in range(2) for p in rig.worker_pids(i)}
        self.seen = set(self.first)
        super().__init__(0.02)

    def sample(self) -> None:
        for i in range(2):
            self.seen.update(self.rig.worker_pids(i))

    def count(self) -> int:
        self.stop()
        return len(self.seen - self.first)


# --------------------------------------------------------------------------------------
# One fault
# --------------------------------------------------------------------------------------

def make_key(rig: Rig, name: str, **extra) -> str:
    rig.management('DELETE', f'/api-keys/{name}')
    status, body = rig.management('POST', '/api-keys', {'name': name, 'queries': [QUERY],
                                                        'connections': [CONNECTION], **extra})
    if status != 201 or not isinstance(body, dict) or not body.get('secret'):
        raise RigError(f'creating key {name} answered {status}: {str(body)[:300]}')
    return body['secret']


def make_whole(rig: Rig) -> str | None:
    """None when the fleet is whole; else what was done to make it so (fleet up starts what is gone)."""
    if rig.whole():
        return None
    try:
        rig.wait_whole(5)   # a worker being replaced, a reload finishing
        return None
    except RigError as broken:
        log(f'the fleet is not whole ({broken}): fleet up')
    rig.up()
    return 'fleet up (the fault left the fleet broken: a master gone, or a worker missing)'


def run_fault(rig: Rig, fault: Fault, secret: str, args, expected: Path, work_dir: Path,
              quota_secret: str | None) -> dict:
    """The load, the fault at t0 once --quiet seconds passed, the observation; or for max-requests (a setting, not an
    act) the load on a fleet restarted with it for --recycle-window seconds."""
    if fault.inject is None:
        log(f'fleet down --keep-services; fleet up with GATEWAY_MAX_REQUESTS={args.max_requests}')
        rig.down(keep_services=True)
        rig.extra_env = {'GATEWAY_MAX_REQUESTS': str(args.max_requests)}
        rig.up()
        restored_before = None
    else:
        restored_before = make_whole(rig)
    logs = Logs(rig)
    load = Load(rig, secret, expected, work_dir / f'calls-{fault.name}.txt', args)
    quota, facts, contention = None, {}, Contention(rig, load.proc.pid)
    try:
        started = load.wait_started()
        if fault.inject is None:
            t0, recycles = started, Recycles(rig)
            time.sleep(args.recycle_window)
            end = done_at = time.monotonic()
            facts = {'max_requests': args.max_requests, 'workers_started': recycles.count()}
        else:
            time.sleep(args.quiet)
            if quota_secret:
                quota = QuotaCaller(rig.url, quota_secret).start()
                quota.wait_admitted(QUOTA_SPENT)
            t0 = time.monotonic()
            facts = fault.inject(rig)
            done_at = facts.pop('done_at')
            end = observe(load, t0, done_at, args)
            if quota is not None:
                quota.join(30)
    finally:
        machine = contention.summary()
        calls = load.stop()
    stopped = time.monotonic()
    record = analyse(fault, calls, started, t0, done_at, end)
    record.update(facts=facts, logged=logs.count(), machine=machine)
    if fault.inject is None:
        record['baseline'] = None      # the whole run is the fault
        record['recovery_s'] = None    # nothing to recover from: counted over the whole window
    if quota is not None:
        killed = facts.pop('killed_at')
        record['quota'] = quota.summary(killed, killed + facts['answering_after_s'])
    record['management_after'] = management_after(rig, f'faults-{fault.name}')
    record['history'] = history(rig, f'faults-{fault.name}', calls)
    record['restored_before'] = restored_before
    record['restored_after'] = None if fault.inject is None else make_whole(rig)
    record['wall_s'] = round(time.monotonic() - started, 1)
    if fault.inject is not None:
        record['load_stopped_s'] = round(stopped - t0, 3)
    return record


def observe(load: Load, t0: float, done_at: float, args) -> float:
    """Until --after seconds without a failed call once the fault is over, or --max-observe after t0."""
    while True:
        time.sleep(0.2)
        calls, now = load.reader.poll(), time.monotonic()
        if now - t0 >= args.max_observe:
            return now
        if now - done_at >= args.after and now - (seen_calls.last_disturbance(calls, t0, now) or t0) >= args.after:
            return now


def analyse(fault: Fault, calls: list, started: float, t0: float, done_at: float, end: float) -> dict:
    recovery = seen_calls.recovered_after(calls, t0, end)
    window_end = min(end, max(done_at, t0 + (recovery or 0)) + seen_calls.HOLD_S)
    return {
        'block': BLOCK, 'kind': 'fault', 'fault': fault.name, 'what': fault.what, 'started_at': now_iso(),
        'fault_after_s': round(t0 - started, 3), 'fault_over_after_s': round(done_at - t0, 3),
        'observed_s': round(end - t0, 3),
        'all': seen_calls.seen(calls, min(c.ended for c in calls), max(c.ended for c in calls)),
        'baseline': seen_calls.seen(calls, started, t0),
        'window': {'from_s': 0.0, 'to_s': round(window_end - t0, 3), **seen_calls.seen(calls, t0, window_end)},
        'recovery_s': recovery,
        'first_clean_s': seen_calls.recovery(calls, t0, end),
        'failure_span_s': seen_calls.failure_span(calls, t0, end),
        'timeline': {**seen_calls.timeline(calls, started, end), 'fault_at_s': round(t0 - started, 3)},
    }


def history(rig: Rig, key_name: str, calls: list, timeout_s: float = 20) -> dict:
    """The key's runs in the store's history against the calls the gateway answered, once the history stops
    growing (each worker writes its batch every history flush, 200 ms by default)."""
    answered = {c.request_id for c in calls if 200 <= c.status < 300 and c.request_id != '-'}
    answered_any = {c.request_id for c in calls if c.request_id != '-'}
    deadline = time.monotonic() + timeout_s
    last, stable_since, error, found = -1, time.monotonic(), None, set()
    while time.monotonic() < deadline:
        try:
            found = {r[0] for r in rig.sql('SELECT h.request_id FROM gw_run_history h JOIN gw_api_keys k ON '
                                           'k.id = h.key_id WHERE k.name = %s', (key_name,))}
            error = None
        except Exception as failure:   # the store may still be coming back: try again
            error = f'{type(failure).__name__}: {str(failure)[:200]}'
        if len(found) != last:
            last, stable_since = len(found), time.monotonic()
        elif time.monotonic() - stable_since >= 1.5 and error is None:
            break
        time.sleep(0.25)
    return {'answered_2xx': len(answered), 'answered_any': len(answered_any), 'rows': len(found),
            'lost_2xx': len(answered - found), 'lost_any': len(answered_any - found),
            'rows_not_answered': len(found - answered_any), 'error': error}


def management_after(rig: Rig, key_name: str) -> list[str]:
    """Three management calls once the load has stopped: a read, a change, a read."""
    out = []
    for method, path, body in (('GET', f'/queries/{QUERY}', None), ('PATCH', f'/api-keys/{key_name}', {'active': True}),
                               ('GET', f'/api-keys/{key_name}', None)):
        try:
            status, answer = rig.management(method, path, body, timeout=10)
        except OSError as error:
            out.append(f'{method} conn {type(error).__name__}')
            continue
        code = answer.get('code') if isinstance(answer, dict) and status >= 300 else None
        out.append(f'{method} {status}' + (f' {code}' if code else ''))
    return out


def summary_line(record: dict) -> str:
    every, window = record['all'], record['window']
    bad = {k: v for k, v in every['outcomes'].items() if k != '200 ok'}
    recovery = 'n/a' if record['recovery_s'] is None else f'{record["recovery_s"]} s'
    line = (f'  {record["fault"]}: {every["calls"]:,} calls, not ok {sum(bad.values()):,} {bad or ""}; recovery '
            f'{recovery}; window p99 {window["latency_ms"]["99"]} ms, max {window["latency_ms"]["max"]} ms, longest '
            f'gap {window["longest_gap_ms"]} ms; history lost {record["history"]["lost_2xx"]}; management after '
            f'{record["management_after"]}')
    if q := record.get('quota'):
        line += f'; quota admitted {q["admitted"]} of {q["quota_calls"]} (in flight <= {q["in_flight_bound"]})'
    return line


def _nginx_version() -> str | None:
    try:
        out = subprocess.run([system.tool_path('nginx') or '/usr/sbin/nginx', '-v'], capture_output=True, text=True,
                             timeout=10)
    except OSError:
        return None
    return (out.stderr or out.stdout).strip().split('/')[-1] or None
