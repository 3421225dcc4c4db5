"""The control plane at fleet scale: one gunicorn master of --workers workers, its catalog grown to --keys keys
and --queries queries, then management calls and the data plane measured.

    .venv/bin/python -m loadtests.bench controlplane --local-pg /tmp/bench-pg --keys 10000 --queries 5000

Steps, in order (every record goes to results.jsonl as it is made):

1. `grow-keys`: --keys keys created through the Management API (each a change every worker applies before the call
   returns): the first --sequential-keys one after another on one keep-alive connection, the rest from
   --key-clients connections at once.
2. `grow-queries`: --api-queries saved queries through the API (each read by PostgreSQL's parser and analysed
   against the connection's schema, as a real save is), then the rest up to --queries inserted in bulk straight
   into the store (copies of the benchmark query's stored version, so every one is a real, servable query) with
   the generation bumped and NOT logged: the next change finds a generation the change log does not cover, and
   every worker reads the whole catalog (the fallback, timed as `gap`).
3. `full-load`: one whole-catalog read (gateway.model.catalog.load) in this process, what a new worker pays; one
   change applied from the log to it; a full pass of the cyclic garbage collector with the catalog alive, and with
   it frozen out of the collector's reach as a worker does after a full load.
4. `rss`: every worker's VmRSS before growing, after the keys, after the queries.
5. `mgmt`: --samples calls of each kind (create key, patch key, publish, delete key), kinds rotated each round;
   `mgmt-small`: --small-samples of each the same way before the catalog grows (step 0), for comparison in one run.
6. `dataplane`: one caller, one keep-alive connection, /q/account?aid=R for --dp-seconds; with no change, and
   with a change (patch, publish, create, delete in turn) every --change-every seconds; conditions alternate,
   --dp-rounds rounds. Every answer's status and body are checked.
7. `scale`: for each of --scale-workers, the master restarted with that many workers on the same store, and
   --scale-samples calls of each kind.

Pinning: the gateway's master and workers on --target-cpu; PostgreSQL, Redis and this process on --pg-cpu.
"""
from __future__ import annotations

import gc
import itertools
import json
import os
import random
import sys
import threading
import time
from pathlib import Path

import psycopg2

from ... import harness, report, system, targets
from ...harness import log, now_iso, rotated
from ...stats import percentile, summary
from ..sync.run import wait_workers
from .render import KINDS

_NAMES = itertools.count(1)   # key names unique across every Changes of a run
STORE_DB = 'gwstore_controlplane'


class Changes:
    """The management calls the block makes: the four kinds, on keys of its own and the benchmark query."""

    def __init__(self, target):
        self.client = targets.Client(target.base_url, {'X-API-Key': target.admin_key})
        self.created: list[str] = []
        self.counter = 0
        self.version = 1

    def make(self, kind: str) -> tuple[int, float]:
        self.counter += 1
        if kind == 'create-key':
            name = f'cp-{os.getpid()}-{next(_NAMES)}'
            status, _, ms = self.client.call('POST', '/api/v1/api-keys', targets.key_body(name))
            if status == 201:
                self.created.append(name)
        elif kind == 'patch-key':
            queries = [targets.QUERY] if self.counter % 2 else [targets.QUERY, 'account_v2_probe']
            status, _, ms = self.client.call('PATCH', f'/api/v1/api-keys/{self.patched}', {'queries': queries})
        elif kind == 'publish':
            self.version = 3 - self.version
            status, _, ms = self.client.call('POST', f'/api/v1/queries/{targets.QUERY}/publish',
                                             {'version': self.version})
        else:
            if not self.created:
                self.make('create-key')
            status, _, ms = self.client.call('DELETE', f'/api/v1/api-keys/{self.created.pop(0)}')
        return status, ms

    patched = 'cp-patched'

    def close(self):
        self.client.close()


