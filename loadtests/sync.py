"""Block `sync`: how long a management call takes, now that it returns only once every worker has applied it.

    .venv/bin/python -m loadtests.bench --block sync --local-pg /tmp/bench-pg --rounds 5 --changes 300

One gateway target, GATEWAY_WORKERS=4 (`--sync-workers`) pinned to `--target-cpu` (default CPU 1: with one core the
four share it), its own store database and its own Redis (with PostgreSQL on CPU 0). Cells, interleaved in rounds
rotated each round:

- `patch-key`: PATCH /api/v1/api-keys/bench, its "queries" grant alternating between two lists;
- `publish`: POST /api/v1/queries/account/publish, alternating versions 1 and 2 (the same SQL);

each with the fleet idle (c=0) and under a background wrk load on /q/account (c=N for each N in `--connections`,
default 8; wrk on CPU 0, from 1 s before the first change to the last). A run makes `--changes` changes one after the other (a pause of `--sync-pause-ms` between
them) on one keep-alive connection and times each call on the client, from sending the request to reading the
whole answer (time.perf_counter). Target: p99 < 20 ms.

The announce wait - from the PUBLISH of a change's generation to the last worker's acknowledgement - is read from
Redis MONITOR (server timestamps) during the run: for every PUBLISH of generation G, the first `HSET acks <worker>
g` with g >= G of each worker acking in the run. MONITOR costs Redis some CPU; the management call's own wait also
includes its polling (0.5 ms, doubling to 4 ms).
"""
from __future__ import annotations

import http.client
import json
import math
import os
import signal
import statistics
import subprocess
import threading
import time

import redis

from . import system, targets, wrk
from .report import _environment, _table_head, false_clear_chance

CHANGES = ('patch-key', 'publish')
P99_TARGET_MS = 20.0
ACKS = 'gw:{fleet}:acks'
CHANNEL = 'gw:{fleet}:invalidate'
ALIVE = 'gw:{fleet}:alive'


def percentile(samples, q: float):
    """Nearest-rank percentile of `samples` (q in 0..100)."""
    if not samples:
        return None
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def summary(samples) -> dict:
    if not samples:
        return {}
    return {'n': len(samples), 'mean': round(statistics.fmean(samples), 3),
            **{p: round(percentile(samples, float(p)), 3) for p in ('50', '90', '99')},
            'max': round(max(samples), 3)}


class Announces:
    """Redis MONITOR during a run: PUBLISH times of generations and the workers' acknowledgements."""

    def __init__(self, url: str):
        self.url = url
        self.client = redis.Redis.from_url(url, socket_timeout=None)
        self.publishes: list[tuple[float, int]] = []
        self.acks: dict[str, list[tuple[float, int]]] = {}
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        self._ready.wait(5)

    def _run(self):
        with self.client.monitor() as monitor:
            self._ready.set()
            while not self._stop.is_set():
                try:
                    entry = monitor.next_command()
                except (redis.RedisError, OSError, ValueError, AttributeError):
                    return
                words = entry['command'].split()
                if len(words) >= 3 and words[0].upper() == 'PUBLISH' and words[1] == CHANNEL:
                    self.publishes.append((entry['time'], int(words[2])))
                elif len(words) >= 4 and words[0].upper() == 'HSET' and words[1] == ACKS:
                    self.acks.setdefault(words[2], []).append((entry['time'], int(words[3])))

    def stop(self) -> list[float]:
        """Milliseconds from each PUBLISH to the last worker's acknowledgement of it."""
        self._stop.set()
        try:
            redis.Redis.from_url(self.url, socket_timeout=2).ping()   # wakes the monitor up
        except redis.RedisError:
            pass
        self._thread.join(5)
        self.client.close()
        waits = []
        for published_at, generation in self.publishes:
            last = None
            for acks in self.acks.values():
                first = next((t for t, g in acks if g >= generation and t >= published_at), None)
                if first is None:
                    last = None
                    break
                last = first if last is None else max(last, first)
            if last is not None:
                waits.append((last - published_at) * 1000)
        return waits


class Client:
    """One keep-alive HTTP connection to the Management API."""

    def __init__(self, base_url: str, admin_key: str):
        host, port = base_url.split('//', 1)[1].split(':')
        self.conn = http.client.HTTPConnection(host, int(port), timeout=30)
        self.headers = {'X-API-Key': admin_key, 'Content-Type': 'application/json'}

    def call(self, method: str, path: str, body) -> tuple[int, float]:
        payload = json.dumps(body).encode()
        started = time.perf_counter()
        self.conn.request(method, '/api/v1' + path, body=payload, headers=self.headers)
        response = self.conn.getresponse()
        response.read()
        return response.status, (time.perf_counter() - started) * 1000

    def close(self):
        self.conn.close()


