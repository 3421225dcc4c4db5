"""The server chosen by measurement (issue 25, part 2): the current worker, gunicorn with its C parser and granian,
serving the same application with the same settings, in one interleaved run.

    .venv/bin/pip install -e '.[servers]'                  # granian and gunicorn-h1c, pinned
    .venv/bin/python -m loadtests.servers                  # ~7 min; writes docs/bench/<date>-servers.md
    .venv/bin/python -m loadtests.servers --quick --allow-dirty   # a smoke: 1 round, 2 s a run, ~2 min
    .venv/bin/python -m loadtests.servers --servers current,current-h1c,gthread-h1c,granian,granian-wide   # ~11 min

Servers (``--servers``; the first is the one the others are divided by), each one worker pinned to --server-cpu:
``current`` (fleet's worker, `--http-parser python`), ``current-h1c`` (the same with gunicorn-h1c), ``gthread-h1c``
and ``gthread`` (gunicorn's own ThreadWorker with and without it), ``granian`` and ``granian-wide`` (with --backlog
and --backpressure 8192). Each h1c server is checked to use the C parser (its library mapped in the worker, and a bad
request line refused in the C parser's words), the others not to; one that cannot start is left out, with why. All
on the embedded PostgreSQL and Redis (fleet.ops.local, seeded as `fleet up` seeds it), pinned to --pg-cpu.

Per round, each test on every server in an order rotated each round, the others SIGSTOPped: ``lookup`` and ``hit``
(wrk -c32, every body checked and a few compared with PostgreSQL's rows; req/s and CPU per call), ``lookup-c1`` and
``hit-c1`` (one caller's p50), ``health`` (/health back to back, loadtests/slowclients.py's probe), and ``slow-N``
(N partial heads held by a child process while /health is probed and the lookup runs). The report
(loadtests/servers_render.py): medians [min-max], ratios to the first server paired per round and judged on the
worst round, and the fleet's guarantees each server offers (read, not measured). loadtests/README.md says more.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shlex
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import psutil

from . import rundir, servers_render, slowclients, system, targets, wrk
from .harness import Frozen, log, now_iso, prewarm_and_describe, rotated
from .targets import Target, TargetError

GTHREAD = 'gunicorn.workers.gthread.ThreadWorker'
THREADS = 8                 # the gateway's default GATEWAY_THREADS, and granian's --blocking-threads
HIT_QUERY = 'account_cached'
HIT_TTL = 3600              # far longer than a run: every call of the hot set is a hit after the warm-up
HOT_SET = 1000
MAX_AID = 1_000_000
BAD_REQUEST_LINE = b'GET /hea lth HTTP/1.1\r\nHost: x\r\n\r\n'   # refused by both parsers, in their own words
VENV = system.REPO / '.venv' / 'bin'
WIDE = 8192                 # granian-wide's accept queue and backpressure (its defaults: 1,024 each)


@dataclass(frozen=True)
class Spec:
    name: str
    label: str
    kind: str                        # gunicorn | granian
    worker_class: str | None = None  # GATEWAY_WORKER_CLASS; None: the default (fleet's balanced gthread)
    http_parser: str | None = None   # gunicorn --http-parser
    extra: tuple = ()                # more arguments of its command line


SPECS = {s.name: s for s in (
    Spec('current', 'the current worker (fleet.server.worker.BalancedThreadWorker), pure-Python parser', 'gunicorn',
         None, 'python'),
    Spec('current-h1c', 'the current worker with gunicorn-h1c (`--http-parser fast`)', 'gunicorn', None, 'fast'),
    Spec('gthread-h1c', "gunicorn's gthread (ThreadWorker) with gunicorn-h1c", 'gunicorn', GTHREAD, 'fast'),
    Spec('gthread', "gunicorn's gthread (ThreadWorker), pure-Python parser", 'gunicorn', GTHREAD, 'python'),
    Spec('granian', f'granian, WSGI, 1 worker, {THREADS} blocking threads', 'granian'),
    Spec('granian-wide', f'granian as `granian`, with --backlog and --backpressure {WIDE}', 'granian',
         extra=('--backlog', str(WIDE), '--backpressure', str(WIDE))),
)}
# The three: (a) today's worker, (b) gunicorn with its C parser, (c) granian. ~7 minutes (about 40 s a
# server a round, and 40 s to start); each server more adds about 2 minutes (``--servers current,current-h1c,gthread-h1c,gthread,granian,granian-wide``: all of them).
DEFAULT_SERVERS = ('current', 'current-h1c', 'granian')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--servers', default=','.join(DEFAULT_SERVERS),
                        help=f'comma-separated, the first is the reference; of: {", ".join(SPECS)}')
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--duration', type=float, default=5, help='seconds of each -c32 run (lookup, hit)')
    parser.add_argument('--c1-duration', type=float, default=2, help='seconds of each single-caller run')
    parser.add_argument('--health-duration', type=float, default=2, help='seconds of each /health probe')
    parser.add_argument('--slow-duration', type=float, default=2,
                        help='seconds of the lookup run while slow clients are held')
    parser.add_argument('--slow', default='20,200,2000', help='slow-client counts, comma-separated (0: none)')
    parser.add_argument('--probe-timeout', type=float, default=1.0,
                        help='seconds a /health call (and, under slow clients, a wrk call) may take before it '
                             'counts as a timeout')
    parser.add_argument('--warmup', type=float, default=2, help='seconds of warm-up per server and path')
    parser.add_argument('--quick', action='store_true', help='a smoke: 1 round, 2 s for every run, no report in docs/')
    parser.add_argument('--server-cpu', default='1')
    parser.add_argument('--load-cpu', default='0', help='wrk, the prober, the slow clients and this process')
    parser.add_argument('--pg-cpu', default='0', help='PostgreSQL and Redis')
    parser.add_argument('--base-port', type=int, default=18970, help='server i listens on base-port + i')
    parser.add_argument('--home', type=Path, default=None,
                        help='home of the embedded PostgreSQL and Redis (default $GATEWAY_HOME, else .bench/servers)')
    parser.add_argument('--keep-services', action='store_true',
                        help='leave the embedded PostgreSQL and Redis running at the end if this run started them')
    parser.add_argument('--out', type=Path, default=rundir.RESULTS)
    parser.add_argument('--no-publish', action='store_true',
                        help='leave the report in the run folder (a full run writes docs/bench/<date>-servers.md)')
    parser.add_argument('--allow-dirty', action='store_true', help='run from a dirty tree (then nothing is published)')
    parser.add_argument('--render', type=Path, metavar='RUN_DIR', help='only render RUN_DIR/results.md again')
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = 1
        args.duration = args.c1_duration = args.health_duration = args.slow_duration = 2
        args.warmup = 1
    args.server_names = [name.strip() for name in args.servers.split(',') if name.strip()]
    unknown = [name for name in args.server_names if name not in SPECS]
    if unknown:
        parser.error(f'unknown server(s) {unknown}; known: {", ".join(SPECS)}')
    args.slow_counts = [int(n) for n in args.slow.split(',') if n.strip() and int(n) > 0]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.render:
        print(servers_render.write(args.render))
        return 0
    os.sched_setaffinity(0, {int(c) for c in _cpus(args.load_cpu)})
    git = system.git_state()
    publish = not args.quick and not args.no_publish
    if git['dirty'] and not args.allow_dirty:
        raise SystemExit('the tree has uncommitted changes: commit them (a result names one commit), or pass '
                         '--allow-dirty (nothing is published then)')
    publish = publish and not git['dirty']
    run_dir, work_dir = rundir.new(args.out, 'servers')
    meta = {'block': 'servers', 'started_at': now_iso(), 'command': shlex.join([sys.executable, '-m',
                                                                                 'loadtests.servers', *sys.argv[1:]]),
            'machine': system.machine_info(), 'work_dir': str(work_dir), 'settings': _settings(args),
            'versions': {'harness': system.venv_versions(VENV / 'python', [
                'gunicorn', 'gunicorn-h1c', 'granian', 'falcon', 'psycopg2-binary', 'orjson', 'redis']),
                'gateway_fleet': system.our_version(), 'wrk': system.wrk_version(), 'git': git},
            'limits': _limits(), 'skipped': {}, 'targets': []}
    rundir.write_meta(run_dir, meta)
    log(f'run folder {run_dir}; logs and homes in {work_dir}')
    started = time.monotonic()
    with Services(args, work_dir) as services:
        meta['data'] = services.data
        rundir.write_meta(run_dir, meta)
        live = start_servers(args, services, work_dir, meta)
        rundir.write_meta(run_dir, meta)
        try:
            with (run_dir / 'results.jsonl').open('a') as results:
                Rounds(args, services, live, results).run()
        finally:
            for server in live:
                targets.stop_process(server.process)
    meta['finished_at'] = now_iso()
    meta['wall_s'] = round(time.monotonic() - started, 1)
    rundir.write_meta(run_dir, meta)
    report = rundir.write_report(run_dir, servers_render.render)
    log(f'{report} ({meta["wall_s"]:.0f} s in all)')
    if publish:
        page = rundir.publish(run_dir, servers_render.DOCS, servers_render.render, servers_render.page_name)
        log(f'published {page}')
    return 0


def _settings(args) -> dict:
    return {'servers': args.server_names, 'reference': args.server_names[0], 'rounds': args.rounds,
            'duration_s': args.duration, 'c1_duration_s': args.c1_duration,
            'health_duration_s': args.health_duration, 'slow_duration_s': args.slow_duration,
            'slow_counts': args.slow_counts, 'probe_timeout_s': args.probe_timeout, 'warmup_s': args.warmup,
            'quick': args.quick, 'server_cpu': args.server_cpu, 'load_cpu': args.load_cpu, 'pg_cpu': args.pg_cpu,
            'connections': 32, 'hot_set': HOT_SET, 'cache_ttl': HIT_TTL, 'threads': THREADS}


def _limits() -> dict:
    somaxconn = Path('/proc/sys/net/core/somaxconn')
    return {'somaxconn': int(somaxconn.read_text()) if somaxconn.exists() else None,
            'nofile': list(resource.getrlimit(resource.RLIMIT_NOFILE))}


def _cpus(spec: str) -> list[str]:
    out = []
    for part in spec.split(','):
        lo, _, hi = part.partition('-')
        out += [str(c) for c in range(int(lo), int(hi or lo) + 1)]
    return out


# --------------------------------------------------------------------------------------
# The embedded PostgreSQL and Redis, the demo and the cache hit's query
# --------------------------------------------------------------------------------------

class Services:
    """fleet.ops.local's PostgreSQL and Redis (started if they are not running, stopped at the end if this run started
    them), pinned to --pg-cpu; ``env``: the GATEWAY_* every server gets; ``data``: what the report says of them."""

    def __init__(self, args, work_dir: Path):
        from gateway.settings import Settings
        os.environ.setdefault('GATEWAY_HOME', str(args.home or system.REPO / '.bench' / 'servers'))
        if args.home:
            os.environ['GATEWAY_HOME'] = str(args.home)
        for name in ('GATEWAY_DATABASE_URL', 'GATEWAY_REDIS_URL', 'GATEWAY_ADMIN_KEY', 'GATEWAY_SECRET_KEY'):
            os.environ.pop(name, None)     # the embedded default's own, never a caller's server
        self.settings = Settings.from_env()
        self.args = args
        self.work_dir = work_dir
        self.started: list = []
        self.env: dict = {}
        self.data: dict = {}
        self.demo_url = ''

    def __enter__(self) -> Services:
        from fleet.ops.local import LocalPostgres, LocalRedis, ensure_embedded
        home = Path(self.settings.home).absolute()
        pg, redis = LocalPostgres(home, self.settings.pg_port), LocalRedis(home, self.settings.redis_port)
        self.started = [s for s in (redis, pg) if not s.is_running()]
        self.env = ensure_embedded(self.settings)
        self.demo_url = self._demo_data()
        self.pg_pid = system.postmaster_pid(self.demo_url) or 0
        self.redis_pid = int(redis.pid_file.read_text()) if redis.pid_file.exists() else 0
        # New backends inherit the postmaster's affinity: pinned before any server opens its pools.
        pinned = [pid for root in (self.pg_pid, self.redis_pid) if root
                  for pid in system.pin_tree(root, self.args.pg_cpu)]
        settings, prewarm = prewarm_and_describe(self.demo_url)
        self.data = {**system.check_demo_table(self.demo_url), 'database_url': system.redact(self.demo_url),
                     'pg_settings': settings, 'prewarm': prewarm, 'home': str(home),
                     'pg_port': self.settings.pg_port, 'redis_port': self.settings.redis_port,
                     'pinned': f'PostgreSQL and Redis ({len(pinned)} processes) pinned to CPU {self.args.pg_cpu}'}
        log(f'embedded PostgreSQL :{self.settings.pg_port} and Redis :{self.settings.redis_port} under {home}; '
            f'{prewarm}')
        return self

    def _demo_data(self) -> str:
        from fleet.ops import local
        from fleet.ops.local.demo import create_demo_data, create_demo_reader
        url = local.demo_database_url(self.settings)
        create_demo_data(url)
        password, _ = local.demo_reader_password(self.settings)
        create_demo_reader(url, password)
        return url

    def seed(self, target: Target) -> dict:
        """The demo (fleet.ops.local.seed, as `fleet up` makes it) and the cache hit's query and key, through
        `target`'s Management API: {kind: (query path, key)}."""
        from fleet.ops import local
        from fleet.ops.local.demo import READER
        from fleet.ops.local.seed import Api, seed, update_login
        password, fresh = local.demo_reader_password(self.settings)
        login = {'host': '127.0.0.1', 'port': self.settings.pg_port, 'database': 'demo', 'user': READER,
                 'password': password}
        api = Api(target.base_url, target.admin_key)
        update_login(api, login, force=fresh)
        demo_key = seed(api, login, Path(self.settings.home) / 'demo_key')
        query = {'name': HIT_QUERY, 'connection_name': 'demo', 'sql': targets.ACCOUNT_SQL,
                 'parameters': {'aid': 'int'}, 'cache_ttl': HIT_TTL, 'publish': True,
                 'description': f'The demo lookup, cache_ttl {HIT_TTL} (loadtests.servers)'}
        status, body = api.call('POST', '/api/v1/queries', query)
        if status not in (201, 409):
            raise TargetError(f'creating {HIT_QUERY} answered {status}: {body}')
        api.call('DELETE', '/api/v1/api-keys/servers-bench')
        status, body = api.call('POST', '/api/v1/api-keys', {'name': 'servers-bench', 'queries': [HIT_QUERY]})
        if status != 201:
            raise TargetError(f'creating the key servers-bench answered {status}: {body}')
        return {'lookup': ('/q/account', demo_key), 'hit': (f'/q/{HIT_QUERY}', body['secret'])}

    def rows(self, aids: list[int]) -> dict[int, dict]:
        conn = system.pg_connect(self.demo_url)
        try:
            with conn.cursor() as cur:
                cur.execute('SELECT aid, bid, abalance FROM pgbench_accounts WHERE aid = ANY(%s)', (aids,))
                return {aid: {'aid': aid, 'bid': bid, 'abalance': abalance} for aid, bid, abalance in cur.fetchall()}
        finally:
            conn.close()

    def __exit__(self, *exc) -> None:
        if self.args.keep_services:
            return
        for service in self.started:
            service.stop()


