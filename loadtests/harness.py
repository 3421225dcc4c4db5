"""The harness's core, which every block runs on: one wrk run measured (Block.measure), the rounds of a closed-loop
block (run_rounds: a warm-up per target, a /health floor before and after, every cell once a round in an order
rotated each round), the data and the PostgreSQL a block runs against, and the probes blocks add to a run.

It imports no block: blocks import it (loadtests/blocks/), and bench.py reaches them through their registry.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from . import peer, system, targets, wrk
from .stats import NOISY_CORES
from .targets import Target, TargetError

WARMUP_CONNECTIONS = 8


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec='seconds')


def log(message: str):
    print(f'[{datetime.now().strftime("%H:%M:%S")}] {message}', flush=True)


class Block:
    """One block's runs, written to results.jsonl as they happen."""

    def __init__(self, name: str, run_dir: Path, args, pg_root: int | None):
        self.name = name
        self.run_dir = run_dir
        self.args = args
        self.pg_root = pg_root
        self.results = (run_dir / 'results.jsonl').open('a')
        self.done = 0
        self.planned = 0
        self.failures: list[str] = []   # runs with a non-2xx answer, a socket error or a wrong body
        self.started = time.monotonic()

    def close(self):
        self.results.close()

    def verdict(self) -> str | None:
        """Why the block failed though it ran to the end: a result with a wrong answer is no result."""
        if not self.failures:
            return None
        return f'{len(self.failures)} run(s) had errors or wrong bodies, first: {self.failures[0]}'

    def measure(self, target: Target, *, kind: str, connections: int, duration_s: float, health: bool = False,
                probes=(), wrk_env: dict | None = None, limited_ok: bool = False, **tags) -> dict:
        """One wrk run. `probes`: extra meters with start() and finish(record) -> dict of fields to add;
        `wrk_env`: more settings of the Lua script (on top of the target's own); `limited_ok`: 429s are expected
        (a load above a rate limit) and do not fail the run."""
        if target.process is not None and target.process.poll() is not None:
            raise TargetError(f'{target.name} has exited ({target.process.returncode}):\n'
                              + targets.log_tail(target.log_path))
        cpu_machine = system.MachineMeter()
        cpu_target = system.CpuMeter(*target.pids)
        cpu_pg = system.CpuMeter(self.pg_root) if self.pg_root else None
        env = {'API_KEY': target.api_key, 'QUERY_PATH': target.query_path, 'PARAM': target.param,
               'MAX_ID': str(self.args.max_id), **target.wrk_env, **(wrk_env or {})}
        started_at = now_iso()
        wall = time.monotonic()
        cpu_machine.start()
        cpu_target.start()
        if cpu_pg:
            cpu_pg.start()
        for probe in probes:
            probe.start()
        result = wrk.run(target.url('/health' if health else '/'), connections=connections, duration_s=duration_s,
                         script=wrk.HEALTH if health else wrk.RANDOM_AID, env=None if health else env,
                         cpu=self.args.load_cpu, timeout_s=self.args.wrk_timeout,
                         threads=getattr(self.args, 'wrk_threads', 1))
        target_cpu = cpu_target.stop()
        pg_cpu = cpu_pg.stop() if cpu_pg else None
        machine_cpu = cpu_machine.stop()
        other_cpu = machine_cpu - (target_cpu or 0) - (pg_cpu or 0) - result.wrk_cpu_s
        problems = wrk.errors_of(result, limited_ok=limited_ok)
        if problems:
            self.failures.append(f'{kind} of {target.name} at {connections} connections: {", ".join(problems)}')
        record = {
            'block': self.name, 'kind': kind, **tags, 'target': target.name, 'connections': connections,
            'path': '/health' if health else target.query_path, **result.to_dict(),
            'ok': not problems, 'problems': problems,
            'target_cpu_s': None if target_cpu is None else round(target_cpu, 3),
            'target_cores': None if target_cpu is None else round(target_cpu / result.duration_s, 3),
            'cpu_us_per_call': (round(target_cpu / result.requests * 1e6, 1)
                                if target_cpu is not None and result.requests else None),
            'pg_cpu_s': None if pg_cpu is None else round(pg_cpu, 3),
            'machine_cpu_s': round(machine_cpu, 3),
            'other_cores': round(max(0.0, other_cpu) / result.duration_s, 3),  # everything else on the machine
            'wrk_text': wrk.parse_text(result.text),  # wrk's own rounded summary, a cross-check of the JSON
            'started_at': started_at, 'wall_s': round(time.monotonic() - wall, 3),
        }
        for probe in probes:
            record.update(probe.finish(record))
        self.results.write(json.dumps(record) + '\n')
        self.results.flush()
        return record

    def write(self, record: dict):
        """A record that is not a wrk run (the sync block's), written as it comes."""
        self.results.write(json.dumps(record) + '\n')
        self.results.flush()


