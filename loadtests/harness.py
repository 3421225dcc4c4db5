"""The harness's core, which every block runs on: a block's run from its command line to its report (``run_block``:
its folder, meta.json, the data's PostgreSQL, signals, the processes to stop, the report whatever happened), one wrk
run measured (Block.measure), the rounds of a closed-loop block (run_rounds: a warm-up per target, a /health floor
before and after, every cell once a round in an order rotated each round), and the probes blocks add to a run.

It imports no block: blocks import it (loadtests/blocks/), and bench.py reaches them through their registry.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import time
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime
from pathlib import Path

from . import peer, rundir, system, targets, wrk
from .stats import NOISY_CORES
from .targets import Target, TargetError

WARMUP_CONNECTIONS = 8
PG_SETTINGS = ('server_version', 'shared_buffers', 'effective_cache_size', 'work_mem', 'max_connections', 'fsync',
               'synchronous_commit', 'wal_level', 'jit', 'huge_pages')


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec='seconds')


def log(message: str):
    print(f'[{datetime.now().strftime("%H:%M:%S")}] {message}', flush=True)


def rotated(items: list, round_index: int) -> list:
    k = round_index % len(items)
    return items[k:] + items[:k]


# --------------------------------------------------------------------------------------
# Options every block shares
# --------------------------------------------------------------------------------------

def parser_for(name: str, doc: str | None) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=' '.join(['python -m loadtests.bench', *([name] if name else [])]),
                                   description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def add_data_source(parser, local_pg_port: int) -> None:
    """The options every block reads its data database from (``local_postgres`` uses them)."""
    parser.add_argument('--database-url',
                        help='postgresql:// URL of the data database (demo, with pgbench_accounts); the targets\' '
                             'stores are created on the same server (needs CREATE DATABASE)')
    parser.add_argument('--local-pg', type=Path, metavar='HOME',
                        help='instead of --database-url: a PostgreSQL of fleet.ops.local.LocalPostgres under HOME '
                             '(started if needed, stopped at the end if the harness started it), its demo database '
                             'filled by fleet.ops.local.demo.create_demo_data')
    parser.add_argument('--local-pg-port', type=int, default=local_pg_port)
    parser.add_argument('--create-data', action='store_true',
                        help='if pgbench_accounts is missing, create it with fleet.ops.local.demo.create_demo_data')


def add_run_options(parser, *, rounds: int = 5, warmup: float = 5, cpus: bool = True) -> None:
    """Rounds, durations, the /health floor, pinning and the output folder, as every closed-loop block has them."""
    parser.add_argument('--rounds', type=int, default=rounds)
    parser.add_argument('--duration', type=float, default=10, help='seconds per run (default 10)')
    parser.add_argument('--warmup', type=float, default=warmup, help='seconds of warm-up per target (0: none)')
    parser.add_argument('--floor-duration', type=float, default=10, help='seconds of the /health floor (0: none)')
    parser.add_argument('--floor-connections', type=int, default=32)
    parser.add_argument('--wrk-timeout', type=float, default=None, help='wrk --timeout (its default: 2 s)')
    if cpus:
        parser.add_argument('--target-cpu', default='1', help='taskset CPU list of the targets (default 1)')
    parser.add_argument('--load-cpu', default='0', help='taskset CPU list of wrk (default 0)')
    parser.add_argument('--pg-cpu', default='0', help="CPU list for PostgreSQL and Redis; 'off' leaves them")
    add_output(parser)


def add_output(parser) -> None:
    parser.add_argument('--allow-dirty', action='store_true',
                        help='run from a tree with uncommitted changes (a smoke run; such numbers are not a result)')
    parser.add_argument('--out', type=Path, default=rundir.RESULTS,
                        help='folder for <block>-<timestamp>/ (default loadtests/results/, gitignored)')


def parse(parser, argv, data: bool = True):
    """The arguments, with one data source when the block reads one, and --out made absolute."""
    args = parser.parse_args(argv)
    if data and bool(args.database_url) == bool(args.local_pg):
        parser.error('give one of --database-url and --local-pg')
    args.out = args.out.resolve()
    for name in ('rounds', 'duration'):
        if getattr(args, name, 1) <= 0:
            parser.error(f'--{name} must be positive')
    return args


# --------------------------------------------------------------------------------------
# A block's run, from its command line to its report
# --------------------------------------------------------------------------------------

class Run:
    """What a block's body works with: its arguments, folders, meta.json (``save``), the Block its runs are written
    through, the processes to stop at the end (``cleanup``), and the data's PostgreSQL (``data``, ``pg_root``,
    ``pg_note``)."""

    def __init__(self, name: str, args, command: list[str]):
        self.name, self.args = name, args
        self.run_dir, self.work_dir = rundir.new(args.out, name)
        self.cleanup: list = []
        self.data: dict | None = None
        self.pg_root, self.pg_note = None, ''
        self.meta: dict = {'block': name, 'started_at': now_iso(), 'finished_at': None,
                           'command': ' '.join(shlex.quote(a) for a in [sys.executable, '-m', 'loadtests.bench',
                                                                         *command]),
                           'settings': {}, 'machine': system.machine_info(), 'versions': {}, 'targets': [],
                           'work_dir': str(self.work_dir), 'notes': []}
        self.block: Block | None = None

    def save(self) -> None:
        rundir.write_meta(self.run_dir, self.meta)

    def read_data(self) -> None:
        """The demo table (--max-id capped at its largest key), PostgreSQL pinned and described."""
        args = self.args
        self.data = ensure_data(args)
        if hasattr(args, 'max_id') and self.data['max_aid'] < args.max_id:
            log(f'pgbench_accounts ends at aid {self.data["max_aid"]}: drawing keys from 1..{self.data["max_aid"]}')
            args.max_id = self.data['max_aid']
        self.data['database_url'] = system.redact(args.database_url)
        self.pg_root, self.pg_note = pin_postgres(args)
        log(self.pg_note)
        self.meta.update(data=self.data, versions=collect_versions(self.data))

    def go(self, body, report, errors: tuple) -> int:
        def on_term(signum, frame):
            raise KeyboardInterrupt(f'signal {signum}')
        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)  # also when started in the background, where SIGINT is ignored
        self.block = Block(self.name, self.run_dir, self.args, self.pg_root)
        failed = None
        try:
            body(self)
            self.meta['finished_at'] = now_iso()
            failed = self.block.verdict()
        except KeyboardInterrupt as stop:
            failed = f'interrupted ({stop})'
        except (TargetError, wrk.WrkError, *errors) as error:
            failed = f'{type(error).__name__}: {error}'
        finally:
            self.block.close()
            for process in reversed(self.cleanup):
                targets.stop_process(process)
            if failed:
                self.meta['notes'].append(f'Stopped early: {failed.splitlines()[0]}')
            self.save()
            log(f'report: {report(self.run_dir)}')
        if failed:
            log(f'FAILED: {failed}')
        return 1 if failed else 0


def run_block(name: str, args, command: list[str], body, report, *, data: bool = True, errors: tuple = (),
              tools=('wrk', 'taskset'), publish=None) -> int:
    """A block's run: a committed tree (or --allow-dirty), its tools there, then ``body(run)`` (a Run) inside the
    data's PostgreSQL when it reads one (``data``); the report whatever happened, the page with --publish when it
    passed. `errors`: more exceptions that stop the block as failed rather than with a traceback."""
    require_clean_tree(args.allow_dirty)
    if getattr(args, 'publish', False) and system.git_state()['dirty']:
        raise SystemExit('--publish needs a committed tree')
    for tool in tools:
        if not (system.tool_path(tool) or Path(f'/usr/sbin/{tool}').exists()):
            raise SystemExit(f'{tool} not found')
    run = Run(name, args, command)
    log(f'block {name} -> {run.run_dir} (target logs in {run.work_dir})')
    with local_postgres(args) if data else nullcontext():
        if data:
            run.read_data()
        run.save()
        code = run.go(body, report, errors)
    if code == 0 and publish is not None and getattr(args, 'publish', False):
        log(f'published: {publish(run.run_dir)}')
    return code


def require_clean_tree(allow_dirty: bool) -> None:
    """A result names the build it measured: one commit, and nothing else."""
    if system.git_state()['dirty'] and not allow_dirty:
        raise SystemExit('the tree has uncommitted changes: commit them (a result names one commit), or pass '
                         '--allow-dirty for a smoke run')


# --------------------------------------------------------------------------------------
# One wrk run, and the rounds of a closed-loop block
# --------------------------------------------------------------------------------------

class Block:
    """One block's runs, written to results.jsonl as they happen."""

    def __init__(self, name: str, run_dir: Path, args, pg_root: int | None):
        self.name, self.run_dir, self.args, self.pg_root = name, run_dir, args, pg_root
        self.results = (run_dir / 'results.jsonl').open('a')
        self.failures: list[str] = []   # runs with a non-2xx answer, a socket error or a wrong body

    def close(self):
        self.results.close()

    def verdict(self) -> str | None:
        """Why the block failed though it ran to the end: a result with a wrong answer is no result."""
        if self.failures:
            return f'{len(self.failures)} run(s) had errors or wrong bodies, first: {self.failures[0]}'
        return None

    def write(self, record: dict):
        self.results.write(json.dumps(record) + '\n')
        self.results.flush()

    def measure(self, target: Target, *, kind: str, connections: int, duration_s: float, health: bool = False,
                probes=(), wrk_env: dict | None = None, limited_ok: bool = False, **tags) -> dict:
        """One wrk run. `probes`: extra meters with start() and finish(record) -> dict of fields to add;
        `wrk_env`: more settings of the Lua script (on top of the target's own); `limited_ok`: 429s are expected
        (a load above a rate limit) and do not fail the run."""
        if target.process is not None and target.process.poll() is not None:
            raise TargetError(f'{target.name} has exited ({target.process.returncode}):\n'
                              + targets.log_tail(target.log_path))
        machine, cpu, pg = system.MachineMeter(), system.CpuMeter(*target.pids), system.CpuMeter(self.pg_root or 0)
        env = {'API_KEY': target.api_key, 'QUERY_PATH': target.query_path, 'PARAM': target.param,
               'MAX_ID': str(self.args.max_id), **target.wrk_env, **(wrk_env or {})}
        started_at, wall = now_iso(), time.monotonic()
        for meter in (machine, cpu, pg, *probes):
            meter.start()
        result = wrk.run(target.url('/health' if health else '/'), connections=connections, duration_s=duration_s,
                         script=wrk.HEALTH if health else wrk.RANDOM_AID, env=None if health else env,
                         cpu=self.args.load_cpu, timeout_s=self.args.wrk_timeout,
                         threads=getattr(self.args, 'wrk_threads', 1))
        target_cpu, pg_cpu, machine_cpu = cpu.stop(), pg.stop(), machine.stop()
        problems = wrk.errors_of(result, limited_ok=limited_ok)
        if problems:
            self.failures.append(f'{kind} of {target.name} at {connections} connections: {", ".join(problems)}')
        seconds = result.duration_s
        record = {
            'block': self.name, 'kind': kind, **tags, 'target': target.name, 'connections': connections,
            'path': '/health' if health else target.query_path, **result.to_dict(),
            'ok': not problems, 'problems': problems,
            'target_cpu_s': None if target_cpu is None else round(target_cpu, 3),
            'target_cores': None if target_cpu is None else round(target_cpu / seconds, 3),
            'cpu_us_per_call': (round(target_cpu / result.requests * 1e6, 1)
                                if target_cpu is not None and result.requests else None),
            'pg_cpu_s': None if pg_cpu is None else round(pg_cpu, 3),
            'machine_cpu_s': round(machine_cpu, 3),
            # everything else on the machine
            'other_cores': round(max(0.0, machine_cpu - (target_cpu or 0) - (pg_cpu or 0) - result.wrk_cpu_s)
                                 / seconds, 3),
            'wrk_text': wrk.parse_text(result.text),  # wrk's own rounded summary, a cross-check of the JSON
            'started_at': started_at, 'wall_s': round(time.monotonic() - wall, 3),
        }
        for probe in probes:
            record.update(probe.finish(record))
        self.write(record)
        return record