# --------------------------------------------------------------------------------------
# The servers
# --------------------------------------------------------------------------------------

def start_servers(args, services: Services, work_dir: Path, meta: dict) -> list[Target]:
    """Every server of --servers that can run, started, seeded (the first), checked; the others in
    meta['skipped'] with the reason."""
    live: list[Target] = []
    for index, name in enumerate(args.server_names):
        spec = SPECS[name]
        missing = _missing(spec)
        if missing:
            meta['skipped'][name] = missing
            log(f'{name}: left out: {missing}')
            continue
        target = start_server(spec, args.base_port + index, args.server_cpu, services.env, work_dir)
        try:
            targets.wait_healthy(target, timeout_s=90)
            if not live:
                target.info['paths'] = services.seed(target)
            else:
                target.info['paths'] = live[0].info['paths']
            target.info['checks'] = check_server(target, spec)
        except (TargetError, OSError) as error:
            targets.stop_process(target.process)
            meta['skipped'][name] = f'did not start: {str(error)[:1500]}'
            log(f'{name}: left out: {str(error)[:300]}')
            continue
        live.append(target)
        summary = target.summary()
        summary.pop('paths', None)         # the keys' secrets stay out of meta.json
        meta['targets'].append(summary)
        log(f'{name} ready at {target.base_url} (pid {target.pids[0]}): {target.info["checks"]}')
    if not live:
        raise SystemExit(f'no server could be started: {meta["skipped"]}')
    return live