class Contention:
    """How busy the whole machine was meanwhile (this block's processes included): its busy cores, and the
    1-minute load average at the end. On a machine others share, the first thing to read when a figure is off."""

    def __init__(self):
        self.meter = system.MachineMeter()
        self.meter.start()
        self.started = time.monotonic()

    def stop(self) -> dict:
        busy = self.meter.stop()
        return {'machine_cores': round(busy / max(time.monotonic() - self.started, 1e-6), 3),
                'loadavg_1m': round(os.getloadavg()[0], 2)}


def start(run, store_url: str, redis_url: str, workers: int):
    args = run.args
    target = targets.start_gateway(port=args.gateway_port, cpu=args.target_cpu, store_url=store_url,
                                   redis_url=redis_url, run_dir=run.work_dir / f'w{workers}', admin_key=args.admin_key,
                                   extra_env={'GATEWAY_WORKERS': str(workers), 'GATEWAY_THREADS': str(args.threads),
                                              'GATEWAY_LOG_LEVEL': 'warning'},
                                   name=f'gateway-{workers}w', root=args.gateway_root)
    run.cleanup.append(target.process)
    target.description = f'gateway-fleet, {workers} workers, {args.threads} threads each'
    targets.wait_healthy(target, timeout_s=300)
    pids = wait_workers(redis_url, target.pids[0], workers, timeout_s=600)
    run.meta['targets'].append(target.summary())
    return target, pids


class CallCosts:
    """What a batch of management calls cost the shared parts, per call: the gateway's CPU (master and every
    worker), the Redis commands by name (INFO commandstats: the announcement, the acknowledgement polls, the
    workers' acks and heartbeats, events) and the store's transactions, the workers' reads included (pg_stat_database; its counters
    trail by up to a second, so it is read after a pause). Heartbeats and pings are in it too (a few a second)."""

    def __init__(self, master: int, redis_url: str, store_url: str):
        import redis
        self.redis = redis.Redis.from_url(redis_url)
        self.store_url = store_url
        self.redis_before = self._commands()
        self.store_before = self._transactions()
        self.cpu = system.CpuMeter(master)
        self.cpu.start()

    def _commands(self) -> dict:
        return {name.split('_', 1)[1]: stats['calls'] for name, stats in self.redis.info('commandstats').items()}

    def _transactions(self) -> int | None:
        try:
            conn = psycopg2.connect(self.store_url)
            try:
                with conn.cursor() as cur:
                    # this connection's own transaction ends in a rollback at close: not counted
                    cur.execute('SELECT xact_commit + xact_rollback FROM pg_stat_database '
                                'WHERE datname = current_database()')
                    return cur.fetchone()[0]
            finally:
                conn.close()
        except psycopg2.Error:
            return None

    def per_call(self, calls: int) -> dict:
        cpu_s = self.cpu.stop() or 0.0
        time.sleep(1.5)
        commands = self._commands()
        transactions = self._transactions()
        calls = max(calls, 1)
        redis_per = {k: round((v - self.redis_before.get(k, 0)) / calls, 2) for k, v in sorted(commands.items())
                     if k not in ('info',) and v - self.redis_before.get(k, 0) > 0}
        return {'gateway_cpu_ms': round(cpu_s * 1000 / calls, 2), 'redis_commands': round(sum(redis_per.values()), 2),
                'redis_by_command': redis_per,
                'store_transactions': None if transactions is None or self.store_before is None
                else round((transactions - self.store_before - 1) / calls, 2)}


