"""Real processes for the fleet tests: their own PostgreSQL (54459) and Redis (63859), their own
gunicorn masters (``fleet/gunicorn_conf.py``), in their own homes, and a load generator of
keep-alive HTTP clients that records every call.

Nothing here depends on ``conftest.py``. The servers are started through the product's own
``fleet.local`` (as ``tests/services.py`` does) once per session and stopped at its end; every
process a test starts is started here, in its own session, and ended by its own pid or group.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psycopg2
import redis
import requests

from services import start_postgres, start_redis

ROOT = Path(__file__).resolve().parent.parent
PG_PORT = int(os.environ.get("GATEWAY_TEST_FLEET_PG_PORT", "54459"))  # overridable: two suites at once
REDIS_PORT = int(os.environ.get("GATEWAY_TEST_FLEET_REDIS_PORT", "63859"))
ADMIN_KEY = "fleet-admin-" + uuid.uuid4().hex
SECRET_KEY = "fleet-secret-" + uuid.uuid4().hex
PASSWORD_ENV = "GW_FLEET_TEST_PG_PASSWORD"   # connections name the password as ${...}
HOSTNAME = socket.gethostname()
ALIVE = "gw:{fleet}:alive"


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- PostgreSQL and Redis, once per session --------------------------------------------------
class Services:
    def __init__(self, home: Path):
        self.home = home
        self.pg = start_postgres(home, PG_PORT)
        self.redis = start_redis(home, REDIS_PORT)
        self.pg.ensure_database("gateway")
        self.store_url = self.pg.url("gateway")

    @property
    def redis_url(self) -> str:
        return self.redis.url()

    def redis_client(self, timeout: float = 2.0) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url, socket_timeout=timeout, socket_connect_timeout=timeout)

    def sql(self, statement: str, args=(), db: str = "gateway"):
        conn = psycopg2.connect(self.pg.url(db), connect_timeout=5)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(statement, args)
                return cur.fetchall() if cur.description else None
        finally:
            conn.close()

    def env(self, home: Path, **settings) -> dict:
        """The environment of a gunicorn master (or ``fleet``) on these services."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        env.update({"GATEWAY_DATABASE_URL": self.store_url, "GATEWAY_REDIS_URL": self.redis_url,
                    "GATEWAY_ADMIN_KEY": ADMIN_KEY, "GATEWAY_SECRET_KEY": SECRET_KEY,
                    "GATEWAY_HOME": str(home), "GATEWAY_LOG_LEVEL": "warning",
                    PASSWORD_ENV: self.pg.password()})
        env.update({"GATEWAY_" + k.upper(): str(v) for k, v in settings.items()})
        return env

    def stop(self) -> None:
        self.redis.stop()
        self.pg.stop()


_services: Services | None = None


def shared_services(home: Path) -> Services:
    """One PostgreSQL and one Redis for every fleet test module of the session."""
    global _services
    if _services is None:
        home.mkdir(parents=True, exist_ok=True)
        _services = Services(home)
    return _services


def stop_shared_services() -> None:
    global _services
    if _services is not None:
        _services.stop()
        _services = None