def change_body(change: str, i: int) -> tuple[str, str, dict]:
    if change == 'patch-key':
        queries = [targets.QUERY] if i % 2 else [targets.QUERY, 'account_alt']
        return 'PATCH', f'/api-keys/{targets.KEY}', {'queries': queries}
    return 'POST', f'/queries/{targets.QUERY}/publish', {'version': 2 if i % 2 == 0 else 1}


def wait_workers(redis_url: str, master: int, workers: int, timeout_s: float = 60):
    client = redis.Redis.from_url(redis_url, socket_timeout=2)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            pids = [p for p in system.process_tree(master) if p != master]
            alive = {k.decode().rsplit(':', 1)[1] for k in client.hkeys(ALIVE)}
            if len(pids) == workers and all(str(p) in alive for p in pids):
                return pids
            time.sleep(0.1)
    finally:
        client.close()
    raise targets.TargetError(f'the {workers} workers did not all join the bus within {timeout_s:.0f}s')


def run(block, args, work_dir, cleanup, meta, save_meta):
    from .bench import log, now_iso, rotated
    store_db = 'gwstore_sync'
    store_url = system.dsn_with_db(args.database_url, store_db)
    system.recreate_database(args.database_url, store_db, drop=not args.keep_stores)
    process, redis_url = targets.start_redis(port=args.redis_port, cpu=args.pg_cpu, run_dir=work_dir / 'sync')
    cleanup.append(process)
    target = targets.start_gateway(port=args.gateway_port, cpu=args.target_cpu, store_url=store_url,
                                   redis_url=redis_url, run_dir=work_dir / 'sync',
                                   extra_env={'GATEWAY_WORKERS': str(args.sync_workers)}, root=args.gateway_root)
    cleanup.append(target.process)
    target.name = 'sync'
    target.description = f'gateway-fleet, {args.sync_workers} workers'
    targets.wait_healthy(target)
    workers = wait_workers(redis_url, target.pids[0], args.sync_workers)
    target.info['provisioned'] = targets.provision(target, args.database_url)
    status, body = targets.management(target, 'POST', f'/queries/{targets.QUERY}/versions',
                                      {**targets.query_body(), 'description': 'version 2', 'publish': False})
    if status != 201:
        raise targets.TargetError(f'adding version 2 answered {status}: {str(body)[:300]}')
    target.info['workers'] = workers
    log(f'sync target ready at {target.base_url}: {len(workers)} workers {workers}, Redis {redis_url}')
    loads = [0] + [c for c in args.connections if c > 0]
    cells = [(change, load) for load in loads for change in CHANGES]
    meta['targets'] = [target.summary()]
    meta['settings'].update({
        'targets': [cell_name(*c) for c in cells], 'baseline': None, 'changes': args.changes,
        'pause_ms': args.sync_pause_ms, 'workers': args.sync_workers, 'loads': loads,
        'order_note': 'cells take turns in an order rotated each round',
    })
    save_meta()
    client = Client(target.base_url, target.admin_key)
    try:
        for i in range(20):   # warm-up: the store's sessions, the workers' reload path
            for change in CHANGES:
                client.call(*change_body(change, i))
        counter = 0
        for r in range(args.rounds):
            for position, (change, load) in enumerate(rotated(cells, r)):
                record = run_cell(client, target, redis_url, change, load, args, counter)
                counter += record['changes']
                record.update({'block': 'sync', 'kind': 'run', 'round': r + 1, 'position': position,
                               'started_at': record.pop('_started_at'), 'order': [cell_name(*c) for c in
                                                                                   rotated(cells, r)]})
                block.results.write(json.dumps(record) + '\n')
                block.results.flush()
                lat, ann = record['latency_ms'], record['announce_ms']
                log(f'round {r + 1}/{args.rounds} {record["target"]}: {record["changes"]} changes, p50 '
                    f'{lat.get("50")} ms, p99 {lat.get("99")} ms, max {lat.get("max")} ms; announce p50 '
                    f'{ann.get("50")} ms, p99 {ann.get("99")} ms' + ('' if record['ok'] else
                                                                    '  ⚠ ' + '; '.join(record['problems'])))
    finally:
        client.close()
    meta['finished_at'] = now_iso()