def grow_keys(target, count: int, sequential: int, clients: int, write, redis_url: str, store_url: str) -> None:
    """The first `sequential` keys one after another on one connection, the rest from `clients` connections at once
    (a provisioning script's way; their changes are applied together when they arrive together)."""
    samples: list[float] = []
    errors: dict = {}
    lock = threading.Lock()

    def create(names) -> None:
        client = targets.Client(target.base_url, {'X-API-Key': target.admin_key})
        try:
            for name in names:
                status, _, ms = client.call('POST', '/api/v1/api-keys', targets.key_body(name))
                with lock:
                    if status == 201:
                        samples.append(ms)
                    else:
                        errors[status] = errors.get(status, 0) + 1
        finally:
            client.close()

    names = [f'grow-{i:06d}' for i in range(count)]
    first, rest = names[:sequential], names[sequential:]
    costs = CallCosts(target.pids[0], redis_url, store_url)
    started = time.monotonic()
    create(first)
    sequential_s = time.monotonic() - started
    sequential_samples = list(samples)
    sequential_costs = costs.per_call(len(first))
    log(f'{len(first)} keys one after another in {sequential_s:.1f} s; per key {sequential_costs}')
    costs = CallCosts(target.pids[0], redis_url, store_url)
    parallel_started = time.monotonic()
    threads = [threading.Thread(target=create, args=(rest[i::clients],)) for i in range(clients)] if rest else []
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    parallel_s = time.monotonic() - parallel_started
    parallel_costs = costs.per_call(len(rest))
    log(f'{len(rest)} keys from {clients} clients in {parallel_s:.1f} s; per key {parallel_costs}')
    write({'step': 'grow-keys', 'keys': count, 'seconds': round(time.monotonic() - started, 3),
           'sequential': {'keys': len(first), 'seconds': round(sequential_s, 3),
                          'latency_ms': summary(sequential_samples),
                          'per_thousand_ms': [summary(sequential_samples[i:i + 1000])
                                              for i in range(0, len(sequential_samples), 1000)],
                          'per_key': sequential_costs},
           'parallel': {'keys': len(rest), 'clients': clients, 'seconds': round(parallel_s, 3),
                        'latency_ms': summary(samples[len(sequential_samples):]), 'per_key': parallel_costs},
           'errors': errors, 'ok': not errors})


