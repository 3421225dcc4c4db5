"""The fleet the faults block breaks: ``fleet up --instances 2`` (nginx in front of two gunicorn masters, each with
its workers; the embedded PostgreSQL and Redis of fleet.ops.local) in a home of its own, on ports of its own.

Ports from ``base``: PostgreSQL base, Redis base + 1, nginx base + 10, the masters base + 11 and base + 12 (fleet.ops.cli
puts the instances just above GATEWAY_BIND).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg2

from ... import system
from ...system import running
from ...targets import http

INSTANCES = 2


class RigError(RuntimeError):
    pass


class Rig:
    def __init__(self, home: Path, base_port: int, workers: int, log_path: Path):
        from fleet.ops.local import LocalPostgres, LocalRedis
        self.home = Path(home).resolve()
        self.base_port = base_port
        self.workers = workers
        self.log_path = log_path
        self.bind_port = base_port + 10
        self.url = f'http://127.0.0.1:{self.bind_port}'
        self.instance_urls = [f'http://127.0.0.1:{self.bind_port + 1 + i}' for i in range(INSTANCES)]
        self.pg = LocalPostgres(self.home, base_port)
        self.redis = LocalRedis(self.home, base_port + 1)
        self.fleet_env: dict[str, str] = {}    # the block's --fleet-env, for every fleet up
        self.extra_env: dict[str, str] = {}    # one fault's own settings

    # --- fleet up / down --------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """The caller's environment without any GATEWAY_* of its own: the rig's settings are all written here."""
        env = {k: v for k, v in os.environ.items() if not k.startswith('GATEWAY_')}
        env.update({'GATEWAY_HOME': str(self.home), 'GATEWAY_BIND': f'127.0.0.1:{self.bind_port}',
                    'GATEWAY_PG_PORT': str(self.base_port), 'GATEWAY_REDIS_PORT': str(self.base_port + 1),
                    'GATEWAY_WORKERS': str(self.workers), 'GATEWAY_CPUS': 'auto', **self.fleet_env,
                    **self.extra_env})
        return env

    def settings(self) -> dict[str, str]:
        return {k: v for k, v in self.env().items() if k.startswith('GATEWAY_')}

    def fleet(self, *args: str, timeout: float = 300) -> str:
        cmd = [sys.executable, '-m', 'fleet.ops.cli', *args]
        with open(self.log_path, 'a') as log:
            log.write(f'\n$ {" ".join(cmd)}\n')
            log.flush()
            done = subprocess.run(cmd, cwd=system.REPO, env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, timeout=timeout)
        if done.returncode != 0:
            raise RigError(f'fleet {" ".join(args)} failed ({done.returncode}); see {self.log_path}')
        return ' '.join(cmd[1:])

    def up(self, attempts: int = 3) -> None:
        """fleet up, tried again (it starts only what is missing) when it fails: these ports lie in the ephemeral
        range, where a client socket of another process can hold one for a moment."""
        for attempt in range(attempts):
            try:
                self.fleet('up', '--instances', str(INSTANCES))
                break
            except RigError:
                if attempt == attempts - 1:
                    raise
                time.sleep(2)
        self.wait_whole(90)

    def down(self, keep_services: bool = False) -> None:
        self.fleet('down', *(['--keep-services'] if keep_services else []))

    # --- what runs ----------------------------------------------------------------------------
    def master(self, i: int) -> int | None:
        try:
            pid = int((self.home / 'run' / f'gunicorn-i{i}.pid').read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if running(pid) else None

    def nginx(self) -> int | None:
        try:
            pid = int((self.home / 'run' / 'nginx.pid').read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if running(pid) else None

    def worker_pids(self, i: int) -> list[int]:
        master = self.master(i)
        return [] if master is None else [p for p in system.process_tree(master) if p != master]

    def whole(self) -> bool:
        """Both masters alive with all their workers, each answering /health, and nginx too."""
        for i in range(INSTANCES):
            if len(self.worker_pids(i)) != self.workers:
                return False
        return all(_health(u) for u in [self.url, *self.instance_urls])

    def wait_whole(self, timeout_s: float) -> float:
        started = time.monotonic()
        while not self.whole():
            if time.monotonic() - started > timeout_s:
                raise RigError(f'the fleet is not whole after {timeout_s:.0f}s: masters '
                               f'{[self.master(i) for i in range(INSTANCES)]}, workers '
                               f'{[self.worker_pids(i) for i in range(INSTANCES)]}')
            time.sleep(0.1)
        return time.monotonic() - started

    # --- the Management API and the store ----------------------------------------------------
    @property
    def admin_key(self) -> str:
        return (self.home / 'admin_key').read_text().strip()

    def management(self, method: str, path: str, body=None, timeout: float = 30):
        return http(method, f'{self.url}/api/v1{path}', body, {'X-API-Key': self.admin_key}, timeout=timeout)

    def sql(self, statement: str, params=(), db: str = 'gateway') -> list[tuple]:
        conn = psycopg2.connect(self.pg.url(db), connect_timeout=5)
        try:
            with conn, conn.cursor() as cur:
                cur.execute(statement, params)
                return cur.fetchall()
        finally:
            conn.close()


def wait_gone(pids, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(running(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _health(url: str) -> bool:
    try:
        status, _ = http('GET', url + '/health', timeout=2)
    except OSError:
        return False
    return status == 200