def _missing(spec: Spec) -> str | None:
    """Why `spec` cannot run from this venv, or None."""
    if spec.kind == 'granian':
        return None if (VENV / 'granian').exists() else "granian is not in .venv (pip install -e '.[servers]')"
    if spec.http_parser == 'fast':
        probe = system.venv_versions(VENV / 'python', ['gunicorn-h1c'])
        if not probe.get('gunicorn-h1c'):
            return "gunicorn-h1c is not in .venv (pip install -e '.[servers]')"
        code = ('import gunicorn_h1c; assert hasattr(gunicorn_h1c, "LimitRequestLine"), '
                '"gunicorn_h1c has no LimitRequestLine: gunicorn needs 0.4.1 or later"')
        done = subprocess.run([str(VENV / 'python'), '-c', code], capture_output=True, text=True, timeout=60)
        if done.returncode:
            return f'gunicorn_h1c {probe["gunicorn-h1c"]} does not load: {(done.stderr or done.stdout)[-300:]}'
    return None


def start_server(spec: Spec, port: int, cpu: str, service_env: dict, work_dir: Path) -> Target:
    home = work_dir / f'{spec.name}-home'
    home.mkdir(parents=True, exist_ok=True)
    settings = {**service_env, 'GATEWAY_WORKERS': '1', 'GATEWAY_CPUS': cpu, 'GATEWAY_THREADS': str(THREADS),
                'GATEWAY_HOME': str(home), 'GATEWAY_LOG_LEVEL': 'warning'}
    if spec.worker_class:
        settings['GATEWAY_WORKER_CLASS'] = spec.worker_class
    env = {k: v for k, v in os.environ.items() if not k.startswith(('GATEWAY_', 'PROMETHEUS_', 'GRANIAN_'))}
    env.update(settings)
    if spec.kind == 'granian':
        cmd = [str(VENV / 'granian'), '--interface', 'wsgi', '--factory', 'fleet.app:create_app', '--workers', '1',
               '--blocking-threads', str(THREADS), '--host', '127.0.0.1', '--port', str(port), '--log-level',
               'warning', *spec.extra]
    else:
        cmd = [str(VENV / 'gunicorn'), '-c', 'fleet/server/gunicorn_conf.py', '--bind', f'127.0.0.1:{port}',
               '--http-parser', spec.http_parser or 'auto', 'fleet.app:create_app()']
    log_path = work_dir / f'{spec.name}.log'
    process = targets.start_process(cmd, env=env, cwd=system.REPO, log_path=log_path, cpu=cpu)
    shown = {k: ('***' if k in ('GATEWAY_ADMIN_KEY', 'GATEWAY_SECRET_KEY') else system.redact(v))
             for k, v in settings.items()}
    shown_cmd = [f'GATEWAY_WORKER_CLASS={spec.worker_class}'] if spec.worker_class else []
    shown_cmd += ['taskset', '-c', cpu, *cmd]
    return Target(name=spec.name, base_url=f'http://127.0.0.1:{port}', admin_key=service_env['GATEWAY_ADMIN_KEY'],
                  pids=[process.pid], process=process, log_path=log_path, description=spec.label,
                  info={'command': shlex.join(shown_cmd), 'env': shown, 'cpu': cpu})