def progress_line(record: dict, prefix: str) -> str:
    lat = record['latency_us']
    line = (f'{prefix} {record["target"]} c={record["connections"]}: {record["rps"]:,.0f} req/s, '
            f'p50 {lat["50"] / 1000:.2f} ms, p99 {lat["99"] / 1000:.2f} ms')
    if record.get('cpu_us_per_call') is not None:
        line += f', {record["cpu_us_per_call"]:,.0f} µs CPU/call ({record["target_cores"]:.2f} cores)'
    if record.get('other_cores', 0) > NOISY_CORES:
        line += f'  (other processes: {record["other_cores"]:.2f} cores)'
    return line + ('  ⚠ ' + '; '.join(record['problems']) if not record['ok'] else '')


def run_rounds(block: Block, live: list[Target], args, probes: dict | None = None, extra=lambda record: '',
               tags: dict | None = None, cell_env=None, limited_ok: bool = False, others=None, floors=None,
               after_round=None):
    """The method every closed-loop block shares: a warm-up per target, a /health floor, rounds in which every cell
    (connections x target) runs once in an order rotated each round, and the floor again. ``probes``: per target
    name, extra meters for each run; ``extra``: more text for the progress line; ``tags``: more fields of every
    record (the limits block's mix); ``cell_env``: connections -> more settings of the Lua script for that cell's
    runs; ``limited_ok``: 429s are answers the load expects (the limits block's hot keys), not errors; ``others``:
    target -> the servers frozen while it runs (default: the other targets); ``floors``: the targets with a floor
    (default all); ``after_round``: called with each round's index once its cells ran (the cache block's purges)."""
    probes, tags, floors = probes or {}, tags or {}, live if floors is None else floors
    others = others or (lambda target: [o for o in live if o is not target])
    total, done = args.rounds * len(args.connections) * len(live), 0
    for target in live if args.warmup > 0 else []:
        record = block.measure(target, kind='warmup', connections=WARMUP_CONNECTIONS, duration_s=args.warmup,
                               limited_ok=limited_ok, probes=probes.get(target.name, ()), **tags)
        log(progress_line(record, 'warm-up') + extra(record))
    floor(block, floors, 'before', args, tags)
    for r in range(args.rounds):
        order, position = rotated(live, r), 0
        for c in args.connections:
            for target in order:
                # Frozen last: the others are continued after every meter has stopped
                record = block.measure(target, kind='run', round=r + 1, position=position, connections=c,
                                       duration_s=args.duration, order=[t.name for t in order],
                                       probes=[*probes.get(target.name, ()), Frozen(others(target))],
                                       wrk_env=cell_env(c) if cell_env else None, limited_ok=limited_ok, **tags)
                position, done = position + 1, done + 1
                left = (total - done) * (args.duration + 1.0) + (len(floors) * (args.floor_duration + 1)
                                                                  if args.floor_duration else 0)
                log(progress_line(record, f'round {r + 1}/{args.rounds}') + extra(record) +
                    f'  [{done}/{total}, ~{_duration(left)} left]')
        if after_round:
            after_round(r)
    floor(block, floors, 'after', args, tags)


