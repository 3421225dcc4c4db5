"""What the harness needs from the machine: CPU seconds of process trees from /proc, pinning with taskset,
PostgreSQL's postmaster, and the machine and version facts that every report carries.

Linux only (reads /proc). Standard library only, apart from psycopg2 where a database is asked something.
"""
from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf('SC_CLK_TCK')


# --------------------------------------------------------------------------------------
# /proc
# --------------------------------------------------------------------------------------

def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, utime + stime in ticks) of a process - all its threads - or None if it is gone."""
    try:
        raw = Path(f'/proc/{pid}/stat').read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rindex(')') + 2:].split()  # the name may hold spaces and parentheses
    # after the name: state(0) ppid(1) ... utime(11) stime(12)
    return int(fields[1]), int(fields[11]) + int(fields[12])


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir('/proc'):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                children.setdefault(stat[0], []).append(int(entry))
    return children


def process_tree(*roots: int) -> list[int]:
    """The roots and every descendant that exists now."""
    children = _children_map()
    seen: list[int] = []
    todo = [r for r in roots if r and _stat(r) is not None]
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.append(pid)
        todo.extend(children.get(pid, ()))
    return seen


def _ticks(pids) -> dict[int, int]:
    out = {}
    for pid in pids:
        stat = _stat(pid)
        if stat is not None:
            out[pid] = stat[1]
    return out


class CpuMeter:
    """CPU seconds used by process trees between start() and stop(): user + system of every thread of the roots
    and their descendants. A process born during the interval counts whole (all its CPU is inside it); one that
    ended during it loses what it used since start() - for gunicorn workers and pooled PostgreSQL backends, which
    live through a run, that is nothing."""

    def __init__(self, *roots: int):
        self.roots = [r for r in roots if r]
        self._before: dict[int, int] = {}

    def start(self):
        self._before = _ticks(process_tree(*self.roots))

    def stop(self) -> float | None:
        if not self.roots:
            return None
        after = _ticks(process_tree(*self.roots))
        ticks = sum(t - self._before.get(pid, 0) for pid, t in after.items())
        return ticks / CLK_TCK


def _switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of every thread of ``pid`` (threads that ended are lost)."""
    voluntary = involuntary = 0
    try:
        tasks = os.listdir(f'/proc/{pid}/task')
    except OSError:
        return 0, 0
    for tid in tasks:
        try:
            status = Path(f'/proc/{pid}/task/{tid}/status').read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith('voluntary_ctxt_switches'):
                voluntary += int(line.split()[1])
            elif line.startswith('nonvoluntary_ctxt_switches'):
                involuntary += int(line.split()[1])
    return voluntary, involuntary


class SwitchMeter:
    """Context switches of process trees between start() and stop(), (voluntary, involuntary): a thread that
    waits (a poll, a lock, the GIL) and one the scheduler takes off its CPU. Counted, not timed, so a busy
    machine does not blur them the way it blurs throughput."""

    def __init__(self, *roots: int):
        self.roots = [r for r in roots if r]
        self._before: dict[int, tuple[int, int]] = {}

    def start(self):
        self._before = {pid: _switches(pid) for pid in process_tree(*self.roots)}

    def stop(self) -> tuple[int, int]:
        voluntary = involuntary = 0
        for pid in process_tree(*self.roots):
            v, i = _switches(pid)
            v0, i0 = self._before.get(pid, (0, 0))
            voluntary, involuntary = voluntary + v - v0, involuntary + i - i0
        return voluntary, involuntary