def workers_of(target: Target) -> list[int]:
    return [pid for pid in system.process_tree(*target.pids) if pid not in target.pids]


def check_server(target: Target, spec: Spec) -> dict:
    """What the server runs, seen from outside: which parser refused a bad request line, whether gunicorn_h1c is
    mapped in its workers, whether a second call of the cached query was a hit, and its processes' affinity."""
    status, refusal = raw_answer(target, BAD_REQUEST_LINE)
    said = ('C parser (gunicorn_h1c)' if b'Invalid Request Line' in refusal else
            'pure-Python parser' if b'Invalid HTTP Version' in refusal else f'its own ({status}, '
            f'{refusal[:60].decode("latin-1", "replace")!r})')
    workers = workers_of(target)
    mapped = [pid for pid in workers if any('gunicorn_h1c' in m.path for m in _maps(pid))]
    path, key = target.info['paths']['hit']
    seen = [targets.get(target.url(f'{path}?aid=42'), key)[1].get('x-cache', '') for _ in range(2)]
    checks = {'parser': said, 'h1c_mapped_in': f'{len(mapped)} of {len(workers)} worker(s)', 'x_cache': seen,
              'workers': workers, 'affinity': {pid: system.affinity(pid) for pid in [*target.pids, *workers]}}
    if spec.http_parser == 'fast' and (not mapped or 'C parser' not in said):
        raise TargetError(f'{spec.name} does not use gunicorn_h1c: {checks}')
    if spec.http_parser == 'python' and (mapped or 'C parser' in said):
        raise TargetError(f'{spec.name} uses gunicorn_h1c though asked for the pure-Python parser: {checks}')
    if seen[1].lower() != 'hit':
        raise TargetError(f'{spec.name}: a second call of {path} was not a cache hit (X-Cache {seen})')
    return checks


