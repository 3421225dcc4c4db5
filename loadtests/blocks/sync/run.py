"""The sync block's run: one gateway with --sync-workers workers, management changes timed on the client, the
announce wait read from Redis MONITOR, with the fleet idle and under a background wrk load."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import redis

from ... import system, targets, wrk
from ...harness import log, now_iso, rotated
from ...stats import summary

CHANGES = ('patch-key', 'publish')
ACKS = 'gw:{fleet}:acks'
CHANNEL = 'gw:{fleet}:invalidate'
ALIVE = 'gw:{fleet}:alive'


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


def run(run):
    args = run.args
    store_url = system.dsn_with_db(args.database_url, 'gwstore_sync')
    system.recreate_database(args.database_url, 'gwstore_sync', drop=not args.keep_stores)
    process, redis_url = targets.start_redis(port=args.redis_port, cpu=args.pg_cpu, run_dir=run.work_dir / 'sync')
    run.cleanup.append(process)
    target = targets.start_gateway(port=args.gateway_port, cpu=args.target_cpu, store_url=store_url,
                                   redis_url=redis_url, run_dir=run.work_dir / 'sync',
                                   extra_env={'GATEWAY_WORKERS': str(args.sync_workers)}, root=args.gateway_root)
    run.cleanup.append(target.process)
    target.name, target.description = 'sync', f'gateway-fleet, {args.sync_workers} workers'
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
    run.meta['targets'] = [target.summary()]
    run.meta['settings'].update({
        'targets': [cell_name(*c) for c in cells], 'baseline': None, 'changes': args.changes,
        'pause_ms': args.sync_pause_ms, 'workers': args.sync_workers, 'loads': loads,
        'order_note': 'cells take turns in an order rotated each round'})
    run.save()
    client = targets.Client(target.base_url, {'X-API-Key': target.admin_key}, timeout=30)
    try:
        for i in range(20):   # warm-up: the store's sessions, the workers' reload path
            for change in CHANGES:
                call(client, change, i)
        counter = 0
        for r in range(args.rounds):
            for position, (change, load) in enumerate(rotated(cells, r)):
                record = run_cell(client, target, redis_url, change, load, args, counter)
                counter += record['changes']
                record.update({'block': 'sync', 'kind': 'run', 'round': r + 1, 'position': position,
                               'started_at': record.pop('_started_at'),
                               'order': [cell_name(*c) for c in rotated(cells, r)]})
                run.block.write(record)
                lat, ann = record['latency_ms'], record['announce_ms']
                log(f'round {r + 1}/{args.rounds} {record["target"]}: {record["changes"]} changes, p50 '
                    f'{lat.get("50")} ms, p99 {lat.get("99")} ms, max {lat.get("max")} ms; announce p50 '
                    f'{ann.get("50")} ms, p99 {ann.get("99")} ms'
                    + ('' if record['ok'] else '  ⚠ ' + '; '.join(record['problems'])))
    finally:
        client.close()


def call(client, change: str, i: int) -> tuple[int, float]:
    """One change through the Management API: (status, ms)."""
    method, path, body = change_body(change, i)
    status, _, ms = client.call(method, '/api/v1' + path, body)
    return status, ms


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


def run_cell(client, target, redis_url: str, change: str, load: int, args, counter: int) -> dict:
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
        status, ms = call(client, change, counter + i)
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
