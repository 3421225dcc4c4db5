"""The faults block: one fault at a time under a closed-loop load that checks every body.

    .venv/bin/python -m loadtests.bench faults                      # every fault, then --publish to docs/bench
    .venv/bin/python -m loadtests.bench faults --faults worker-kill --quiet 2 --after 2 --allow-dirty   # a smoke

The fleet: ``fleet up --instances 2`` (nginx in front of two gunicorn masters, --workers each, pinned by
GATEWAY_CPUS=auto; the embedded PostgreSQL and Redis of fleet.local) in a home under .bench/runs/, on the ports from
--base-port (rig.py). The load: --clients keep-alive clients through nginx, each sending the next lookup as soon as
the last is answered, every 200 checked against the row PostgreSQL holds for that aid (load.py; its own process).

Per fault (inject.py), each on a fleet made whole again first and with its own API key (so its run history is its
own): the load starts, runs --quiet seconds (the baseline), the fault is injected at t0, and the load runs on until
the fault is over (the server back, the worker replaced, the reload done) and then until --after seconds passed with
no failed call, or --max-observe seconds after t0. Then the load stops; the run history is read back from the store
(once it stops growing) and three management calls are made; the fleet is made whole again (``fleet up``, which
starts a master that is gone) if the fault left it broken, and --settle quiet seconds pass before the next fault.
`max-requests` restarts the fleet with GATEWAY_MAX_REQUESTS=--max-requests and runs the load --recycle-window seconds:
the whole window is the fault.

Output: loadtests/results/faults-<timestamp>/ (--out): results.jsonl (one line per fault), meta.json, results.md
(render.py); the calls themselves stay in the work folder (.bench/runs/faults-<timestamp>/). --publish copies the
folder to docs/bench/raw/ and writes docs/bench/<date>-faults.md.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ... import rundir, system
from ...harness import log, now_iso
from ...system import REPO
from . import calls as seen_calls
from .calls import Reader
from .inject import FAULTS, MASTER_WAIT_S, Fault
from .quota import CALLS as QUOTA_CALLS
from .quota import SPENT as QUOTA_SPENT
from .quota import QuotaCaller
from .render import publish
from .render import write as write_report
from .rig import Rig, RigError

BLOCK = 'faults'
QUERY = 'account'
CONNECTION = 'demo'


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog='python -m loadtests.bench faults', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--faults', default=','.join(FAULTS), help=f'comma list of {", ".join(FAULTS)} (default all)')
    parser.add_argument('--clients', type=int, default=16, help='keep-alive clients of the load (default 16)')
    parser.add_argument('--rate', type=float, default=0.0,
                        help='pace the load at this many calls a second, all clients together, each call timed from '
                             'when it was due (default 0: a closed loop, each client sending as soon as it can)')
    parser.add_argument('--fleet-env', action='append', default=[], metavar='GATEWAY_NAME=VALUE',
                        help='a setting of the fleet under test (repeatable; recorded in the report)')
    parser.add_argument('--workers', type=int, default=2, help='workers per master (default 2)')
    parser.add_argument('--via', choices=('nginx', 'direct'), default='nginx',
                        help='the load through nginx (default), or half the clients straight to each master')
    parser.add_argument('--quiet', type=float, default=3.0, help='seconds of load before each fault (default 3)')
    parser.add_argument('--after', type=float, default=5.0,
                        help='seconds without a failed call that end a fault\'s observation (default 5)')
    parser.add_argument('--max-observe', type=float, default=60.0,
                        help='longest observation after a fault, seconds (default 60)')
    parser.add_argument('--settle', type=float, default=3.0, help='quiet seconds between faults (default 3)')
    parser.add_argument('--max-requests', type=int, default=1000,
                        help='GATEWAY_MAX_REQUESTS of the max-requests fault (default 1000)')
    parser.add_argument('--recycle-window', type=float, default=15.0,
                        help='seconds of load on the max_requests fleet (default 15)')
    parser.add_argument('--max-id', type=int, default=100_000, help='aids drawn from 1..N (default 100,000)')
    # Below Linux's ephemeral range (32768-60999): a port in it can be held by any outgoing connection's
    # local end, and PostgreSQL then fails to bind it ("Address already in use").
    parser.add_argument('--base-port', type=int, default=25100,
                        help='PostgreSQL here, Redis +1, nginx +10, the masters +11 and +12 (default 25100)')
    parser.add_argument('--out', type=Path, default=rundir.RESULTS)
    parser.add_argument('--publish', action='store_true',
                        help='copy the run to docs/bench/raw/ and write docs/bench/<date>-faults[-direct].md')
    parser.add_argument('--keep-data', action='store_true',
                        help="keep the fleet's PostgreSQL data folder (about 400 MB) after the block; its logs and "
                             'the calls are kept anyway')
    parser.add_argument('--allow-dirty', action='store_true',
                        help='run from a tree with uncommitted changes (a smoke run; not a result)')
    args = parser.parse_args(argv)
    args.faults = [f.strip() for f in args.faults.split(',') if f.strip()]
    unknown = [f for f in args.faults if f not in FAULTS]
    if unknown or not args.faults:
        parser.error(f'--faults: a comma list of {", ".join(FAULTS)}')
    # max-requests restarts the fleet with another setting: it goes last
    args.faults = [f for f in args.faults if f != 'max-requests'] + [f for f in args.faults if f == 'max-requests']
    args.out = args.out.resolve()
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    git = system.git_state()
    if git['dirty'] and not args.allow_dirty:
        raise SystemExit('the tree has uncommitted changes: commit them (a result names one commit), or pass '
                         '--allow-dirty for a smoke run')
    if args.publish and git['dirty']:
        raise SystemExit('--publish needs a committed tree')
    for tool in ('nginx', 'redis-server'):
        if not (system.tool_path(tool) or Path(f'/usr/sbin/{tool}').exists()):
            raise SystemExit(f'{tool} not found')
    run_dir, work_dir = rundir.new(args.out, BLOCK)
    log(f'block {BLOCK} -> {run_dir} (fleet home, logs and calls in {work_dir})')
    rig = Rig(work_dir / 'home', args.base_port, args.workers, work_dir / 'fleet.log')
    rig.fleet_env = fleet_env(args.fleet_env)
    meta = {
        'block': BLOCK, 'started_at': now_iso(), 'finished_at': None,
        'command': ' '.join(shlex.quote(a) for a in [sys.executable, '-m', 'loadtests.bench', BLOCK, *argv]),
        'settings': {'faults': args.faults, 'clients': args.clients, 'rate': args.rate, 'via': args.via,
                     'workers': args.workers,
                     'instances': 2,
                     'quiet_s': args.quiet, 'after_s': args.after, 'max_observe_s': args.max_observe,
                     'settle_s': args.settle, 'max_requests': args.max_requests,
                     'recycle_window_s': args.recycle_window, 'max_id': args.max_id,
                     'hold_s': seen_calls.HOLD_S, 'master_wait_s': MASTER_WAIT_S,
                     'quota': f'{QUOTA_CALLS} calls/day, {QUOTA_SPENT} spent before',
                     'fleet': rig.settings()},
        'machine': system.machine_info(),
        'versions': {'harness': system.venv_versions(Path(sys.executable), ['gunicorn', 'falcon', 'psycopg2-binary',
                                                                            'redis']),
                     'gateway_fleet': system.our_version(), 'git': git, 'nginx': _nginx_version()},
        'work_dir': str(work_dir), 'targets': [], 'notes': [],
    }
    rundir.write_meta(run_dir, meta)

    def on_term(signum, frame):
        raise KeyboardInterrupt(f'signal {signum}')
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)

    failed = None
    results = (run_dir / 'results.jsonl').open('a')
    try:
        run_block(rig, args, meta, results, work_dir, lambda: rundir.write_meta(run_dir, meta))
        meta['finished_at'] = now_iso()
    except KeyboardInterrupt as stop:
        failed = f'interrupted ({stop})'
    except (RigError, RuntimeError, OSError, subprocess.SubprocessError) as error:
        failed = f'{type(error).__name__}: {error}'
    finally:
        results.close()
        try:
            rig.down()
            if not args.keep_data and not rig.pg.is_running():
                shutil.rmtree(rig.pg.data_dir, ignore_errors=True)
        except (RigError, OSError, subprocess.SubprocessError) as error:
            log(f'fleet down failed: {error}')
        if failed:
            meta['notes'].append(f'Stopped early: {failed.splitlines()[0]}')
        rundir.write_meta(run_dir, meta)
        path = write_report(run_dir)
        log(f'report: {path}')
    if failed:
        log(f'FAILED: {failed}')
        return 1
    if args.publish:
        log(f'published: {publish(run_dir)}')
    return 0


def run_block(rig: Rig, args, meta: dict, results, work_dir: Path, save_meta) -> None:
    log(f'fleet up --instances 2 ({args.workers} workers each) in {rig.home}')
    rig.up()
    pg_version = rig.sql('SHOW server_version')[0][0]
    meta['versions']['postgresql'] = pg_version
    rows = rig.sql('SELECT aid, bid, abalance FROM pgbench_accounts WHERE aid <= %s ORDER BY aid', (args.max_id,),
                   db='demo')
    if not rows:
        raise RigError('the demo database has no pgbench_accounts rows')
    expected = work_dir / 'expected.json'
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
                        'command': 'python -m fleet.cli up --instances 2', 'env': _shown(rig.settings())}]
    save_meta()
    for n, name in enumerate(args.faults):
        fault = FAULTS[name]
        log(f'[{n + 1}/{len(args.faults)}] {name}: {fault.what}')
        if fault.inject is None:
            record = run_recycling(rig, fault, keys[name], args, expected, work_dir)
        else:
            record = run_fault(rig, fault, keys[name], args, expected, work_dir,
                               quota_secret if name == 'redis-kill' else None)
        results.write(json.dumps(record) + '\n')
        results.flush()
        log(summary_line(record))
        time.sleep(args.settle)


def fleet_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition('=')
        if not sep or not name.startswith('GATEWAY_'):
            raise SystemExit(f'--fleet-env wants GATEWAY_NAME=VALUE, not {pair!r}')
        env[name] = value
    return env


# --------------------------------------------------------------------------------------
# One fault
# --------------------------------------------------------------------------------------

class Load:
    """load.py in a process of its own, writing its calls to `path`."""

    def __init__(self, rig: Rig, secret: str, expected: Path, path: Path, clients: int, via: str = 'nginx',
                 rate: float = 0.0):
        self.path = path
        urls = [rig.url] if via == 'nginx' else rig.instance_urls
        cmd = [sys.executable, '-m', 'loadtests.blocks.faults.load', *[a for u in urls for a in ('--url', u)],
               '--key', secret, '--expected', str(expected), '--out', str(path), '--clients', str(clients),
               '--rate', str(rate)]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=open(path.with_suffix('.err'), 'w'))
        self.reader = Reader(path)

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
        self.paths = sorted(rig.home.glob('gunicorn-*.log'))
        self.start = {p: p.stat().st_size for p in self.paths}

    def count(self) -> dict:
        out = {level: 0 for level in self.LEVELS}
        out['traceback'] = 0
        for path in self.paths:
            with open(path, 'rb') as fh:
                fh.seek(self.start[path])
                for raw in fh:
                    line = raw.decode('utf-8', 'replace')
                    if line.startswith('Traceback'):
                        out['traceback'] += 1
                    for level in self.LEVELS:
                        if f'"level":"{level}"' in line or f'[{level.upper()}]' in line:
                            out[level] += 1
        return out


class Contention:
    """How busy the machine was while a fault's load ran, and how much of that was not this block. The block's
    processes - the fleet (masters, workers, nginx), PostgreSQL, Redis, this harness and its load generator - are
    found as process
    trees every 0.2 s and each one's CPU counted up to the last time it was seen, so a worker that was replaced or a
    master that was killed keeps most of its share; the rest of the machine's busy CPU is "other work"."""

    def __init__(self, rig: Rig, load_pid: int):
        self.rig, self.load_pid = rig, load_pid
        self.machine = system.MachineMeter()
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.load_pids: set[int] = set()
        self.loadavg = os.getloadavg()[0]
        self.started = time.monotonic()
        self._stop = threading.Event()
        self.machine.start()
        self._sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        rig = self.rig
        roots = [rig.master(0), rig.master(1), rig.nginx(), rig.pg._pid(), rig.redis._pid(), os.getpid()]
        tree = system.process_tree(*[r for r in roots if r])
        self.load_pids.update(system.process_tree(self.load_pid))
        for pid in tree:
            ticks = system.cpu_seconds(pid)
            if ticks is not None:
                self.first.setdefault(pid, ticks)
                self.last[pid] = ticks

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._sample()

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(5)
        self._sample()
        wall = time.monotonic() - self.started
        machine = self.machine.stop()
        used = {pid: self.last[pid] - self.first[pid] for pid in self.last}
        ours = sum(used.values())
        load = sum(v for pid, v in used.items() if pid in self.load_pids)
        return {'cpus': os.cpu_count(), 'machine_busy_cores': round(machine / wall, 2),
                'block_cores': round(ours / wall, 2), 'other_cores': round(max(0.0, machine - ours) / wall, 2),
                'load_generator_cores': round(load / wall, 2),
                'loadavg_1m': [round(self.loadavg, 2), round(os.getloadavg()[0], 2)]}


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
    restored_before = make_whole(rig)
    logs = Logs(rig)
    load = Load(rig, secret, expected, work_dir / f'calls-{fault.name}.txt', args.clients, args.via, args.rate)
    quota = None
    contention = Contention(rig, load.proc.pid)
    try:
        started = load.wait_started()
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
        machine = contention.stop()
        calls = load.stop()
    stopped = time.monotonic()
    record = analyse(fault, calls, started, t0, done_at, end, args)
    record['facts'] = facts
    record['logged'] = logs.count()
    record['machine'] = machine
    if quota is not None:
        killed = facts.pop('killed_at')
        record['quota'] = quota.summary(killed, killed + facts['answering_after_s'])
    record['management_after'] = management_after(rig, f'faults-{fault.name}')
    record['history'] = history(rig, f'faults-{fault.name}', calls)
    record['restored_before'] = restored_before
    record['restored_after'] = make_whole(rig)
    record['wall_s'] = round(time.monotonic() - started, 1)
    record['load_stopped_s'] = round(stopped - t0, 3)
    return record