def floor(block: Block, live: list[Target], phase: str, args, tags: dict | None = None):
    """The /health floor on every target of `live` (none when --floor-duration is 0)."""
    for target in live if args.floor_duration > 0 else []:
        record = block.measure(target, kind='floor', phase=phase, connections=args.floor_connections,
                               duration_s=args.floor_duration, health=True,
                               probes=[Frozen([o for o in live if o is not target])], **(tags or {}))
        log(progress_line(record, f'/health floor {phase}:'))


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f'{seconds // 60}m{seconds % 60:02d}s' if seconds >= 60 else f'{seconds}s'


# --------------------------------------------------------------------------------------
# Probes: more meters of a run
# --------------------------------------------------------------------------------------

class WorkerCpu:
    """CPU seconds of a gunicorn master's workers (not the master) during a run."""

    def __init__(self, master_pid: int):
        self.master = master_pid
        self.meter = system.CpuMeter()

    def start(self):
        self.meter = system.CpuMeter(*[p for p in system.process_tree(self.master) if p != self.master])
        self.meter.start()

    def finish(self, record: dict) -> dict:
        cpu, calls = self.meter.stop(), record.get('requests') or 0
        return {'worker_cpu_s': None if cpu is None else round(cpu, 3),
                'worker_cpu_us_per_call': round(cpu / calls * 1e6, 1) if cpu is not None and calls else None}