def raw_answer(target: Target, request: bytes) -> tuple[str, bytes]:
    import socket
    host, port = target.base_url.rsplit('/', 1)[1].split(':')
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(request)
        data = b''
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except OSError:
            pass
    head, _, body = data.partition(b'\r\n\r\n')
    return head.split(b'\r\n', 1)[0].decode('latin-1'), body


def _rows(body: bytes):
    """The rows of a JSON answer (a list, or an object's `rows`/`data`, as targets.probe reads them), or None."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    if isinstance(parsed, dict):
        return parsed.get('rows') or parsed.get('data')
    return parsed if isinstance(parsed, list) else None


def _maps(pid: int) -> list:
    try:
        return psutil.Process(pid).memory_maps(grouped=False)
    except psutil.Error:
        return []


# --------------------------------------------------------------------------------------
# The rounds
# --------------------------------------------------------------------------------------

class Rounds:
    """Every test on every live server, once a round, servers in an order rotated each round."""

    def __init__(self, args, services: Services, live: list[Target], results):
        self.args = args
        self.services = services
        self.live = live
        self.results = results
        self.host = '127.0.0.1'
        self.tests = ['lookup', 'hit', 'lookup-c1', 'hit-c1', 'health', *[f'slow-{n}' for n in args.slow_counts]]

    def run(self) -> None:
        for target in self.live:
            for kind in ('lookup', 'hit'):
                record = self.wrk_run(target, kind, 8, self.args.warmup)
                log(f'warm-up {target.name} {kind}: {record["rps"]:,.0f} req/s')
        total = self.args.rounds * len(self.tests) * len(self.live)
        done = 0
        started = time.monotonic()
        for r in range(self.args.rounds):
            order = rotated(self.live, r)
            for test in self.tests:
                for position, target in enumerate(order):
                    if target.process is not None and target.process.poll() is not None:
                        self.write({'kind': 'gone', 'round': r + 1, 'server': target.name, 'test': test,
                                    'log': targets.log_tail(target.log_path, 10)})
                        continue
                    record = self.measure(target, test)
                    record.update({'round': r + 1, 'position': position, 'order': [t.name for t in order]})
                    self.write(record)
                    done += 1
                    left = (time.monotonic() - started) / done * (total - done)
                    log(f'round {r + 1}/{self.args.rounds} {line(record)}  [{done}/{total}, ~{left:.0f} s left]')

    def write(self, record: dict) -> None:
        self.results.write(json.dumps(record) + '\n')
        self.results.flush()

    def measure(self, target: Target, test: str) -> dict:
        if test in ('lookup', 'hit'):
            record = self.wrk_run(target, test, 32, self.args.duration)
            record['sampled'] = self.sample_bodies(target, test)
            return record
        if test.endswith('-c1'):
            return self.wrk_run(target, test[:-3], 1, self.args.c1_duration, test=test)
        if test == 'health':
            with self.frozen(target):
                return {'kind': 'run', 'test': 'health', 'server': target.name,
                        'health': self.probe(target, self.args.health_duration)}
        return self.slow(target, int(test.split('-')[1]))

    def frozen(self, target: Target):
        return Frozen([t for t in self.live if t is not target])

    def wrk_run(self, target: Target, kind: str, connections: int, duration: float, *, test: str | None = None,
                timeout_s: float | None = None, freeze: bool = True) -> dict:
        path, key = target.info['paths'][kind]
        env = {'API_KEY': key, 'QUERY_PATH': path, 'PARAM': 'aid', 'MAX_ID': str(HOT_SET if kind == 'hit' else
                                                                              MAX_AID)}
        meters = Meters(target, self.services)
        with self.frozen(target) if freeze else nullcontext():
            meters.start()
            result = wrk.run(target.url('/'), connections=connections, duration_s=duration, env=env,
                             cpu=self.args.load_cpu, timeout_s=timeout_s)
            cpu = meters.stop(result.duration_s, result.wrk_cpu_s)
        problems = wrk.errors_of(result)
        calls = result.requests or 0
        return {'kind': 'run', 'test': test or kind, 'server': target.name, 'path': path,
                'connections': connections, **result.to_dict(), 'ok': not problems, 'problems': problems, **cpu,
                'cpu_us_per_call': _per_call(cpu['server_cpu_s'], calls),
                'worker_cpu_us_per_call': _per_call(cpu['worker_cpu_s'], calls), 'started_at': now_iso()}

    def sample_bodies(self, target: Target, kind: str, count: int = 3) -> dict:
        """A few answers read whole after the run and compared with PostgreSQL's rows."""
        path, key = target.info['paths'][kind]
        aids = random.sample(range(1, (HOT_SET if kind == 'hit' else MAX_AID) + 1), count)
        expected = self.services.rows(aids)
        wrong = []
        for aid in aids:
            status, headers, body = targets.get(target.url(f'{path}?aid={aid}'), key, timeout=10)
            rows = _rows(body)
            if status != 200 or rows != [expected.get(aid)]:
                wrong.append({'aid': aid, 'status': status, 'body': body[:200].decode('utf-8', 'replace')})
            elif kind == 'hit' and headers.get('x-cache', '').lower() != 'hit':
                wrong.append({'aid': aid, 'status': status, 'x_cache': headers.get('x-cache')})
        return {'checked': len(aids), 'wrong': wrong}

    def probe(self, target: Target, duration: float) -> dict:
        port = int(target.base_url.rsplit(':', 1)[1])
        return slowclients.probe(self.host, port, '/health', duration_s=duration, timeout_s=self.args.probe_timeout)

    def slow(self, target: Target, count: int) -> dict:
        """`count` partial heads held while /health is probed and the lookup runs; then let go, and the time
        until /health answers again."""
        port = int(target.base_url.rsplit(':', 1)[1])
        with self.frozen(target):
            with slowclients.Holder(self.host, port, count, cpu=self.args.load_cpu) as holder:
                time.sleep(0.3)            # the server has seen them
                health = self.probe(target, self.args.health_duration)
                lookup = self.wrk_run(target, 'lookup', 32, self.args.slow_duration, test=f'slow-{count}-lookup',
                                      timeout_s=self.args.probe_timeout, freeze=False)
                alive = target.process.poll() is None if target.process else True
            released = holder.released
            recovery_s = self.recovery(target)
        return {'kind': 'run', 'test': f'slow-{count}', 'server': target.name, 'slow_clients': count,
                'held': holder.held, 'released': released, 'health': health, 'lookup': lookup,
                'alive': alive, 'recovery_s': recovery_s}

    def recovery(self, target: Target, limit_s: float = 30.0) -> float | None:
        started = time.monotonic()
        while time.monotonic() - started < limit_s:
            try:
                status, _ = targets.http('GET', target.url('/health'), timeout=1)
                if status == 200:
                    return round(time.monotonic() - started, 3)
            except OSError:
                pass
            time.sleep(0.05)
        return None