# --- /proc ------------------------------------------------------------------------------------
def child_pids(pid: int) -> list[int]:
    """Live (not zombie) children of ``pid``."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            children.append(int(entry))
    return sorted(children)


def cpus_allowed(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list for {pid}")


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# --- a gunicorn master ----------------------------------------------------------------------------
class Master:
    """``python -m gunicorn -c fleet/gunicorn_conf.py --bind 127.0.0.1:<port> 'gateway.app:create_app()'``."""

    def __init__(self, services: Services, home: Path, workers: int = 4, **settings):
        self.services = services
        self.home = home
        self.workers = workers
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        home.mkdir(parents=True, exist_ok=True)
        self.log_path = home / f"gunicorn-{self.port}.log"
        settings.setdefault("cpus", "auto")
        settings.setdefault("instance", f"t{self.port}")
        self.env = services.env(home, workers=workers, **settings)
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60) -> "Master":
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "fleet" / "gunicorn_conf.py"),
                 "--bind", f"127.0.0.1:{self.port}", "gateway.app:create_app()"],
                cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        self.wait_ready(timeout_s)
        return self

    def worker_pids(self) -> list[int]:
        return child_pids(self.proc.pid)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def wait_ready(self, timeout_s: float = 60) -> list[int]:
        """Every worker forked, on the bus (its heartbeat in Redis) and /ready answering 200."""
        client = self.services.redis_client()
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                assert self.proc.poll() is None, f"gunicorn exited:\n{self.log_tail()}"
                workers = self.worker_pids()
                try:
                    registered = {k.decode() for k in client.hkeys(ALIVE)}
                except redis.RedisError:
                    registered = set()
                if len(workers) == self.workers and all(f"{HOSTNAME}:{w}" in registered for w in workers):
                    try:
                        if requests.get(self.base + "/ready", timeout=2).status_code == 200:
                            return workers
                    except requests.RequestException:
                        pass
                assert time.monotonic() < deadline, f"gunicorn did not come up:\n{self.log_tail()}"
                time.sleep(0.1)
        finally:
            client.close()

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        try:  # stragglers of the group this master was started in (start_new_session)
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait(timeout=10)


# --- HTTP clients -----------------------------------------------------------------------------------
class Api:
    """The Management API over real HTTP (admin key), and a few factories."""

    def __init__(self, base: str):
        self.base = base.rstrip("/")
        self.session = requests.Session()
        self.session.headers["X-API-Key"] = ADMIN_KEY

    def manage(self, method: str, path: str, body=None, expect: tuple = (200, 201, 204)) -> requests.Response:
        reply = self.session.request(method, self.base + "/api/v1" + path, json=body, timeout=30)
        assert reply.status_code in expect, f"{method} {path}: {reply.status_code} {reply.text[:500]}"
        return reply

    def connection(self) -> str:
        name = unique("conn")
        self.manage("POST", "/connections", {"name": name, "db": "postgres", "host": "127.0.0.1", "port": PG_PORT,
                                             "database": "postgres", "user": "postgres",
                                             "password": "${%s}" % PASSWORD_ENV, "active": True})
        return name

    def query(self, connection: str, sql: str = "SELECT 1 AS v", publish: bool = True) -> str:
        name = unique("q")
        self.manage("POST", "/queries", {"name": name, "connection_name": connection, "sql": sql,
                                         "parameters": {}, "publish": publish})
        return name

    def key(self, query: str, connection: str, **grants) -> tuple[str, str]:
        """(name, secret) of a new key granted ``query`` on ``connection``."""
        name = unique("key")
        reply = self.manage("POST", "/api-keys", {"name": name, "queries": [query], "connections": [connection],
                                                  **grants})
        return name, reply.json()["secret"]

    def close(self) -> None:
        self.session.close()


@dataclass
class Call:
    started: float        # time.monotonic() before the request was sent
    ended: float          # ... after the whole response was read
    status: int           # 0: no HTTP answer (socket error)
    code: str | None = None
    headers: dict = field(default_factory=dict)
    body: object = None
    target: str = ""


WATCHED_HEADERS = ("Retry-After", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset",
                   "X-Quota-Reset", "X-Quota-Remaining-Calls")


class Load:
    """``threads`` clients calling ``path`` with ``secret`` in a loop, each with its own
    keep-alive ``requests.Session`` (``close=True``: a new connection per call, which spreads
    calls over every worker of a master), until ``stop()``. Every call is recorded."""

    def __init__(self, bases, path: str, secret: str, threads: int = 8, close: bool = False,
                 keep_bodies: bool = False, pause_s: float = 0.0, until_refused: tuple | None = None):
        """``until_refused=(code, seconds)``: a client stops by itself once every call it made
        for ``seconds`` was refused with ``code`` (and it was refused at least once)."""
        self.bases = [bases] if isinstance(bases, str) else list(bases)
        self.until_refused = until_refused
        self.path = path
        self.secret = secret
        self.close = close
        self.keep_bodies = keep_bodies
        self.pause_s = pause_s
        self._stop = threading.Event()
        self._results: list[list[Call]] = [[] for _ in range(threads)]
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def __enter__(self) -> "Load":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def join(self, timeout_s: float) -> list[Call]:
        """Wait for clients that stop by themselves (``until_refused``); then stop the rest."""
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return self.stop()

    def stop(self) -> list[Call]:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        return self.calls

    @property
    def calls(self) -> list[Call]:
        return sorted((c for r in self._results for c in list(r)), key=lambda c: c.started)

    def _run(self, index: int) -> None:
        out = self._results[index]
        session = requests.Session()
        headers = {"X-API-Key": self.secret}
        if self.close:
            headers["Connection"] = "close"
        n = index
        refused_since = None
        while not self._stop.is_set():
            base = self.bases[n % len(self.bases)]
            n += 1
            started = time.monotonic()
            try:
                reply = session.get(base + self.path, headers=headers, timeout=10)
            except requests.RequestException:
                out.append(Call(started, time.monotonic(), 0, target=base))
                session.close()
                session = requests.Session()
                continue
            ended = time.monotonic()
            body = code = None
            if reply.status_code != 200 or self.keep_bodies:
                try:
                    body = reply.json()
                except ValueError:
                    body = reply.text
                if isinstance(body, dict):
                    code = body.get("code")
            out.append(Call(started, ended, reply.status_code, code,
                            {h: reply.headers[h] for h in WATCHED_HEADERS if h in reply.headers}, body, base))
            if self.until_refused is not None:
                if code != self.until_refused[0]:
                    refused_since = None
                elif refused_since is None:
                    refused_since = started
                elif ended - refused_since > self.until_refused[1]:
                    break
            if self.pause_s:
                time.sleep(self.pause_s)
        session.close()


def statuses(calls) -> dict:
    counts: dict = {}
    for c in calls:
        key = (c.status, c.code)
        counts[key] = counts.get(key, 0) + 1
    return counts


def most_in_window(times: list[float], window_s: float) -> int:
    """The largest number of ``times`` (sorted) inside any closed window of length ``window_s``."""
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] > window_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def wait_until(predicate, timeout_s: float, interval_s: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def key_id(services: Services, name: str) -> int:
    return services.sql("SELECT id FROM gw_api_keys WHERE name = %s", (name,))[0][0]


def runs_by_worker(services: Services, key: int) -> dict:
    """Calls of key id ``key`` in the store's run history: {worker ("host:pid"): {status: count}}."""
    rows = services.sql("SELECT worker, status, count(*) FROM gw_run_history WHERE key_id = %s GROUP BY 1, 2",
                        (key,))
    out: dict = {}
    for worker, status, count in rows:
        out.setdefault(worker, {})[status] = count
    return out
