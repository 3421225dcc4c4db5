"""The faults, one function each: break the rig (rig.py) at once and return when the fault itself is over (the server
is back, the worker replaced, the reload done) with what happened: ``done_at`` (time.monotonic()) and facts for the
report. What clients saw is read from the load, not here.

Instance i0 takes the faults aimed at one master; i1 keeps serving.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from ... import system
from .rig import INSTANCES, Rig, RigError, running, wait_gone

MARKER = 'faults:marker'     # set in Redis before it is killed: gone after the restart proves the data was lost
MASTER_WAIT_S = 30.0         # how long a killed master is given to come back by itself (a supervisor's backoff)


@dataclass(frozen=True)
class Fault:
    name: str
    what: str
    inject: Callable[[Rig], dict] | None   # None: the fault is a setting of the fleet (max_requests), not an act


def _since(t0: float) -> float:
    return round(time.monotonic() - t0, 3)


def _start_again(start: Callable[[], None], t0: float, limit_s: float = 60) -> int:
    """Start a server again, retrying while it fails (a postmaster refuses while a killed one's backend still holds
    the shared memory; the port can be held for a moment by a client socket of another process, as these ports lie
    in the ephemeral range); the attempts it took."""
    attempts = 0
    while True:
        attempts += 1
        try:
            start()
            return attempts
        except (RuntimeError, OSError, subprocess.CalledProcessError):
            if time.monotonic() - t0 > limit_s:
                raise
            time.sleep(0.2)


def pg_restart(rig: Rig) -> dict:
    """`pg_ctl restart -m fast`, as fleet.ops.local does it: SIGINT, wait for the postmaster to go, start and wait."""
    t0 = time.monotonic()
    rig.pg.stop()
    stopped = _since(t0)
    attempts = _start_again(rig.pg.start, t0)
    return {'done_at': time.monotonic(), 'stopped_after_s': stopped, 'start_attempts': attempts,
            'answering_after_s': _since(t0)}


def pg_kill(rig: Rig) -> dict:
    """SIGKILL the postmaster; its backends notice and exit; then start it again (pg_ctl start refuses while a
    backend still holds the shared memory: retried)."""
    pid = rig.pg._pid()
    if pid is None:
        raise RigError('no postmaster to kill')
    children = [p for p in system.process_tree(pid) if p != pid]
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    wait_gone([pid], 5)
    backends_gone = wait_gone(children, 30)
    gone_after = _since(t0)
    attempts = _start_again(rig.pg.start, t0)
    return {'done_at': time.monotonic(), 'backends_gone_after_s': gone_after if backends_gone else None,
            'start_attempts': attempts, 'answering_after_s': _since(t0)}


def redis_kill(rig: Rig) -> dict:
    """SIGKILL redis-server (no persistence: it comes back empty) and start it again."""
    client = redis.Redis.from_url(rig.redis.url(), socket_timeout=2)
    try:
        client.set(MARKER, 1)
        pid = rig.redis._pid()
        if pid is None:
            raise RigError('no redis-server to kill')
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        wait_gone([pid], 10)
        rig.redis.pid_file.unlink(missing_ok=True)
        _start_again(rig.redis.start, t0)
        done = time.monotonic()
        lost = not client.exists(MARKER)
    finally:
        client.close()
    return {'done_at': done, 'killed_at': t0, 'answering_after_s': round(done - t0, 3), 'data_lost': lost}


def worker_kill(rig: Rig) -> dict:
    """SIGKILL one worker of i0; over when i0 has all its workers again."""
    victim = rig.worker_pids(0)[0]
    t0 = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    while True:
        now = rig.worker_pids(0)
        if victim not in now and len(now) == rig.workers:
            break
        if time.monotonic() - t0 > 30:
            raise RigError(f'the killed worker {victim} was not replaced within 30s')
        time.sleep(0.01)
    return {'done_at': time.monotonic(), 'replaced_after_s': _since(t0)}


def master_kill(rig: Rig) -> dict:
    """SIGKILL the gunicorn master of i0 (its workers are orphaned). Over when a master answers on i0's port again
    or after MASTER_WAIT_S: whether anything brought it back is a finding, not an assumption."""
    pid = rig.master(0)
    if pid is None:
        raise RigError('no master i0 to kill')
    workers = rig.worker_pids(0)
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    workers_gone = back = None
    while time.monotonic() - t0 < MASTER_WAIT_S:
        if workers_gone is None and not any(running(p) for p in workers):
            workers_gone = _since(t0)
        new = rig.master(0)
        if back is None and new is not None and new != pid and len(rig.worker_pids(0)) == rig.workers:
            back = _since(t0)
        if back is not None and workers_gone is not None:
            break
        time.sleep(0.02)
    return {'done_at': time.monotonic(), 'workers_gone_after_s': workers_gone, 'master_back_after_s': back,
            'master_back': back is not None}


def _reload(rig: Rig, i: int) -> float:
    """SIGHUP master i; seconds until none of its old workers is left and it has all its new ones."""
    old = set(rig.worker_pids(i))
    t0 = time.monotonic()
    os.kill(rig.master(i), signal.SIGHUP)
    while True:
        now = set(rig.worker_pids(i))
        if not now & old and len(now) == rig.workers:
            return _since(t0)
        if time.monotonic() - t0 > 60:
            raise RigError(f'master i{i}: old workers still there 60s after SIGHUP')
        time.sleep(0.01)


def master_reload(rig: Rig) -> dict:
    """SIGHUP to master i0: gunicorn starts new workers and stops the old ones gracefully."""
    return {'replaced_after_s': _reload(rig, 0), 'done_at': time.monotonic()}


def rolling_reload(rig: Rig) -> dict:
    """fleet has no rolling restart of masters: SIGHUP each master in turn, the next once the previous one's
    workers are all new."""
    took = [_reload(rig, i) for i in range(INSTANCES)]
    return {'replaced_after_s': took, 'done_at': time.monotonic(),
            'how': 'SIGHUP to each master in turn (fleet has no rolling restart of masters)'}


def rolling_restart(rig: Rig) -> dict:
    """`fleet restart`: each master in turn stops (SIGTERM), the supervisor starts a new one, the next goes once it
    serves with all its workers."""
    before = [rig.master(i) for i in range(INSTANCES)]
    t0 = time.monotonic()
    rig.fleet('restart')
    after = [rig.master(i) for i in range(INSTANCES)]
    if any(a is None or a == b for a, b in zip(after, before, strict=True)):
        raise RigError(f'fleet restart left masters {before} -> {after}')
    return {'done_at': time.monotonic(), 'restarted_after_s': _since(t0), 'masters': f'{before} -> {after}',
            'how': '`fleet restart` (its lines in fleet.log)'}


FAULTS = {f.name: f for f in (
    Fault('pg-restart', 'PostgreSQL fast restart (pg_ctl stop -m fast, then start)', pg_restart),
    Fault('pg-kill', 'postmaster SIGKILL, then start', pg_kill),
    Fault('redis-kill', 'Redis SIGKILL (no persistence), then start; a 300 calls/day key with 200 spent', redis_kill),
    Fault('worker-kill', 'one worker of one master SIGKILL', worker_kill),
    Fault('master-kill', 'one gunicorn master SIGKILL (its workers orphaned)', master_kill),
    Fault('master-reload', 'SIGHUP reload of one master', master_reload),
    Fault('rolling-reload', 'rolling reload of both masters behind nginx (SIGHUP each in turn)', rolling_reload),
    Fault('rolling-restart', 'rolling restart of both masters behind nginx (`fleet restart`: new master processes)',
          rolling_restart),
    Fault('max-requests', 'max_requests recycling (a fleet started with GATEWAY_MAX_REQUESTS)', None),
)}