class Meters:
    """CPU during one run: the server's processes (all, and its workers alone), PostgreSQL, Redis, and what the
    rest of the machine took (everything but those, wrk and this process with its children)."""

    def __init__(self, target: Target, services: Services):
        self.server = system.CpuMeter(*target.pids)
        self.workers = system.CpuMeter(*workers_of(target))
        self.pg = system.CpuMeter(services.pg_pid or 0)
        self.redis = system.CpuMeter(services.redis_pid or 0)
        self.machine = system.MachineMeter()

    def start(self) -> None:
        self.own = _own_cpu()
        for meter in (self.server, self.workers, self.pg, self.redis, self.machine):
            meter.start()

    def stop(self, duration_s: float, wrk_cpu_s: float) -> dict:
        server, workers = self.server.stop() or 0.0, self.workers.stop() or 0.0
        pg, redis = self.pg.stop() or 0.0, self.redis.stop() or 0.0
        machine = self.machine.stop()
        own = _own_cpu() - self.own          # this process and its children (wrk, the slow-client holder)
        other = max(0.0, machine - server - pg - redis - own)
        return {'server_cpu_s': round(server, 3), 'worker_cpu_s': round(workers, 3),
                'server_cores': round(server / duration_s, 3) if duration_s else None,
                'pg_cpu_s': round(pg, 3), 'redis_cpu_s': round(redis, 3), 'wrk_cpu_s': wrk_cpu_s,
                'other_cores': round(other / duration_s, 3) if duration_s else None}