class Frozen:
    """The block's other targets stopped (SIGSTOP to every process of their trees) for one run, and continued
    after it: an idle server's threads (bus heartbeats, history and lease flushes, the peer's own) take no CPU
    from the one measured, whatever the machine's core count. A pause lasts one run, far inside gunicorn's worker
    timeout; after it, a short settle lets a continued gateway renew its bus lease before it is measured. Also a
    ``with`` block."""

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

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.finish({})


class WorkerShares:
    """Each worker's busy share of a core during a run, and how far the most and least loaded workers are from an
    even split: `worker_spread` = max |share_i / mean - 1| (0.15: some worker did 15% more or less than even). A
    worker's CPU stands for its share of the requests: all of them run the same call."""

    def __init__(self, master_pid: int):
        self.master = master_pid
        self.meters: list[system.CpuMeter] = []

    def start(self):
        self.meters = [system.CpuMeter(pid) for pid in sorted(system.process_tree(self.master)) if pid != self.master]
        for meter in self.meters:
            meter.start()

    def finish(self, record: dict) -> dict:
        used = [m.stop() or 0.0 for m in self.meters]
        mean = sum(used) / len(used) if used else 0.0
        spread = max(abs(u / mean - 1) for u in used) if mean else None
        return {'worker_cores': [round(u / record['duration_s'], 3) for u in used],
                'worker_spread': None if spread is None else round(spread, 3)}