def observe(load: Load, t0: float, done_at: float, args) -> float:
    """Until --after seconds without a failed call once the fault is over, or --max-observe after t0."""
    while True:
        time.sleep(0.2)
        calls = load.reader.poll()
        now = time.monotonic()
        if now - t0 >= args.max_observe:
            return now
        if now - done_at < args.after:
            continue
        last = seen_calls.last_disturbance(calls, t0, now)
        if now - (last or t0) >= args.after:
            return now


def analyse(fault: Fault, calls: list, started: float, t0: float, done_at: float, end: float, args) -> dict:
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
    last, stable_since, error = -1, time.monotonic(), None
    found: set = set()
    while time.monotonic() < deadline:
        try:
            found = {r[0] for r in rig.sql(
                'SELECT h.request_id FROM gw_run_history h JOIN gw_api_keys k ON k.id = h.key_id WHERE k.name = %s',
                (key_name,))}
            error = None
        except Exception as failure:   # the store may still be coming back: try again
            error = f'{type(failure).__name__}: {str(failure)[:200]}'
        if len(found) != last:
            last, stable_since = len(found), time.monotonic()
        elif time.monotonic() - stable_since >= 1.5 and error is None:
            break
        time.sleep(0.25)
    lost = answered - found
    return {'answered_2xx': len(answered), 'answered_any': len(answered_any), 'rows': len(found),
            'lost_2xx': len(lost), 'lost_any': len(answered_any - found),
            'rows_not_answered': len(found - answered_any), 'error': error}