def _own_cpu() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def _per_call(cpu_s: float | None, calls: int) -> float | None:
    return round(cpu_s / calls * 1e6, 1) if cpu_s and calls else None


def line(record: dict) -> str:
    """One progress line."""
    name = f'{record["test"]} {record["server"]}'
    if record['test'] == 'health':
        h = record['health']
        return f'{name}: /health p50 {_ms(h["p50_ms"])}, p99 {_ms(h["p99_ms"])}, {h["timeouts"]} timeouts'
    if record['test'].startswith('slow-'):
        h, w = record['health'], record['lookup']
        return (f'{name}: held {record["held"].get("connected")}/{record["slow_clients"]}; /health p50 '
                f'{_ms(h["p50_ms"])}, p99 {_ms(h["p99_ms"])}, {h["timeouts"]} timeouts; lookup {w["rps"]:,.0f} '
                f'req/s; back {record["recovery_s"]} s after; server did {record["released"]}')
    text = (f'{name} c={record["connections"]}: {record["rps"]:,.0f} req/s, p50 '
            f'{record["latency_us"]["50"] / 1000:.2f} ms, {record["cpu_us_per_call"]} µs CPU/call '
            f'(workers {record["worker_cpu_us_per_call"]})')
    if record.get('other_cores', 0) and record['other_cores'] > 0.1:
        text += f'  (other processes: {record["other_cores"]:.2f} cores)'
    if not record['ok'] or record.get('sampled', {}).get('wrong'):
        text += f'  ⚠ {record["problems"]} {record.get("sampled", {}).get("wrong", "")}'
    return text


def _ms(value) -> str:
    return '>timeout' if value is None else f'{value:.2f} ms'


if __name__ == '__main__':
    sys.exit(main())