def grow_queries(target, store_url: str, api_count: int, total: int, write) -> None:
    client = targets.Client(target.base_url, {'X-API-Key': target.admin_key})
    samples, errors = [], {}
    started = time.monotonic()
    try:
        for i in range(api_count):
            status, _, ms = client.call('POST', '/api/v1/queries', targets.query_body(f'grow_q{i:05d}'))
            if status == 201:
                samples.append(ms)
            else:
                errors[status] = errors.get(status, 0) + 1
    finally:
        client.close()
    api_seconds = time.monotonic() - started
    bulk = max(0, total - api_count)
    conn = psycopg2.connect(store_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("""INSERT INTO gw_queries (name, published_version)
                           SELECT 'bulk_q' || lpad(n::text, 5, '0'), 1 FROM generate_series(1, %s) n""", (bulk,))
            cur.execute("""INSERT INTO gw_query_versions (query_id, version, connection_id, sql, parameters,
                                                          description, tags, extra, published_at)
                           SELECT q.id, 1, v.connection_id, v.sql, v.parameters, v.description, v.tags, v.extra,
                                  now()
                             FROM gw_queries q, gw_query_versions v JOIN gw_queries a ON a.id = v.query_id
                            WHERE q.name LIKE 'bulk_q%%' AND a.name = %s AND v.version = 1""", (targets.QUERY,))
            # A generation no change-log row covers: every worker's next refresh reads everything.
            cur.execute('UPDATE gw_catalog_state SET generation = generation + 1')
    finally:
        conn.close()
    # The next change makes every worker load the whole (grown) catalog before the call returns.
    client = targets.Client(target.base_url, {'X-API-Key': target.admin_key})
    try:
        status, _, gap_ms = client.call('POST', '/api/v1/api-keys', targets.key_body('grow-gap'))
    finally:
        client.close()
    write({'step': 'grow-queries', 'api_queries': api_count, 'api_seconds': round(api_seconds, 3),
           'api_latency_ms': summary(samples), 'bulk_queries': bulk, 'gap_call_ms': round(gap_ms, 3),
           'gap_status': status, 'errors': errors, 'ok': not errors and status == 201})


def full_load(store_url: str, write) -> None:
    from gateway.model import catalog
    conn = psycopg2.connect(store_url)
    conn.autocommit = True
    times, sizes = [], {}
    try:
        cpu = []
        for _ in range(3):
            started, cpu_started = time.perf_counter(), time.process_time()
            loaded, done = catalog.refresh(conn, catalog.Catalog.empty())
            times.append((time.perf_counter() - started) * 1000)
            cpu.append((time.process_time() - cpu_started) * 1000)
            sizes = {'keys': len(loaded.keys), 'queries': len(loaded.queries), 'rows': done.rows}
        generation = loaded.generation
        # A full pass of the cyclic garbage collector with this catalog alive, then with it frozen out of the
        # collector's reach (what a worker does after a full load: gateway.model.state)
        gc_ms = {}
        for label in ('loaded', 'frozen'):
            if label == 'frozen':
                gc.freeze()
            runs = []
            for _ in range(3):
                cpu_started = time.process_time()
                gc.collect()
                runs.append((time.process_time() - cpu_started) * 1000)
            gc_ms[label] = summary(runs)
        gc.unfreeze()
        # The incremental refresh of one change, for comparison: the catalog one generation back applying it.
        with conn.cursor() as cur:
            cur.execute('SELECT max(generation) FROM gw_catalog_changes')
            last = cur.fetchone()[0]
        applied = []
        if last == generation:
            for _ in range(5):
                behind = catalog.refresh(conn, catalog.Catalog.empty())[0]
                behind.generation = generation - 1
                started, cpu_started = time.perf_counter(), time.process_time()
                _, done = catalog.refresh(conn, behind)
                applied.append(((time.perf_counter() - started) * 1000, done.how, done.rows,
                                (time.process_time() - cpu_started) * 1000))
    finally:
        conn.close()
    write({'step': 'full-load', 'ms': summary(times), 'cpu_ms': summary(cpu), **sizes, 'gc_full_pass_cpu_ms': gc_ms,
           'one_change_cpu_ms': summary([a[3] for a in applied]),
           'one_change_ms': summary([a[0] for a in applied]), 'one_change_how': sorted({a[1] for a in applied}),
           'one_change_rows': max((a[2] for a in applied), default=None), 'ok': True})


def management_calls(changes: Changes, kinds, samples: int, rounds: int, workers: int, write, step: str,
                     master: int) -> None:
    per_round = max(1, samples // rounds)
    idle = system.CpuMeter(master)   # the fleet's own background (heartbeats, pings, threads), no calls
    idle.start()
    time.sleep(2.0)
    idle_cores = (idle.stop() or 0) / 2.0
    for r in range(rounds):
        for kind in rotated(list(kinds), r):
            got, errors = [], {}
            machine = Contention()
            gateway = system.CpuMeter(master)
            gateway.start()
            began = time.monotonic()
            for _ in range(per_round):
                status, ms = changes.make(kind)
                if 200 <= status < 300:
                    got.append(ms)
                else:
                    errors[status] = errors.get(status, 0) + 1
            record = {'step': step, 'workers': workers, 'round': r + 1, 'kind': kind, 'latency_ms': summary(got),
                      'samples_ms': [round(s, 3) for s in got], 'errors': errors, 'ok': not errors,
                      # the CPU every gateway process (master, workers) spent per call: the call and each
                      # worker applying it; unlike the wall time, other processes on the machine do not add to it
                      'gateway_cpu_ms_per_call': round((gateway.stop() or 0) * 1000 / max(per_round, 1), 2),
                      'gateway_idle_cpu_ms_per_call': round(idle_cores * (time.monotonic() - began) * 1000
                                                            / max(per_round, 1), 2),
                      **machine.stop()}
            write(record)
            log(f'{workers} workers, round {r + 1}, {kind}: p50 {record["latency_ms"].get("50")} ms, p99 '
                f'{record["latency_ms"].get("99")} ms' + (f'  ⚠ {errors}' if errors else ''))


def data_plane(target, max_id: int, seconds: float, changing: bool, change_every: float, pids, write,
               round_index: int) -> None:
    """One caller on one keep-alive connection for `seconds`; with `changing`, a change every `change_every` s."""
    caller = targets.Client(target.base_url, {'X-API-Key': target.api_key})
    stop = threading.Event()
    made: list = []

    def changer():
        changes = Changes(target)
        kinds = ('patch-key', 'publish', 'create-key', 'delete-key')
        i = 0
        try:
            while not stop.wait(change_every):
                made.append(changes.make(kinds[i % len(kinds)]))
                i += 1
        finally:
            changes.close()
    thread = threading.Thread(target=changer, daemon=True) if changing else None
    latencies, wrong, statuses = [], 0, {}
    cpu = system.CpuMeter(*pids)
    cpu.start()
    machine = Contention()
    started = time.monotonic()
    if thread is not None:
        thread.start()
    try:
        while time.monotonic() - started < seconds:
            aid = random.randint(1, max_id)
            status, body, ms = caller.call('GET', f'{target.query_path}?{target.param}={aid}')
            statuses[status] = statuses.get(status, 0) + 1
            latencies.append(ms)
            if status != 200 or json.loads(body)[0].get('aid') != aid:
                wrong += 1
    finally:
        stop.set()
        if thread is not None:
            thread.join(30)
        caller.close()
    elapsed = time.monotonic() - started
    worker_cpu = cpu.stop()
    change_errors = [s for s, _ in made if not 200 <= s < 300]
    record = {'step': 'dataplane', 'round': round_index, 'changing': changing, 'seconds': round(elapsed, 3),
              'calls': len(latencies), 'latency_ms': {**summary(latencies), '99.9': _pct(latencies, 99.9)},
              'samples_ms': [round(x, 3) for x in latencies], 'statuses': statuses, 'wrong_bodies': wrong,
              'changes': len(made), 'change_ms': summary([ms for _, ms in made]), 'change_errors': len(change_errors),
              'gateway_cores': round(worker_cpu / elapsed, 3) if worker_cpu is not None else None,
              **machine.stop(), 'ok': not wrong and not change_errors}
    write(record)
    lat = record['latency_ms']
    log(f'data plane round {round_index} {"with changes" if changing else "quiet"}: {len(latencies)} calls, p50 '
        f'{lat.get("50")} ms, p99 {lat.get("99")} ms, p99.9 {lat.get("99.9")}, max {lat.get("max")} ms; '
        f'{len(made)} changes' + ('' if record['ok'] else f'  ⚠ {wrong} wrong bodies, {len(change_errors)} errors'))


def _pct(values, q):
    value = percentile(values, q)
    return None if value is None else round(value, 3)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = harness.parser_for('controlplane', __doc__)
    add = parser.add_argument
    harness.add_data_source(parser, local_pg_port=54510)
    add('--keys', type=int, default=10_000)
    add('--sequential-keys', type=int, default=1_000,
        help='of --keys, how many one after another (the rest from --key-clients at once)')
    add('--key-clients', type=int, default=8)
    add('--queries', type=int, default=5_000)
    add('--api-queries', type=int, default=300, help='of --queries, how many through the API')
    add('--workers', type=int, default=4)
    add('--threads', type=int, default=4, help='GATEWAY_THREADS per worker')
    add('--samples', type=int, default=200, help='management calls of each kind at --workers')
    add('--small-samples', type=int, default=100, help='management calls of each kind before the catalog grows (0: none)')
    add('--rounds', type=int, default=4, help='rounds the samples are split into')
    add('--dp-seconds', type=float, default=20)
    add('--dp-rounds', type=int, default=3)
    add('--change-every', type=float, default=1.5)
    add('--scale-workers', default='16,64', help="worker counts measured after (''/none: skip)")
    add('--scale-samples', type=int, default=40)
    add('--target-cpu', default='1')
    add('--pg-cpu', default='0')
    add('--gateway-port', type=int, default=18012)
    add('--gateway-root', type=Path, default=targets.REPO,
        help='the checkout to run (e.g. an older commit unpacked elsewhere, for a before/after)')
    add('--redis-port', type=int, default=18389)
    add('--max-id', type=int, default=1_000_000)
    add('--keep-stores', action='store_true')
    add('--reuse-grown', action='store_true',
        help="keep the store a previous run grew and skip growing it (and the small-catalog cells)")
    harness.add_output(parser)
    args = harness.parse(parser, argv)
    args.admin_key = 'adm_controlplane_' + os.urandom(8).hex()
    if args.pg_cpu not in ('', 'off'):
        from gateway.settings import parse_cpu_list
        os.sched_setaffinity(0, set(parse_cpu_list(args.pg_cpu)))
    return harness.run_block('controlplane', args, ['controlplane', *argv], body, report.write,
                             tools=('redis-server',))


def body(run) -> None:
    args, meta = run.args, run.meta
    meta['settings'] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                        if k not in ('admin_key', 'database_url')}
    meta['pinning_note'] = (f'gateway master and workers on CPU {args.target_cpu}; Redis and this process on CPU '
                            f'{args.pg_cpu}; {run.pg_note}')
    run.save()

    def write(record: dict) -> None:
        run.block.write({'block': 'controlplane', **record, 'at': now_iso()})

    store_url = system.dsn_with_db(args.database_url, STORE_DB)
    system.recreate_database(args.database_url, STORE_DB, drop=not (args.keep_stores or args.reuse_grown))
    redis_process, redis_url = targets.start_redis(port=args.redis_port, cpu=args.pg_cpu, run_dir=run.work_dir)
    run.cleanup.append(redis_process)
    target, pids = start(run, store_url, redis_url, args.workers)
    if args.reuse_grown:   # the password was sealed with the previous run's GATEWAY_SECRET_KEY: seal it again
        body = {k: v for k, v in targets.connection_body(args.database_url).items() if k != 'name'}
        status, reply = targets.management(target, 'PATCH', f'/connections/{targets.CONNECTION}', body)
        if status != 200:
            raise targets.TargetError(f'PATCH /connections/{targets.CONNECTION} answered {status}: {str(reply)[:300]}')
    target.info['provisioned'] = targets.provision(target, args.database_url)
    for path, body in ((f'/queries/{targets.QUERY}/versions',
                        {**targets.query_body(), 'description': 'version 2', 'publish': False}),
                       ('/api-keys', targets.key_body(Changes.patched))):
        status, reply = targets.management(target, 'POST', path, body)
        if status != 201 and not (status == 409 and args.reuse_grown):
            raise targets.TargetError(f'POST {path} answered {status}: {str(reply)[:300]}')
    # the store a previous run grew: its workers started on the whole of it
    rss = {'keys+queries (started on it)' if args.reuse_grown else 'small': system.rss_kb(pids)}
    if args.small_samples and not args.reuse_grown:   # the same calls on the small catalog first: what growing it changes
        with_changes(target, args.small_samples, args.rounds, args.workers, write, 'mgmt-small')
    if not args.reuse_grown:
        grow_keys(target, args.keys, min(args.sequential_keys, args.keys), args.key_clients, write, redis_url,
                  store_url)
        rss['keys'] = system.rss_kb(pids)
        grow_queries(target, store_url, min(args.api_queries, args.queries), args.queries, write)
        rss['keys+queries'] = system.rss_kb(pids)
    write({'step': 'rss', 'workers': len(pids), 'rss_kb': rss, 'ok': True})
    full_load(store_url, write)
    with_changes(target, args.samples, args.rounds, args.workers, write, 'mgmt', warm=10)
    for r in range(args.dp_rounds):
        for changing in ((False, True) if r % 2 == 0 else (True, False)):
            data_plane(target, args.max_id, args.dp_seconds, changing, args.change_every, pids, write, r + 1)
    for workers in [int(w) for w in args.scale_workers.split(',') if w.strip().isdigit()]:
        targets.stop_process(target.process)
        target, pids = start(run, store_url, redis_url, workers)
        with_changes(target, args.scale_samples, 2, workers, write, 'scale')
        write({'step': 'rss', 'workers': workers, 'rss_kb': {'keys+queries': system.rss_kb(pids)}, 'ok': True})


def with_changes(target, samples: int, rounds: int, workers: int, write, step: str, warm: int = 1) -> None:
    """management_calls after `warm` calls of every kind (the store's sessions, the workers' reload path)."""
    changes = Changes(target)
    try:
        for _ in range(warm):
            for kind in KINDS:
                changes.make(kind)
        management_calls(changes, KINDS, samples, rounds, workers, write, step, target.pids[0])
    finally:
        changes.close()
