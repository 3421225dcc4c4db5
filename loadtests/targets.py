"""A target is one gateway under test: where it answers, how to reach its Management API, the key and path its
data-plane calls use, and which processes to measure. The harness doesn't care which product it is: the peer
(QueryAPIGate, loadtests/peer.py) and our gateway are both started, provisioned and measured through this module,
with the same Management API bodies - keeping those the same is the compatibility contract (loadtests/PEER.md).
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.client import HTTPConnection
from pathlib import Path

from . import system
from .system import REPO, taskset_prefix

CONNECTION = 'demo'
QUERY = 'account'
KEY = 'bench'
ACCOUNT_SQL = 'SELECT aid, bid, abalance FROM pgbench_accounts WHERE aid = :aid'


@dataclass
class Target:
    name: str
    base_url: str
    admin_key: str = ''
    api_key: str = ''               # the data-plane key, set by provision()
    query_path: str = f'/q/{QUERY}'
    param: str = 'aid'
    pids: list = field(default_factory=list)  # roots to measure: a gunicorn master (its workers are found under it)
    process: subprocess.Popen | None = None   # set when the harness started it
    log_path: Path | None = None
    description: str = ''
    info: dict = field(default_factory=dict)  # settings and versions, for the report
    wrk_env: dict = field(default_factory=dict)  # more settings of wrk/random_aid.lua (KEYS_FILE, CLIENT_IPS)

    def url(self, path: str) -> str:
        return self.base_url.rstrip('/') + path

    def summary(self) -> dict:
        return {'name': self.name, 'base_url': self.base_url, 'query_path': self.query_path, 'pids': self.pids,
                'description': self.description, **self.info}


class TargetError(RuntimeError):
    pass


# --------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------

def get(url: str, key: str, timeout: float = 30) -> tuple[int, dict, bytes]:
    """(status, headers lower-cased, body) of a GET with an X-API-Key - never raises for an HTTP status."""
    request = urllib.request.Request(url, headers={'X-API-Key': key})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


def http(method: str, url: str, body=None, headers: dict | None = None, timeout: float = 30):
    """(status, parsed JSON or text) - never raises for an HTTP status."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={
        **({'Content-Type': 'application/json'} if data is not None else {}), **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    text = raw.decode('utf-8', 'replace')
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


class Client:
    """One keep-alive HTTP connection: each call's status, body and time (ms, from sending to the whole answer)."""

    def __init__(self, base_url: str, headers: dict, timeout: float = 60):
        host, port = base_url.split('//', 1)[1].rstrip('/').rsplit(':', 1)
        self.conn = HTTPConnection(host, int(port), timeout=timeout)
        self.headers = headers

    def call(self, method: str, path: str, body=None) -> tuple[int, bytes, float]:
        payload = json.dumps(body).encode() if body is not None else None
        headers = dict(self.headers, **({'Content-Type': 'application/json'} if payload else {}))
        started = time.perf_counter()
        self.conn.request(method, path, body=payload, headers=headers)
        response = self.conn.getresponse()
        data = response.read()
        return response.status, data, (time.perf_counter() - started) * 1000

    def close(self):
        self.conn.close()


def management(target: Target, method: str, path: str, body=None):
    return http(method, target.url('/api/v1' + path), body, {'X-API-Key': target.admin_key})


# --------------------------------------------------------------------------------------
# Provisioning: the same bodies for every target
# --------------------------------------------------------------------------------------

def connection_body(data_url: str, name: str = CONNECTION) -> dict:
    parts = system.dsn_parts(data_url)
    return {'name': name, 'db': 'postgres', 'host': parts['host'], 'port': parts['port'], 'user': parts['user'],
            'password': parts['password'], 'database': parts['database']}


def query_body(name: str = QUERY, connection: str = CONNECTION) -> dict:
    return {'name': name, 'description': 'One account by primary key (benchmark lookup)', 'sql': ACCOUNT_SQL,
            'connection_name': connection, 'parameters': {'aid': 'int'}, 'publish': True}


def key_body(name: str = KEY, query: str = QUERY, connection: str = CONNECTION) -> dict:
    return {'name': name, 'queries': [query], 'connections': [connection]}