def progress_line(record: dict, prefix: str) -> str:
    lat = record['latency_us']
    line = (f'{prefix} {record["target"]} c={record["connections"]}: {record["rps"]:,.0f} req/s, '
            f'p50 {lat["50"] / 1000:.2f} ms, p99 {lat["99"] / 1000:.2f} ms')
    if record.get('cpu_us_per_call') is not None:
        line += f', {record["cpu_us_per_call"]:,.0f} µs CPU/call ({record["target_cores"]:.2f} cores)'
    if record.get('other_cores', 0) > NOISY_CORES:
        line += f'  (other processes: {record["other_cores"]:.2f} cores)'
    if not record['ok']:
        line += '  ⚠ ' + '; '.join(record['problems'])
    return line


def rotated(items: list, round_index: int) -> list:
    k = round_index % len(items)
    return items[k:] + items[:k]


# --------------------------------------------------------------------------------------
# The rounds of a closed-loop block
# --------------------------------------------------------------------------------------

def run_rounds(block: Block, live: list[Target], args, probes: dict | None = None, extra=lambda record: '',
               tags: dict | None = None, cell_env=None, limited_ok: bool = False):
    """The method every closed-loop block shares: a warm-up per target, a /health floor,
    rounds in which every cell (connections x target) runs once in an order rotated each
    round, and the floor again. ``probes``: per target name, extra meters for each run;
    ``extra``: more text for the progress line; ``tags``: more fields of every record (the limits block's mix);
    ``cell_env``: connections -> more settings of the Lua script for that cell's runs (None: none);
    ``limited_ok``: 429s are answers the load expects (the limits block's hot keys), not errors."""
    probes = probes or {}
    tags = tags or {}
    conns = args.connections
    frozen = {t.name: [Frozen([o for o in live if o is not t])] for t in live}
    runs_total = args.rounds * len(conns) * len(live)
    per_run = args.duration + 1.0
    for target in live:
        if args.warmup > 0:
            record = block.measure(target, kind='warmup', connections=WARMUP_CONNECTIONS, duration_s=args.warmup,
                                   limited_ok=limited_ok, **_probes(probes, target), **tags)
            log(progress_line(record, 'warm-up') + extra(record))
    floor(block, live, 'before', args, tags)
    done = 0
    for r in range(args.rounds):
        order = rotated(live, r)
        position = 0
        for c in conns:
            for target in order:
                record = block.measure(target, kind='run', round=r + 1, position=position, connections=c,
                                       duration_s=args.duration, order=[t.name for t in order],
                                       probes=list(probes.get(target.name, ())) + frozen[target.name],
                                       wrk_env=cell_env(c) if cell_env else None, limited_ok=limited_ok, **tags)
                position += 1
                done += 1
                left = (runs_total - done) * per_run + (len(live) * (args.floor_duration + 1) if args.floor_duration
                                                        else 0)
                log(progress_line(record, f'round {r + 1}/{args.rounds}') + extra(record) +
                    f'  [{done}/{runs_total}, ~{_duration(left)} left]')
    floor(block, live, 'after', args, tags)


def _probes(probes: dict, target: Target) -> dict:
    return {'probes': probes[target.name]} if target.name in probes else {}


def floor(block: Block, live: list[Target], phase: str, args, tags: dict | None = None):
    """The /health floor on every target of `live` (none when --floor-duration is 0)."""
    if args.floor_duration <= 0:
        return
    for target in live:
        record = block.measure(target, kind='floor', phase=phase, connections=args.floor_connections,
                               duration_s=args.floor_duration, health=True,
                               probes=[Frozen([o for o in live if o is not target])], **(tags or {}))
        log(progress_line(record, f'/health floor {phase}:'))


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f'{seconds // 60}m{seconds % 60:02d}s' if seconds >= 60 else f'{seconds}s'


# --------------------------------------------------------------------------------------
# Probes
# --------------------------------------------------------------------------------------

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