# --------------------------------------------------------------------------------------
# The data and the PostgreSQL a block runs against
# --------------------------------------------------------------------------------------

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
    try:
        system.pg_query(url, 'CREATE EXTENSION IF NOT EXISTS pg_prewarm')
        (table, index), = system.pg_query(url, "SELECT pg_prewarm('pgbench_accounts'), "
                                               "pg_prewarm('pgbench_accounts_pkey')")
        note = f'prewarmed pgbench_accounts ({table:,} blocks) and its primary key ({index:,} blocks)'
    except Exception as error:     # an external server without the extension, or no right to create it
        note = f'not prewarmed: {str(error).splitlines()[0]}'
    rows = system.pg_query(url, 'SELECT name, setting, unit FROM pg_settings WHERE name = ANY(%s)',
                           (list(PG_SETTINGS),))
    return {name: setting + (f' ({unit})' if unit else '') for name, setting, unit in rows}, note


def _demo_table(args) -> dict:
    try:
        return system.check_demo_table(args.database_url)
    except RuntimeError as missing:
        if not args.create_data:
            raise SystemExit(f'{missing}.\nCreate it (fleet.ops.local.demo.create_demo_data, or pgbench -i) or pass '
                             '--create-data to call fleet.ops.local.demo.create_demo_data(dsn).') from None
    from fleet.ops.local.demo import create_demo_data
    log('creating the demo data (fleet.ops.local.demo.create_demo_data)')
    create_demo_data(args.database_url)
    return system.check_demo_table(args.database_url)