def management_after(rig: Rig, key_name: str) -> list[str]:
    """Three management calls once the load has stopped: a read, a change, a read."""
    out = []
    for method, path, body in (('GET', f'/queries/{QUERY}', None),
                               ('PATCH', f'/api-keys/{key_name}', {'active': True}),
                               ('GET', f'/api-keys/{key_name}', None)):
        try:
            status, answer = rig.management(method, path, body, timeout=10)
        except OSError as error:
            out.append(f'{method} conn {type(error).__name__}')
            continue
        code = answer.get('code') if isinstance(answer, dict) and status >= 300 else None
        out.append(f'{method} {status}' + (f' {code}' if code else ''))
    return out


# --------------------------------------------------------------------------------------
# max_requests: the fault is a setting
# --------------------------------------------------------------------------------------

class Recycles:
    """Worker pids of both masters, polled: every new one is a worker started (a recycle)."""

    def __init__(self, rig: Rig):
        self.rig = rig
        self.first = {p for i in range(2) for p in rig.worker_pids(i)}
        self.seen = set(self.first)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            for i in range(2):
                self.seen.update(self.rig.worker_pids(i))
            time.sleep(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return len(self.seen - self.first)


def run_recycling(rig: Rig, fault: Fault, secret: str, args, expected: Path, work_dir: Path) -> dict:
    log(f'fleet down --keep-services; fleet up with GATEWAY_MAX_REQUESTS={args.max_requests}')
    rig.down(keep_services=True)
    rig.extra_env = {'GATEWAY_MAX_REQUESTS': str(args.max_requests)}
    rig.up()
    logs = Logs(rig)
    load = Load(rig, secret, expected, work_dir / f'calls-{fault.name}.txt', args.clients, args.via, args.rate)
    contention = Contention(rig, load.proc.pid)
    try:
        started = load.wait_started()
        recycles = Recycles(rig)
        t0 = started
        time.sleep(args.recycle_window)
        end = time.monotonic()
        workers_started = recycles.stop()
    finally:
        machine = contention.stop()
        calls = load.stop()
    record = analyse(fault, calls, started, t0, end, end, args)
    record['machine'] = machine
    record['baseline'] = None      # the whole run is the fault
    record['recovery_s'] = None    # nothing to recover from: counted over the whole window
    record['facts'] = {'max_requests': args.max_requests, 'workers_started': workers_started}
    record['logged'] = logs.count()
    record['management_after'] = management_after(rig, f'faults-{fault.name}')
    record['history'] = history(rig, f'faults-{fault.name}', calls)
    record['restored_before'] = None
    record['restored_after'] = None
    record['wall_s'] = round(time.monotonic() - started, 1)
    return record


# --------------------------------------------------------------------------------------

def summary_line(record: dict) -> str:
    every = record['all']
    bad = {k: v for k, v in every['outcomes'].items() if k != '200 ok'}
    window = record['window']
    line = (f'  {record["fault"]}: {every["calls"]:,} calls, not ok {sum(bad.values()):,} {bad or ""}; recovery '
            f'{"n/a" if record["recovery_s"] is None else str(record["recovery_s"]) + " s"}; window p99 {window["latency_ms"]["99"]} ms, max {window["latency_ms"]["max"]} '
            f'ms, longest gap {window["longest_gap_ms"]} ms; history lost {record["history"]["lost_2xx"]}; '
            f'management after {record["management_after"]}')
    if record.get('quota'):
        q = record['quota']
        line += f'; quota admitted {q["admitted"]} of {q["quota_calls"]} (in flight <= {q["in_flight_bound"]})'
    return line


def _shown(settings: dict) -> dict:
    return {k: v for k, v in settings.items() if k not in ('GATEWAY_HOME',)}


def _nginx_version() -> str | None:
    nginx = system.tool_path('nginx') or '/usr/sbin/nginx'
    try:
        out = subprocess.run([nginx, '-v'], capture_output=True, text=True, timeout=10)
    except OSError:
        return None
    return (out.stderr or out.stdout).strip().split('/')[-1] or None