class Frozen:
    """The block's other targets stopped (SIGSTOP to every process of their trees) for one run, and continued
    after it: an idle server's threads (bus heartbeats, history and lease flushes, the peer's own) take no CPU
    from the one measured, whatever the machine's core count. A pause lasts one run, far inside gunicorn's worker
    timeout; after it, a short settle lets a continued gateway renew its bus lease before it is measured."""

    SETTLE_S = 0.5

    def __init__(self, others: list[Target]):
        self.roots = [pid for t in others for pid in t.pids]
        self.pids: list[int] = []

    def _signal(self, sig: int):
        for pid in self.pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def start(self):
        self.pids = system.process_tree(*self.roots)
        self._signal(signal.SIGSTOP)

    def finish(self, record: dict) -> dict:
        self._signal(signal.SIGCONT)
        if self.pids:
            time.sleep(self.SETTLE_S)
        return {'idle_frozen': len(self.pids)}


class WorkerShares:
    """Each worker's busy share of a core during a run, and how far the most and least loaded workers are from an
    even split: `worker_spread` = max |share_i / mean - 1| (0.15: some worker did 15% more or less than even). A
    worker's CPU stands for its share of the requests: all of them run the same call."""

    def __init__(self, master_pid: int):
        self.master = master_pid
        self.meters: list[system.CpuMeter] = []

    def start(self):
        workers = sorted(p for p in system.process_tree(self.master) if p != self.master)
        self.meters = [system.CpuMeter(pid) for pid in workers]
        for meter in self.meters:
            meter.start()

    def finish(self, record: dict) -> dict:
        used = [m.stop() or 0.0 for m in self.meters]
        cores = [round(u / record['duration_s'], 3) for u in used]
        mean = sum(used) / len(used) if used else 0.0
        spread = max(abs(u / mean - 1) for u in used) if mean else None
        return {'worker_cores': cores, 'worker_spread': None if spread is None else round(spread, 3)}


def require_clean_tree(allow_dirty: bool) -> None:
    """A result names the build it measured: one commit, and nothing else."""
    if system.git_state()['dirty'] and not allow_dirty:
        raise SystemExit('the tree has uncommitted changes: commit them (a result names one commit), or pass '
                         '--allow-dirty for a smoke run')


# --------------------------------------------------------------------------------------
# The data and the PostgreSQL a block runs against
# --------------------------------------------------------------------------------------

PG_SETTINGS = ('server_version', 'shared_buffers', 'effective_cache_size', 'work_mem', 'max_connections', 'fsync',
               'synchronous_commit', 'wal_level', 'jit', 'huge_pages')


def ensure_data(args) -> dict:
    """The demo table (created with --create-data), read into shared_buffers, and the server's settings that decide
    what a lookup costs, recorded so that two blocks' PostgreSQL can be compared (the reports print them)."""
    data = _demo_table(args)
    data['pg_settings'], data['prewarm'] = prewarm_and_describe(args.database_url)
    log(f"PostgreSQL {data['pg_settings'].get('server_version')}, shared_buffers "
        f"{data['pg_settings'].get('shared_buffers')}; {data['prewarm']}")
    return data


def prewarm_and_describe(url: str) -> tuple[dict, str]:
    """pg_prewarm of the lookup's table and index (so every block starts with them in shared_buffers, whatever ran
    before), and PG_SETTINGS."""
    conn = system.pg_connect(url)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            try:
                cur.execute('CREATE EXTENSION IF NOT EXISTS pg_prewarm')
                cur.execute("SELECT pg_prewarm('pgbench_accounts'), pg_prewarm('pgbench_accounts_pkey')")
                table, index = cur.fetchone()
                note = f'prewarmed pgbench_accounts ({table:,} blocks) and its primary key ({index:,} blocks)'
            except Exception as error:     # an external server without the extension, or no right to create it
                note = f'not prewarmed: {str(error).splitlines()[0]}'
            cur.execute('SELECT name, setting, unit FROM pg_settings WHERE name = ANY(%s)', (list(PG_SETTINGS),))
            settings = {name: setting + (f' ({unit})' if unit else '') for name, setting, unit in cur.fetchall()}
        return settings, note
    finally:
        conn.close()


def _demo_table(args) -> dict:
    try:
        return system.check_demo_table(args.database_url)
    except RuntimeError as missing:
        if not args.create_data:
            raise SystemExit(f'{missing}.\nCreate it (fleet.local.demo.create_demo_data, or pgbench -i) or pass '
                             '--create-data to call fleet.local.demo.create_demo_data(dsn).') from None
    try:
        from fleet.local.demo import create_demo_data
    except ImportError as error:
        raise SystemExit(f'--create-data needs fleet.local.demo.create_demo_data: {error}') from error
    log('creating the demo data (fleet.local.demo.create_demo_data)')
    create_demo_data(args.database_url)
    return system.check_demo_table(args.database_url)