def provision(target: Target, data_url: str, *, probe_id: int = 42, key_extra: dict | None = None) -> dict:
    """Create the connection, the published saved query and a key through the target's Management API; set
    target.api_key; check one call answers the row. Returns what was done, for the report. `key_extra`: more
    fields of the key's body (e.g. rate_limit and quota, for the admission block)."""
    steps = {}
    status, body = management(target, 'POST', '/connections', connection_body(data_url))
    _expect(target, 'create connection', status, body, ok=(201, 409))
    steps['connection'] = status
    status, body = management(target, 'POST', '/queries', query_body())
    _expect(target, 'create saved query', status, body, ok=(201, 409))
    steps['query'] = status
    key_doc = {**key_body(), **(key_extra or {})}
    status, body = management(target, 'POST', '/api-keys', key_doc)
    if status == 409:  # a kept store: the secret is shown only once, so start the key again
        management(target, 'DELETE', f'/api-keys/{KEY}')
        status, body = management(target, 'POST', '/api-keys', key_doc)
    _expect(target, 'create API key', status, body, ok=(201,))
    if not isinstance(body, dict) or not body.get('secret'):
        raise TargetError(f'{target.name}: the key response has no "secret": {str(body)[:300]}')
    target.api_key = body['secret']
    steps['key'] = status
    steps['probe'] = probe(target, probe_id)
    return steps


def probe(target: Target, aid: int = 42) -> str:
    """One data-plane call; raises unless it answers 200 with the row for `aid`."""
    status, body = http('GET', target.url(f'{target.query_path}?{target.param}={aid}'),
                        headers={'X-API-Key': target.api_key})
    rows = body if isinstance(body, list) else (body.get('rows') or body.get('data')) if isinstance(body, dict) \
        else None
    if status != 200 or not rows or not isinstance(rows[0], dict) or rows[0].get('aid') != aid:
        raise TargetError(f'{target.name}: GET {target.query_path}?{target.param}={aid} answered {status}: '
                          f'{str(body)[:300]}')
    return json.dumps(body)[:200]


def _expect(target, what, status, body, ok):
    if status not in ok:
        raise TargetError(f'{target.name}: {what} answered {status}: {str(body)[:500]}')


# --------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------