@contextmanager
def local_postgres(args):
    """``--local-pg``: fleet.ops.local's PostgreSQL, as the gateway's embedded default runs it, for the block's length
    (stopped after it, unless it was running before); nothing with ``--database-url``."""
    if not args.local_pg:
        yield
        return
    from fleet.ops.local import LocalPostgres
    pg = LocalPostgres(args.local_pg, args.local_pg_port)
    was_running = pg.is_running()
    pg.start()
    pg.ensure_database('demo')
    args.database_url, args.create_data = pg.url('demo'), True
    try:
        yield
    finally:
        if not was_running:
            log(f'stopping the local PostgreSQL under {args.local_pg}')
            pg.stop()


def pin_postgres(args) -> tuple[int | None, str]:
    pm = system.postmaster_pid(args.database_url)
    if pm is None:
        return None, 'PostgreSQL is not a process on this machine (or not visible): not pinned, not measured'
    if args.pg_cpu in (None, '', 'off'):
        return pm, f'PostgreSQL (postmaster {pm}) not pinned (--pg-cpu off), CPU measured'
    pinned = system.pin_tree(pm, args.pg_cpu)
    return pm, (f'PostgreSQL postmaster {pm} and {len(pinned) - 1} children pinned to CPU {args.pg_cpu} '
                f'(taskset -a -p; new backends inherit it), now {system.affinity(pm)}')


def collect_versions(data: dict | None = None) -> dict:
    return {'harness': system.venv_versions(Path(sys.executable), ['gunicorn', 'falcon', 'psycopg2-binary', 'sqlglot',
                                                                   'orjson', 'redis']),
            'peer': peer.installed(), 'gateway_fleet': system.our_version(),
            'postgresql': (data or {}).get('server_version'), 'wrk': system.wrk_version(), 'git': system.git_state()}


# --------------------------------------------------------------------------------------
# Blocks that compare settings of one gateway, each with its own store and Redis
# --------------------------------------------------------------------------------------

def start_variant(run: Run, index: int, name: str, extra: dict, store_db: str, key_extra: dict | None = None,
                  wsgi: str | None = None):
    """One gateway of a block that compares settings: its own store database and its own Redis (ports offset by
    `index`), one worker on the target core, provisioned; returns (target, redis_url). `wsgi`: another WSGI entry
    point than the checkout's (the limits block's reference designs)."""
    args = run.args
    system.recreate_database(args.database_url, store_db, drop=not args.keep_stores)
    process, redis_url = targets.start_redis(port=args.redis_port + index, cpu=args.pg_cpu,
                                             run_dir=run.work_dir / name)
    run.cleanup.append(process)
    target = targets.start_gateway(port=args.gateway_port + index, cpu=args.target_cpu,
                                   store_url=system.dsn_with_db(args.database_url, store_db), redis_url=redis_url,
                                   run_dir=run.work_dir / name, extra_env=extra, root=args.gateway_root, name=name,
                                   wsgi=wsgi)
    run.cleanup.append(target.process)
    target.description = f'gateway-fleet, 1 worker, {", ".join(f"{k}={v}" for k, v in extra.items())}'
    targets.wait_healthy(target)
    target.info['provisioned'] = targets.provision(target, args.database_url, key_extra=key_extra)
    target.info['redis'] = system.redact(redis_url)
    log(f'{name} ready at {target.base_url} (pid {target.pids[0]}), Redis {redis_url}')
    return target, redis_url


def record_variants(run: Run, live: list, baseline: str) -> None:
    """The targets of a block that compares settings of one gateway, each with its own Redis."""
    run.meta['targets'] = [t.summary() for t in live]
    run.meta['settings'].update({
        'targets': [t.name for t in live], 'baseline': baseline,
        'order_note': 'targets take turns in an order rotated each round',
        'pinning_note': run.meta['settings']['pinning_note'] + ' (each target has its own Redis)',
    })
    run.save()