class MachineMeter:
    """Busy CPU seconds of the whole machine (all CPUs, from /proc/stat: everything but idle and iowait) between
    start() and stop(). Less what the target, PostgreSQL and wrk used, it is what *other* processes took during a
    run - on a shared machine, the first thing to look at when a run is off."""

    def _busy(self) -> int:
        fields = [int(v) for v in Path('/proc/stat').read_text().split('\n', 1)[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields[:8]) - idle  # user nice system idle iowait irq softirq steal (guest is inside user)

    def start(self):
        self._before = self._busy()

    def stop(self) -> float:
        return (self._busy() - self._before) / CLK_TCK


def alive(pid: int) -> bool:
    return _stat(pid) is not None


# --------------------------------------------------------------------------------------
# Pinning
# --------------------------------------------------------------------------------------

def taskset_prefix(cpus: str | None) -> list[str]:
    return ['taskset', '-c', cpus] if cpus not in (None, '', 'off') else []


def pin_tree(root: int, cpus: str) -> list[int]:
    """Pin a process, every thread of it (-a) and every descendant that exists now to `cpus`. Children forked
    later inherit the parent's affinity - so pin PostgreSQL's postmaster before the gateways open their pools."""
    pinned = []
    for pid in process_tree(root):
        done = subprocess.run(['taskset', '-a', '-p', '-c', cpus, str(pid)], capture_output=True, text=True)
        if done.returncode == 0:
            pinned.append(pid)
    return pinned


def affinity(pid: int) -> str | None:
    try:
        for line in Path(f'/proc/{pid}/status').read_text().splitlines():
            if line.startswith('Cpus_allowed_list:'):
                return line.split(':', 1)[1].strip()
    except FileNotFoundError:
        return None
    return None


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
    from urllib.parse import unquote
    return {'host': parts.hostname or '127.0.0.1', 'port': parts.port or 5432,
            'user': unquote(parts.username or 'postgres'), 'password': unquote(parts.password or ''),
            'database': (parts.path or '/').lstrip('/') or 'postgres'}


def pg_connect(url: str):
    import psycopg2
    conn = psycopg2.connect(url, connect_timeout=5)
    conn.autocommit = True
    return conn


def postmaster_pid(url: str) -> int | None:
    """The postmaster's pid when the server runs on this machine: the parent of our own backend, if /proc shows
    it as a postgres process. None for a remote server (or one in a container we can't see into)."""
    conn = pg_connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute('SELECT pg_backend_pid()')
            backend = cur.fetchone()[0]
        stat = _stat(backend)
        if stat is None:
            return None
        ppid = stat[0]
        try:
            comm = Path(f'/proc/{ppid}/comm').read_text().strip()
        except FileNotFoundError:
            return None
        return ppid if comm.startswith(('postgres', 'postmaster')) else None
    finally:
        conn.close()


def recreate_database(server_url: str, name: str, drop: bool = True):
    """An empty database `name` on the server of `server_url` (dropped first when `drop`)."""
    if not re.fullmatch(r'[a-z_][a-z0-9_]*', name):
        raise ValueError(f'unsafe database name {name!r}')
    conn = pg_connect(server_url)
    try:
        with conn.cursor() as cur:
            cur.execute('SELECT 1 FROM pg_database WHERE datname = %s', (name,))
            exists = cur.fetchone() is not None
            if exists and drop:
                cur.execute(f'DROP DATABASE {name} WITH (FORCE)')
                exists = False
            if not exists:
                cur.execute(f'CREATE DATABASE {name}')
    finally:
        conn.close()


def check_demo_table(url: str, table: str = 'pgbench_accounts') -> dict:
    """Rows and largest key of the data table, or an exception saying what is missing."""
    conn = pg_connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute('SELECT to_regclass(%s)', (table,))
            if cur.fetchone()[0] is None:
                raise RuntimeError(f'{table} does not exist in {redact(url)}')
            cur.execute(f'SELECT count(*), min(aid), max(aid) FROM {table}')
            rows, lo, hi = cur.fetchone()
            cur.execute('SHOW server_version')
            version = cur.fetchone()[0]
        return {'rows': rows, 'min_aid': lo, 'max_aid': hi, 'server_version': version}
    finally:
        conn.close()


def redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(':' + parts.password + '@', ':***@')
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return url


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
    lscpu = {}
    for line in _run(['lscpu']).splitlines():
        if ':' in line:
            key, value = line.split(':', 1)
            lscpu[key.strip()] = value.strip()
    mem_kb = 0
    for line in Path('/proc/meminfo').read_text().splitlines():
        if line.startswith('MemTotal:'):
            mem_kb = int(line.split()[1])
    return {
        'cpu_model': lscpu.get('Model name', platform.processor()),
        'cpus': lscpu.get('CPU(s)', str(os.cpu_count())),
        'threads_per_core': lscpu.get('Thread(s) per core'),
        'cores_per_socket': lscpu.get('Core(s) per socket'),
        'hypervisor': lscpu.get('Hypervisor vendor'),
        'kernel': platform.release(),
        'os': _os_name(),
        'memory_gib': round(mem_kb / 1024 / 1024, 1),
        'hostname': platform.node(),
    }


def _os_name() -> str:
    try:
        for line in Path('/etc/os-release').read_text().splitlines():
            if line.startswith('PRETTY_NAME='):
                return line.split('=', 1)[1].strip('"')
    except FileNotFoundError:
        pass
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
        pass
    setup_cfg = REPO / 'setup.cfg'
    if setup_cfg.exists():
        match = re.search(r'^version\s*=\s*(\S+)', setup_cfg.read_text(), re.M)
        if match:
            return match.group(1) + ' (setup.cfg, not installed)'
    return None


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
    import socket
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]
