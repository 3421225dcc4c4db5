"""What the harness needs from the machine: CPU seconds of process trees and of the whole machine (psutil),
pinning with taskset, PostgreSQL's postmaster, and the machine and version facts that every report carries."""
from __future__ import annotations

import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

import psutil

REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------------------
# Processes and their CPU
# --------------------------------------------------------------------------------------

def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid) if pid else None
    except psutil.Error:
        return None


def process_tree(*roots: int) -> list[int]:
    """The roots and every descendant that exists now."""
    seen: list[int] = []
    for root in filter(None, map(_process, roots)):
        try:
            tree = [root.pid, *(child.pid for child in root.children(recursive=True))]
        except psutil.Error:
            continue
        seen += [pid for pid in tree if pid not in seen]
    return seen


def cpu_seconds(pid: int) -> float | None:
    """user + system CPU of a process, all its threads; None when it is gone."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return times.user + times.system


def running(pid: int | None) -> bool:
    """Alive and not a zombie (a killed process stays until its parent reaps it)."""
    process = _process(pid or 0)
    try:
        return process is not None and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class CpuMeter:
    """CPU seconds used by process trees between start() and stop(): user + system of every thread of the roots
    and their descendants. A process born during the interval counts whole (all its CPU is inside it); one that
    ended during it loses what it used since start() - for gunicorn workers and pooled PostgreSQL backends, which
    live through a run, that is nothing."""

    def __init__(self, *roots: int):
        self.roots = [r for r in roots if r]
        self._before: dict[int, float] = {}

    def _now(self) -> dict[int, float]:
        return {pid: cpu for pid in process_tree(*self.roots) if (cpu := cpu_seconds(pid)) is not None}

    def start(self):
        self._before = self._now()

    def stop(self) -> float | None:
        if not self.roots:
            return None
        return sum(cpu - self._before.get(pid, 0.0) for pid, cpu in self._now().items())


class SwitchMeter:
    """Context switches of process trees between start() and stop(), (voluntary, involuntary): a thread that
    waits (a poll, a lock, the GIL) and one the scheduler takes off its CPU. Counted per thread (a process's own
    count is its main thread's), so a thread that ended is lost."""

    def __init__(self, *roots: int):
        self.roots = [r for r in roots if r]
        self._before: dict[int, tuple[int, int]] = {}

    def _now(self) -> dict[int, tuple[int, int]]:
        out = {}
        for pid in process_tree(*self.roots):
            try:
                threads = [t.id for t in psutil.Process(pid).threads()]
            except psutil.Error:
                continue
            for process in filter(None, map(_process, threads)):
                try:
                    out[process.pid] = tuple(process.num_ctx_switches())
                except psutil.Error:
                    pass
        return out

    def start(self):
        self._before = self._now()

    def stop(self) -> tuple[int, int]:
        deltas = [(v - self._before.get(tid, (0, 0))[0], i - self._before.get(tid, (0, 0))[1])
                  for tid, (v, i) in self._now().items()]
        return sum(d[0] for d in deltas), sum(d[1] for d in deltas)


class MachineMeter:
    """Busy CPU seconds of the whole machine (all CPUs: everything but idle and iowait) between start() and stop().
    Less what the target, PostgreSQL and wrk used, it is what *other* processes took during a run - on a shared
    machine, the first thing to look at when a run is off."""

    @staticmethod
    def _busy() -> float:
        t = psutil.cpu_times()
        return t.user + t.nice + t.system + t.irq + t.softirq + t.steal   # guest is inside user

    def start(self):
        self._before = self._busy()

    def stop(self) -> float:
        return self._busy() - self._before


def loadavg() -> list[str]:
    """The 1, 5 and 15 minute load averages as /proc/loadavg writes them."""
    return [f'{x:.2f}' for x in os.getloadavg()]


def rss_kb(pids) -> list[int]:
    """Resident memory (VmRSS) of each process still there, in KiB."""
    out = []
    for process in filter(None, map(_process, pids)):
        try:
            out.append(process.memory_info().rss // 1024)
        except psutil.Error:
            pass
    return out


# --------------------------------------------------------------------------------------
# Pinning
# --------------------------------------------------------------------------------------

def taskset_prefix(cpus: str | None) -> list[str]:
    return ['taskset', '-c', cpus] if cpus not in (None, '', 'off') else []


def pin_tree(root: int, cpus: str) -> list[int]:
    """Pin a process, every thread of it (-a) and every descendant that exists now to `cpus`. Children forked
    later inherit the parent's affinity - so pin PostgreSQL's postmaster before the gateways open their pools."""
    return [pid for pid in process_tree(root) if subprocess.run(
        ['taskset', '-a', '-p', '-c', cpus, str(pid)], capture_output=True).returncode == 0]


def affinity(pid: int) -> str | None:
    """The CPUs a process may run on, as Linux lists them (Cpus_allowed_list: `0-3,6`)."""
    try:
        cpus = sorted(psutil.Process(pid).cpu_affinity())
    except psutil.Error:
        return None
    runs: list[list[int]] = []
    for cpu in cpus:
        if runs and cpu == runs[-1][-1] + 1:
            runs[-1].append(cpu)
        else:
            runs.append([cpu])
    return ','.join(f'{r[0]}-{r[-1]}' if len(r) > 1 else str(r[0]) for r in runs)


# --------------------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------------------

def dsn_with_db(url: str, dbname: str) -> str:
    """The same server URL with another database name."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, '/' + dbname, parts.query, parts.fragment))


def dsn_parts(url: str) -> dict:
    """host, port, user, password, database of a postgresql:// URL (what a connection body needs)."""
    parts = urlsplit(url)
    return {'host': parts.hostname or '127.0.0.1', 'port': parts.port or 5432,
            'user': unquote(parts.username or 'postgres'), 'password': unquote(parts.password or ''),
            'database': (parts.path or '/').lstrip('/') or 'postgres'}


def pg_connect(url: str):
    import psycopg2
    conn = psycopg2.connect(url, connect_timeout=5)
    conn.autocommit = True
    return conn


def pg_query(url: str, sql: str, params=()) -> list[tuple]:
    conn = pg_connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


def postmaster_pid(url: str) -> int | None:
    """The postmaster's pid when the server runs on this machine: the parent of our own backend, if it is a
    postgres process. None for a remote server (or one in a container we can't see into)."""
    conn = pg_connect(url)
    try:
        with conn.cursor() as cur:   # asked while our backend lives: its parent is the postmaster
            cur.execute('SELECT pg_backend_pid()')
            backend = _process(cur.fetchone()[0])
            parent = backend.parent() if backend else None
            return parent.pid if parent and parent.name().startswith(('postgres', 'postmaster')) else None
    except psutil.Error:
        return None
    finally:
        conn.close()


def recreate_database(server_url: str, name: str, drop: bool = True):
    """An empty database `name` on the server of `server_url` (dropped first when `drop`)."""
    if not re.fullmatch(r'[a-z_][a-z0-9_]*', name):
        raise ValueError(f'unsafe database name {name!r}')
    exists = bool(pg_query(server_url, 'SELECT 1 FROM pg_database WHERE datname = %s', (name,)))
    if exists and drop:
        pg_query(server_url, f'DROP DATABASE {name} WITH (FORCE)')
    if not exists or drop:
        pg_query(server_url, f'CREATE DATABASE {name}')


def check_demo_table(url: str, table: str = 'pgbench_accounts') -> dict:
    """Rows and largest key of the data table, or an exception saying what is missing."""
    if pg_query(url, 'SELECT to_regclass(%s)', (table,))[0][0] is None:
        raise RuntimeError(f'{table} does not exist in {redact(url)}')
    (rows, lo, hi), = pg_query(url, f'SELECT count(*), min(aid), max(aid) FROM {table}')
    return {'rows': rows, 'min_aid': lo, 'max_aid': hi, 'server_version': pg_query(url, 'SHOW server_version')[0][0]}


def redact(url: str) -> str:
    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = parts.netloc.replace(':' + parts.password + '@', ':***@')
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


# --------------------------------------------------------------------------------------
# Machine and versions
# --------------------------------------------------------------------------------------

def _run(cmd, **kw) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, **kw)
        return (done.stdout or done.stderr).strip()
    except (OSError, subprocess.SubprocessError):
        return ''


def machine_info() -> dict:
    lscpu = dict(line.split(':', 1) for line in _run(['lscpu']).splitlines() if ':' in line)
    lscpu = {k.strip(): v.strip() for k, v in lscpu.items()}
    return {'cpu_model': lscpu.get('Model name', platform.processor()),
            'cpus': lscpu.get('CPU(s)', str(os.cpu_count())), 'threads_per_core': lscpu.get('Thread(s) per core'),
            'cores_per_socket': lscpu.get('Core(s) per socket'), 'hypervisor': lscpu.get('Hypervisor vendor'),
            'kernel': platform.release(), 'os': _os_name(),
            'memory_gib': round(psutil.virtual_memory().total / 1024 ** 3, 1), 'hostname': platform.node()}


def _os_name() -> str:
    try:
        return platform.freedesktop_os_release().get('PRETTY_NAME', platform.system())
    except OSError:
        return platform.system()


def venv_versions(python: Path, packages) -> dict:
    """Python and package versions as installed in another interpreter (a venv)."""
    code = ('import importlib.metadata as m, json, platform\n'
            'out = {"python": platform.python_version()}\n'
            f'for p in {list(packages)!r}:\n'
            '    try: out[p] = m.version(p)\n'
            '    except m.PackageNotFoundError: out[p] = None\n'
            'print(json.dumps(out))')
    raw = _run([str(python), '-c', code])
    try:
        return json.loads(raw)
    except ValueError:
        return {'python': None, 'error': raw[-300:]}


def our_version() -> str | None:
    try:
        import importlib.metadata as m
        return m.version('gateway-fleet')
    except Exception:
        setup_cfg = REPO / 'setup.cfg'
        match = re.search(r'^version\s*=\s*(\S+)', setup_cfg.read_text(), re.M) if setup_cfg.exists() else None
        return match.group(1) + ' (setup.cfg, not installed)' if match else None


def git_state() -> dict:
    head = _run(['git', '-C', str(REPO), 'rev-parse', '--short', 'HEAD'])
    dirty = _run(['git', '-C', str(REPO), 'status', '--porcelain', '--untracked-files=no'])
    return {'commit': head if re.fullmatch(r'[0-9a-f]{4,40}', head or '') else None, 'dirty': bool(dirty)}


def wrk_version() -> str:
    first = _run(['wrk', '-v']).splitlines()
    return first[0] if first else 'unknown'


def tool_path(name: str) -> str | None:
    return shutil.which(name)


def python_version() -> str:
    return platform.python_version() + f' ({sys.executable})'


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's pick), for a short-lived server of the harness."""
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]
