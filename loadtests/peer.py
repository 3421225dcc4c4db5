"""The peer, QueryAPIGate 0.43.0, in its own virtual environment, started the way its Docker image runs it.

    python -m loadtests.peer setup                 # .bench/qag-venv with queryapigate[postgres,flow,server,redis]==0.43.0
    python -m loadtests.peer version               # what is installed there
    python -m loadtests.peer start --store-url postgresql://postgres@127.0.0.1:54500/qagstore --port 18001 --cpu 1

The image's command is `gunicorn --workers 1 --worker-class gthread --threads 8 --timeout 120 --graceful-timeout 30
--access-logfile - queryapigate.app:create_app()`; 0.43 ships `queryapigate.gunicorn_conf` (threads from
QUERYAPIGATE_THREADS, default 8; the access log on, to stdout, in its own format), which we load as well. The metadata
cache is on (QUERYAPIGATE_METADATA_CACHE_TTL=5, as in the peer's own "main with the metadata cache" figures). Its
store is a PostgreSQL database of its own (QUERYAPIGATE_DATABASE_URL). See loadtests/PEER.md for its API.
"""
from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

from . import system
from .system import REPO
from .targets import Target, start_process, stop_process, wait_healthy

VERSION = '0.43.0'
REQUIREMENT = f'queryapigate[postgres,flow,server,redis]=={VERSION}'   # redis: its Redis response cache (block cache)
VENV = REPO / '.bench' / 'qag-venv'
PYTHON = VENV / 'bin' / 'python'
GUNICORN = VENV / 'bin' / 'gunicorn'
METADATA_CACHE_TTL = '5'


def setup(force: bool = False, python: str | None = None) -> Path:
    """Create .bench/qag-venv and install the peer there (its own Flask, gunicorn and psycopg2, apart from ours)."""
    if force or not PYTHON.exists():
        VENV.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([python or sys.executable, '-m', 'venv', '--clear', str(VENV)], check=True)
    subprocess.run([str(PYTHON), '-m', 'pip', 'install', '--quiet', REQUIREMENT], check=True)
    print(f'{REQUIREMENT} installed in {VENV}: {installed()}')
    return VENV


def installed() -> dict:
    if not PYTHON.exists():
        return {}
    return system.venv_versions(PYTHON, ['queryapigate', 'gunicorn', 'Flask', 'psycopg2-binary', 'sqlglot'])


def command(port: int, control_socket: Path) -> list[str]:
    """gunicorn as the Docker image runs it, bound to loopback. The control socket (gunicorn 27+) gets a path of
    its own, so it can't collide with another gunicorn master on this machine (ours)."""
    return [str(GUNICORN), '-c', 'python:queryapigate.gunicorn_conf', '--bind', f'127.0.0.1:{port}',
            '--workers', '1', '--worker-class', 'gthread', '--threads', '8', '--timeout', '120',
            '--graceful-timeout', '30', '--access-logfile', '-', '--control-socket', str(control_socket),
            'queryapigate.app:create_app()']


def environment(store_url: str, admin_key: str, home: Path, extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(('QUERYAPIGATE_', 'SQL2API_'))}
    env.update({
        'QUERYAPIGATE_HOME': str(home),                 # its working folder (the store itself is in PostgreSQL)
        'QUERYAPIGATE_DATABASE_URL': store_url,         # connections, saved queries, keys, history, audit
        'QUERYAPIGATE_API_KEY': admin_key,              # the admin ("break-glass") key, sent as X-API-Key
        'QUERYAPIGATE_METADATA_CACHE_TTL': METADATA_CACHE_TTL,
        'PYTHONUNBUFFERED': '1',                        # as in the image
        **(extra or {}),
    })
    return env


def start(*, port: int, cpu: str | None, store_url: str, run_dir: Path, admin_key: str | None = None,
          extra_env: dict | None = None) -> Target:
    """Start the peer (pinned to `cpu`) and return its Target once it answers /health."""
    if not GUNICORN.exists():
        raise RuntimeError(f'the peer is not installed: run `python -m loadtests.peer setup` ({VENV})')
    admin_key = admin_key or 'adm_' + secrets.token_urlsafe(24)
    home = run_dir / 'peer-home'
    home.mkdir(parents=True, exist_ok=True)
    cmd = command(port, home / 'gunicorn.ctl')
    env = environment(store_url, admin_key, home, extra_env)
    log_path = run_dir / 'peer.log'
    process = start_process(cmd, env=env, cwd=home, log_path=log_path, cpu=cpu)
    shown = {k: ('***' if k == 'QUERYAPIGATE_API_KEY' else system.redact(v)) for k, v in env.items()
             if k.startswith('QUERYAPIGATE_')}
    target = Target(name='peer', base_url=f'http://127.0.0.1:{port}', admin_key=admin_key, pids=[process.pid],
                    process=process, log_path=log_path, description=f'QueryAPIGate {VERSION}, 1 worker, 8 threads',
                    info={'command': ' '.join(cmd), 'env': shown, 'cpu': cpu})
    try:
        wait_healthy(target)
    except Exception:
        stop_process(process)
        raise
    return target


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m loadtests.peer', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest='command', required=True)
    p_setup = sub.add_parser('setup', help=f'create {VENV.relative_to(REPO)} and install {REQUIREMENT}')
    p_setup.add_argument('--force', action='store_true', help='recreate the venv')
    p_setup.add_argument('--python', help='interpreter to base the venv on (default: this one)')
    sub.add_parser('version', help='print the installed versions')
    p_start = sub.add_parser('start', help='run the peer in the foreground (Ctrl-C stops it)')
    p_start.add_argument('--store-url', required=True, help='postgresql:// URL of its own store database')
    p_start.add_argument('--port', type=int, default=18001)
    p_start.add_argument('--cpu', default='1', help="taskset CPU list, or 'off'")
    p_start.add_argument('--admin-key', default=None)
    p_start.add_argument('--run-dir', type=Path, default=REPO / '.bench' / 'peer-run')
    args = parser.parse_args(argv)
    if args.command == 'setup':
        setup(force=args.force, python=args.python)
    elif args.command == 'version':
        print(installed() or f'not installed in {VENV}')
    else:
        target = start(port=args.port, cpu=args.cpu, store_url=args.store_url, run_dir=args.run_dir,
                       admin_key=args.admin_key)
        print(f'peer at {target.base_url} (pid {target.pids[0]}), admin key {target.admin_key}, log '
              f'{target.log_path}. Ctrl-C or SIGTERM stops it.', flush=True)

        def on_term(signum, frame):
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)  # also when started in the background, where SIGINT is ignored
        try:
            target.process.wait()
        except KeyboardInterrupt:
            pass
        finally:
            stop_process(target.process)


if __name__ == '__main__':
    main()