def add_data_source(parser, local_pg_port: int) -> None:
    """The options every block reads its data database from (``local_postgres`` uses them)."""
    parser.add_argument('--database-url',
                        help='postgresql:// URL of the data database (demo, with pgbench_accounts); the targets\' '
                             'stores are created on the same server (needs CREATE DATABASE)')
    parser.add_argument('--local-pg', type=Path, metavar='HOME',
                        help='instead of --database-url: a PostgreSQL of fleet.local.LocalPostgres under HOME '
                             '(started if needed, stopped at the end if the harness started it), its demo database '
                             'filled by fleet.local.demo.create_demo_data')
    parser.add_argument('--local-pg-port', type=int, default=local_pg_port)
    parser.add_argument('--create-data', action='store_true',
                        help='if pgbench_accounts is missing, create it with fleet.local.demo.create_demo_data')


def start_local_pg(args):
    """fleet.local's PostgreSQL, as the gateway's embedded default runs it; returns it if the harness started it
    (so it stops it at the end), None if it was already running."""
    from fleet.local import LocalPostgres
    pg = LocalPostgres(args.local_pg, args.local_pg_port)
    was_running = pg.is_running()
    pg.start()
    pg.ensure_database('demo')
    args.database_url = pg.url('demo')
    args.create_data = True
    return None if was_running else pg


@contextmanager
def local_postgres(args):
    """``--local-pg``: the harness's own PostgreSQL for the block's length (stopped after it,
    unless it was running before); nothing with ``--database-url``."""
    local_pg = start_local_pg(args) if args.local_pg else None
    try:
        yield
    finally:
        if local_pg is not None:
            log(f'stopping the local PostgreSQL under {args.local_pg}')
            local_pg.stop()


def record_variants(meta: dict, live: list, baseline: str, save_meta) -> None:
    """The targets of a block that compares settings of one gateway, each with its own Redis."""
    meta['targets'] = [t.summary() for t in live]
    meta['settings'].update({
        'targets': [t.name for t in live], 'baseline': baseline,
        'order_note': 'targets take turns in an order rotated each round',
        'pinning_note': meta['settings']['pinning_note'] + ' (each target has its own Redis)',
    })
    save_meta()


def pin_postgres(args) -> tuple[int | None, str]:
    pm = system.postmaster_pid(args.database_url)
    if pm is None:
        return None, 'PostgreSQL is not a process on this machine (or not visible): not pinned, not measured'
    if args.pg_cpu in (None, '', 'off'):
        return pm, f'PostgreSQL (postmaster {pm}) not pinned (--pg-cpu off), CPU measured'
    pinned = system.pin_tree(pm, args.pg_cpu)
    return pm, (f'PostgreSQL postmaster {pm} and {len(pinned) - 1} children pinned to CPU {args.pg_cpu} '
                f'(taskset -a -p; new backends inherit it), now {system.affinity(pm)}')


def collect_versions(data: dict) -> dict:
    return {
        'harness': system.venv_versions(Path(sys.executable), ['gunicorn', 'falcon', 'psycopg2-binary', 'sqlglot',
                                                               'orjson', 'redis']),
        'peer': peer.installed(),
        'gateway_fleet': system.our_version(),
        'postgresql': data.get('server_version'),
        'wrk': system.wrk_version(),
        'git': system.git_state(),
    }


def start_variant(args, work_dir, cleanup: list, index: int, name: str, extra: dict, store_db: str,
                  key_extra: dict | None = None, wsgi: str | None = None):
    """One gateway of a block that compares settings: its own store database and its own Redis
    (ports offset by `index`), one worker on the target core, provisioned; returns (target, redis_url).
    `wsgi`: another WSGI entry point than the checkout's (the limits block's reference designs)."""
    from . import system, targets
    store_url = system.dsn_with_db(args.database_url, store_db)
    system.recreate_database(args.database_url, store_db, drop=not args.keep_stores)
    process, redis_url = targets.start_redis(port=args.redis_port + index, cpu=args.pg_cpu, run_dir=work_dir / name)
    cleanup.append(process)
    target = targets.start_gateway(port=args.gateway_port + index, cpu=args.target_cpu, store_url=store_url,
                                   redis_url=redis_url, run_dir=work_dir / name, extra_env=extra,
                                   root=args.gateway_root, name=name, wsgi=wsgi)
    cleanup.append(target.process)
    target.description = f'gateway-fleet, 1 worker, {", ".join(f"{k}={v}" for k, v in extra.items())}'
    targets.wait_healthy(target)
    target.info['provisioned'] = targets.provision(target, args.database_url, key_extra=key_extra)
    target.info['redis'] = system.redact(redis_url)
    log(f'{name} ready at {target.base_url} (pid {target.pids[0]}), Redis {redis_url}')
    return target, redis_url