def start_process(cmd: list, *, env: dict, cwd: Path, log_path: Path, cpu: str | None) -> subprocess.Popen:
    """Start `cmd` pinned to `cpu`, in its own session (so stop_process() can end it and all it forked), its
    output to `log_path` - a file, never a pipe nobody reads (an access log would block on it)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, 'ab')
    try:
        return subprocess.Popen([*taskset_prefix(cpu), *cmd], env=env, cwd=str(cwd), stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    finally:
        log.close()


def wait_healthy(target: Target, timeout_s: float = 60):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        if target.process is not None and target.process.poll() is not None:
            raise TargetError(f'{target.name} exited with {target.process.returncode} while starting:\n'
                              + log_tail(target.log_path))
        try:
            status, body = http('GET', target.url('/health'), timeout=2)
            if status == 200:
                return body
            last = f'{status} {str(body)[:200]}'
        except OSError as error:
            last = str(error)
        time.sleep(0.25)
    raise TargetError(f'{target.name} did not answer /health within {timeout_s:.0f}s (last: {last}):\n'
                      + log_tail(target.log_path))


def stop_process(process: subprocess.Popen | None, grace_s: float = 20):
    """SIGTERM the process we started (gunicorn: a graceful stop), then SIGKILL its session's group if it is still
    there. The group is the one start_process() created for it, so this ends only what the harness started."""
    if process is None or process.poll() is not None:
        return
    try:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # stragglers of its own group (workers, if the master died first)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def log_tail(path: Path | None, lines: int = 30) -> str:
    if path is None or not path.exists():
        return '(no log)'
    return '\n'.join(path.read_text(errors='replace').splitlines()[-lines:])


# --------------------------------------------------------------------------------------
# Our gateway
# --------------------------------------------------------------------------------------

GATEWAY_VENV = REPO / '.venv'


def gateway_available(root: Path = REPO) -> str | None:
    """None when our gateway can be started from checkout `root`; otherwise what is missing."""
    missing = [] if (root / gunicorn_conf(root)).exists() else ['fleet/server/gunicorn_conf.py']
    if not (root / 'fleet/app.py').exists() and not (root / 'gateway/app.py').exists():
        missing.append('fleet/app.py')
    if not (GATEWAY_VENV / 'bin' / 'gunicorn').exists():
        missing.append('.venv/bin/gunicorn')
    return ('missing ' + ', '.join(missing) + f' (in {root})') if missing else None


def gunicorn_conf(root: Path) -> str:
    """The gunicorn configuration of checkout `root`: fleet/server/ since fleet/ was split (issue 27), fleet/ before."""
    return 'fleet/server/gunicorn_conf.py' if (root / 'fleet' / 'server').is_dir() else 'fleet/gunicorn_conf.py'


def wsgi_entry(root: Path) -> str:
    """The WSGI entry point of checkout `root`: fleet.app since the composition root moved there; an older commit's
    gateway.app before that (so two builds can be measured side by side)."""
    return 'fleet.app:create_app()' if (root / 'fleet' / 'app.py').exists() else 'gateway.app:create_app()'


def start_gateway(*, port: int, cpu: str, store_url: str, redis_url: str, run_dir: Path,
                  admin_key: str | None = None, extra_env: dict | None = None, root: Path = REPO,
                  name: str = 'gateway', wsgi: str | None = None) -> Target:
    """Our gateway, one worker pinned to `cpu`, as the lead specified:
    GATEWAY_DATABASE_URL=... GATEWAY_REDIS_URL=... GATEWAY_ADMIN_KEY=... GATEWAY_SECRET_KEY=... GATEWAY_WORKERS=1
    GATEWAY_CPUS=<cpu> .venv/bin/gunicorn -c fleet/server/gunicorn_conf.py --bind 127.0.0.1:<port> 'fleet.app:create_app()'
    (also under taskset, so the master sits on the same core as its worker). `root`: the checkout to run (another
    one than this, e.g. an older commit, to compare two builds); the interpreter is always this repo's .venv.
    `wsgi`: the WSGI entry point instead of the checkout's (a factory of loadtests/, run from `root`)."""
    problem = gateway_available(root)
    if problem:
        raise TargetError(f'gateway target not available yet: {problem}')
    admin_key = admin_key or 'adm_' + secrets.token_urlsafe(24)
    home = run_dir / f'{name}-home'
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith('GATEWAY_')}
    settings = {'GATEWAY_DATABASE_URL': store_url, 'GATEWAY_REDIS_URL': redis_url,
                'GATEWAY_ADMIN_KEY': admin_key, 'GATEWAY_SECRET_KEY': secrets.token_urlsafe(32),
                'GATEWAY_WORKERS': '1', 'GATEWAY_CPUS': cpu, 'GATEWAY_HOME': str(home), **(extra_env or {})}
    env.update(settings)
    cmd = [str(GATEWAY_VENV / 'bin' / 'gunicorn'), '-c', gunicorn_conf(root), '--bind', f'127.0.0.1:{port}',
           wsgi or wsgi_entry(root)]
    log_path = run_dir / f'{name}.log'
    process = start_process(cmd, env=env, cwd=root, log_path=log_path, cpu=cpu)
    shown = {k: ('***' if k in ('GATEWAY_ADMIN_KEY', 'GATEWAY_SECRET_KEY') else system.redact(v))
             for k, v in settings.items()}
    described = 'gateway-fleet (this repo), 1 worker' if root == REPO else f'gateway-fleet at {root}, 1 worker'
    return Target(name=name, base_url=f'http://127.0.0.1:{port}', admin_key=admin_key, pids=[process.pid],
                  process=process, log_path=log_path, description=described,
                  info={'command': ' '.join(cmd), 'env': shown, 'cpu': cpu, 'root': str(root)})


# --------------------------------------------------------------------------------------
# Redis for our gateway, when none is given
# --------------------------------------------------------------------------------------

def start_redis(*, port: int, cpu: str | None, run_dir: Path) -> tuple[subprocess.Popen, str]:
    """A throwaway redis-server on loopback (no persistence), pinned with the database, for one run."""
    server = system.tool_path('redis-server')
    if not server:
        raise TargetError('redis-server not found: install it or pass --redis-url')
    data = run_dir / 'redis'
    data.mkdir(parents=True, exist_ok=True)
    cmd = [server, '--port', str(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no',
           '--dir', str(data), '--daemonize', 'no']
    process = start_process(cmd, env=dict(os.environ), cwd=data, log_path=run_dir / 'redis.log', cpu=cpu)
    deadline = time.monotonic() + 10
    import socket
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(('127.0.0.1', port), timeout=1) as sock:
                sock.sendall(b'PING\r\n')
                if sock.recv(16).startswith(b'+PONG'):
                    return process, f'redis://127.0.0.1:{port}/0'
        except OSError:
            time.sleep(0.1)
        if process.poll() is not None:
            break
    stop_process(process)
    raise TargetError('redis-server did not start:\n' + log_tail(run_dir / 'redis.log'))