def cell_name(change: str, load: int) -> str:
    return f'{change} c={load}'


class BackgroundLoad:
    """wrk -cN on /q/account for as long as a run's changes take: started long, stopped with SIGINT (wrk then
    stops its threads and prints its results, the Lua done() hook's line included)."""

    def __init__(self, target, connections: int, args):
        self.cmd = [*system.taskset_prefix(args.load_cpu), 'wrk', '-t1', f'-c{connections}', '-d3600s', '--latency',
                    '-s', str(wrk.RANDOM_AID), target.url('/')]
        env = {**os.environ, 'API_KEY': target.api_key, 'QUERY_PATH': target.query_path, 'PARAM': target.param,
               'MAX_ID': str(args.max_id)}
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                     stdin=subprocess.DEVNULL)

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> tuple[dict | None, str | None]:
        """(rps, requests, errors) of the load, or an error."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            out, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
        try:
            data = wrk.parse(out)
        except wrk.WrkError as error:
            return None, f'{error} {err[-300:]}'
        duration = data['duration_us'] / 1e6
        return {'rps': round(data['requests'] / duration, 1) if duration else 0.0, 'requests': data['requests'],
                'errors': data['errors']}, None


def run_cell(client: Client, target, redis_url: str, change: str, load: int, args, counter: int) -> dict:
    from .bench import now_iso
    started_at = now_iso()
    wall = time.monotonic()
    background = BackgroundLoad(target, load, args) if load else None
    if background is not None:
        time.sleep(1.0)   # the load is on before the first change
    announces = Announces(redis_url)
    announces.start()
    machine, gateway = system.MachineMeter(), system.CpuMeter(target.pids[0])
    machine.start()
    gateway.start()
    measured_from = time.monotonic()
    samples, errors = [], {}
    for i in range(args.changes):
        status, ms = client.call(*change_body(change, counter + i))
        if 200 <= status < 300:
            samples.append(ms)
        else:
            errors[status] = errors.get(status, 0) + 1
        if args.sync_pause_ms:
            time.sleep(args.sync_pause_ms / 1000)
    seconds = time.monotonic() - measured_from
    gateway_cpu, machine_cpu = gateway.stop(), machine.stop()
    waits = announces.stop()
    problems = [f'{n} answers {s}' for s, n in errors.items()]
    loaded = None
    if background is not None:
        alive = background.running()
        loaded, error = background.stop()
        if error or not alive:
            problems.append(f'background wrk failed: {error or "it ended before the changes did"}')
        elif any(loaded['errors'].values()):
            problems.append(f'background load errors: {loaded["errors"]}')
    if len(waits) < len(samples):
        problems.append(f'{len(samples) - len(waits)} announces not seen acknowledged by every worker in MONITOR')
    record = {'target': cell_name(change, load), 'change': change, 'load_connections': load,
              'changes': len(samples), 'latency_ms': summary(samples), 'samples_ms': [round(s, 3) for s in samples],
              'announce_ms': summary(waits), 'announce_samples_ms': [round(w, 3) for w in waits],
              'gateway_cores': round(gateway_cpu / seconds, 3), 'machine_cores': round(machine_cpu / seconds, 3),
              'ok': not problems, 'problems': problems, '_started_at': started_at,
              'wall_s': round(time.monotonic() - wall, 3)}
    if loaded is not None:
        record['background'] = loaded
    return record


# --------------------------------------------------------------------------------------
# The report (loadtests/report.py hands the sync block here)
# --------------------------------------------------------------------------------------

def _stat(values):
    values = [v for v in values if v is not None]
    return (statistics.median(values), min(values), max(values)) if values else None


def _show(stat) -> str:
    return '-' if stat is None else f'{stat[0]:.2f} [{stat[1]:.2f}-{stat[2]:.2f}]'


def render(meta: dict, runs: list[dict]) -> str:
    settings = meta.get('settings', {})
    measured = [r for r in runs if r.get('kind') == 'run']
    cells = settings.get('targets') or sorted({r['target'] for r in measured})
    rounds_done = max((sum(1 for r in measured if r['target'] == c) for c in cells), default=0)
    out = [f'# Block `sync`: {meta.get("started_at", "?")}', '']
    if meta.get('finished_at') is None:
        out += ['**Incomplete: the block did not finish** (interrupted or failed); the numbers below are what it '
                'recorded.', '']
    out += [f'- Method: {rounds_done} round(s) per cell; {settings.get("order_note", "")}; per run '
            f'{settings.get("changes", "?")} management changes one after the other on one keep-alive connection, '
            f'{settings.get("pause_ms", "?")} ms apart, each timed on the client from sending the request to reading '
            f'the whole answer; {settings.get("workers", "?")} workers; c=N: a background wrk -cN on /q/account '
            'during the changes, c=0: the fleet idle.',
            f'- Rule: a difference counts only when the ranges do not overlap; with {rounds_done} round(s) equal '
            f'cells look clear {false_clear_chance(rounds_done) * 100:.1f}% of the time.',
            f'- Pinning: {settings.get("pinning_note", "?")}', '']
    if meta.get('notes'):
        out += ['Notes:', ''] + [f'- {n}' for n in meta['notes']] + ['']

    out += ['## Management call, start to return (ms)', '',
            'Per run percentiles (nearest rank); median of the rounds [min-max]. "All" pools every change of every '
            f'round. Target: p99 < {P99_TARGET_MS:.0f} ms.', '']
    out += _table_head(['Cell', 'Changes', 'p50', 'p90', 'p99', 'max', 'All: p50', 'All: p99', 'All: max',
                        f'p99 < {P99_TARGET_MS:.0f} ms'])
    for cell in cells:
        mine = [r for r in measured if r['target'] == cell]
        pooled = [s for r in mine for s in r.get('samples_ms', [])]
        p99 = percentile(pooled, 99)
        out.append(f'| {cell} | {len(pooled)} | ' + ' | '.join(
            _show(_stat([r['latency_ms'].get(p) for r in mine])) for p in ('50', '90', '99', 'max')) +
            f' | {_fmt(percentile(pooled, 50))} | {_fmt(p99)} | {_fmt(max(pooled) if pooled else None)} | '
            f'{"-" if p99 is None else ("met" if p99 < P99_TARGET_MS else "NOT met")} |')
    out.append('')

    out += ['## Announce: PUBLISH to the last worker\'s acknowledgement (ms)', '',
            'From Redis MONITOR timestamps (server clock): per published generation, the latest of each worker\'s '
            'first acknowledgement of it (or of a later generation). Part of the call above.', '']
    out += _table_head(['Cell', 'Generations', 'p50', 'p99', 'max', 'All: p50', 'All: p99'])
    for cell in cells:
        mine = [r for r in measured if r['target'] == cell]
        pooled = [s for r in mine for s in r.get('announce_samples_ms', [])]
        out.append(f'| {cell} | {len(pooled)} | ' + ' | '.join(
            _show(_stat([r['announce_ms'].get(p) for r in mine])) for p in ('50', '99', 'max')) +
            f' | {_fmt(percentile(pooled, 50))} | {_fmt(percentile(pooled, 99))} |')
    out.append('')

    flagged = [r for r in runs if not r.get('ok', True)]
    out += ['## Runs with problems', '']
    out += [f'- round {r.get("round")} {r["target"]}: {"; ".join(r["problems"])}' for r in flagged] or \
        ['None: every change answered 2xx and every background load ran without errors.']
    out.append('')
    out += ['## Every run', '']
    out += ['Gateway cores: CPU of the master and its workers during the changes; machine cores: the whole machine\'s '
            'busy CPU (/proc/stat) - well above the gateway\'s, wrk\'s and PostgreSQL\'s share means other processes '
            'shared the machine.', '']
    out += _table_head(['Round', 'Pos', 'Cell', 'Changes', 'p50 ms', 'p99 ms', 'max ms', 'Announce p50', 'Announce p99',
                        'Background req/s', 'Gateway cores', 'Machine cores', 'Started'])
    for r in measured:
        lat, ann = r['latency_ms'], r['announce_ms']
        out.append(f'| {r["round"]} | {r["position"]} | {r["target"]} | {r["changes"]} | {_fmt(lat.get("50"))} | '
                   f'{_fmt(lat.get("99"))} | {_fmt(lat.get("max"))} | {_fmt(ann.get("50"))} | {_fmt(ann.get("99"))} | '
                   f'{r.get("background", {}).get("rps", "-")} | {r.get("gateway_cores", "-")} | '
                   f'{r.get("machine_cores", "-")} | {r.get("started_at", "")[11:19]} |')
    out.append('')
    out += _environment(meta)
    return '\n'.join(out) + '\n'


def _fmt(value) -> str:
    return '-' if value is None else f'{value:.2f}'
