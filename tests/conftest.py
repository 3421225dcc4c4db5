"""Shared fixtures: one real PostgreSQL and one real Redis for the whole session (started
through ``fleet.local``, see ``services.py``), an in-process gateway app on them, and a
real gunicorn master for the end-to-end tests.

Every test makes its own connections, queries and keys with a unique suffix, so tests
never depend on each other's objects.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import falcon.testing
import psycopg2
import pytest
import redis
import requests

from fleet.demo import create_demo_data
from gateway.app import create_app
from gateway.settings import Settings
from services import start_postgres, start_redis

ROOT = Path(__file__).resolve().parent.parent
PG_PORT = int(os.environ.get("GATEWAY_TEST_PG_PORT", "54439"))  # overridable: two suites at once
REDIS_PORT = int(os.environ.get("GATEWAY_TEST_REDIS_PORT", "63839"))
ADMIN_KEY = "test-admin-" + uuid.uuid4().hex
SECRET_KEY = "test-secret-" + uuid.uuid4().hex
# Connections refer to the demo database's password as ${GW_TEST_DEMO_PASSWORD}: the
# server (in-process app and gunicorn workers alike) reads it from its environment.
PASSWORD_ENV = "GW_TEST_DEMO_PASSWORD"

_NO_BODY = object()


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- servers ---------------------------------------------------------------------------
@pytest.fixture(scope="session")
def services(tmp_path_factory):
    home = tmp_path_factory.mktemp("svc")
    pg = start_postgres(home, PG_PORT)
    rd = start_redis(home, REDIS_PORT)
    try:
        pg.ensure_database("gateway")
        pg.ensure_database("demo")
        create_demo_data(pg.url("demo"))
        os.environ[PASSWORD_ENV] = pg.password()
        yield SimpleNamespace(home=home, pg=pg, redis=rd)
    finally:
        rd.stop()
        pg.stop()


@pytest.fixture(scope="session")
def settings(services, tmp_path_factory) -> Settings:
    return Settings(database_url=services.pg.url("gateway"), redis_url=services.redis.url(),
                    admin_key=ADMIN_KEY, secret_key=SECRET_KEY,
                    home=str(tmp_path_factory.mktemp("gw-home")), log_level="warning",
                    # Timeout tests need a slow statement; the deny list refuses pg_sleep by default.
                    allow_functions="pg_sleep")


@pytest.fixture(scope="session")
def superuser(services):
    """Helper to run SQL as the superuser on the store or the demo database."""
    def run(sql: str, args=(), db: str = "gateway"):
        conn = psycopg2.connect(services.pg.url(db), connect_timeout=5)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                return cur.fetchall() if cur.description else None
        finally:
            conn.close()
    return run


# --- in-process app --------------------------------------------------------------------
@pytest.fixture(scope="session")
def app(settings):
    """One in-process app for the session, with the real Redis bus."""
    application = create_app(settings)
    yield application
    application.parts.close()


@pytest.fixture
def client(app) -> falcon.testing.TestClient:
    return falcon.testing.TestClient(app)


@pytest.fixture(scope="session")
def admin() -> dict:
    return {"X-API-Key": ADMIN_KEY}


class Reply:
    """The parts of a response the tests look at, from either transport."""

    __slots__ = ("status", "headers", "content")

    def __init__(self, status: int, headers, content: bytes):
        self.status = status
        self.headers = headers
        self.content = content

    @property
    def json(self):
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode()

    def __repr__(self):
        return f"<Reply {self.status} {self.content[:300]!r}>"


class Api:
    """The Management API and the data plane, as a user's script drives them."""

    def __init__(self, send, services):
        self._send = send
        self.services = services
        self.admin = {"X-API-Key": ADMIN_KEY}

    # --- raw -----------------------------------------------------------------------------
    def request(self, method: str, path: str, *, params=None, json_body=_NO_BODY, body=None,
                headers=None, query_string=None) -> Reply:
        return self._send(method, path, params=params, json_body=json_body, body=body,
                          headers=headers or {}, query_string=query_string)

    def manage(self, method: str, path: str, json_body=_NO_BODY, **kw) -> Reply:
        return self.request(method, "/api/v1" + path, json_body=json_body,
                            headers={**self.admin, **kw.pop("headers", {})}, **kw)

    def call(self, name: str, secret: str | None, params=None, **kw) -> Reply:
        """GET /q/<name> with the query string ``params``."""
        headers = {"X-API-Key": secret} if secret else {}
        return self.request("GET", f"/q/{name}", params=params, headers={**headers, **kw.pop("headers", {})}, **kw)

    def post(self, name: str, secret: str | None, body) -> Reply:
        headers = {"X-API-Key": secret} if secret else {}
        return self.request("POST", f"/q/{name}", json_body=body, headers=headers)

    # --- factories -----------------------------------------------------------------------
    def connection(self, name: str | None = None, **fields) -> str:
        name = name or unique("conn")
        doc = {"name": name, "db": "postgres", "host": "127.0.0.1", "port": PG_PORT,
               "database": "demo", "user": "postgres", "password": "${%s}" % PASSWORD_ENV, **fields}
        reply = self.manage("POST", "/connections", doc)
        assert reply.status == 201, reply
        return name

    def query(self, sql: str, parameters: dict | None = None, connection: str | None = None,
              publish: bool = True, name: str | None = None, **fields) -> str:
        name = name or unique("q")
        doc = {"name": name, "connection_name": connection or self.connection(), "sql": sql,
               "parameters": parameters or {}, "publish": publish, **fields}
        reply = self.manage("POST", "/queries", doc)
        assert reply.status == 201, reply
        return name

    def key(self, queries=(), connections=(), name: str | None = None, **fields) -> str:
        name = name or unique("key")
        doc = {"name": name, "queries": list(queries), "connections": list(connections), **fields}
        reply = self.manage("POST", "/api-keys", doc)
        assert reply.status == 201, reply
        return reply.json["secret"]

    def endpoint(self, sql: str, parameters: dict | None = None, **query_fields) -> SimpleNamespace:
        """Connection + published query + a key granted both; returns names and the secret."""
        connection = query_fields.pop("connection", None) or self.connection()
        query = self.query(sql, parameters, connection=connection, **query_fields)
        key_name = unique("key")
        secret = self.key([query], [connection], name=key_name)
        return SimpleNamespace(query=query, connection=connection, key=key_name, secret=secret)


def _in_process_sender(client: falcon.testing.TestClient):
    def send(method, path, *, params, json_body, body, headers, query_string):
        kwargs = {"headers": headers}
        if params is not None:
            kwargs["params"] = params
        if query_string is not None:
            kwargs["query_string"] = query_string
        if json_body is not _NO_BODY:
            kwargs["json"] = json_body
        elif body is not None:
            kwargs["body"] = body
        result = client.simulate_request(method, path, **kwargs)
        return Reply(result.status_code, result.headers, result.content)
    return send


def _http_sender(base: str, session: requests.Session):
    def send(method, path, *, params, json_body, body, headers, query_string):
        url = base + path + (f"?{query_string}" if query_string else "")
        kwargs = {"headers": headers, "params": params, "timeout": 60}
        if json_body is not _NO_BODY:
            kwargs["json"] = json_body
        elif body is not None:
            kwargs["data"] = body
        response = session.request(method, url, **kwargs)
        return Reply(response.status_code, response.headers, response.content)
    return send


@pytest.fixture
def api(client, services) -> Api:
    return Api(_in_process_sender(client), services)


@pytest.fixture(scope="session")
def demo_connection(app, services) -> str:
    """A connection to the demo database shared by tests that do not change it."""
    api = Api(_in_process_sender(falcon.testing.TestClient(app)), services)
    return api.connection(unique("demo"))


@pytest.fixture
def endpoint(api, demo_connection):
    """Factory: ``endpoint(sql, parameters)`` -> names and the key's secret."""
    def make(sql: str, parameters: dict | None = None, **fields):
        fields.setdefault("connection", demo_connection)
        return api.endpoint(sql, parameters, **fields)
    return make


@pytest.fixture
def make_app(settings):
    """Factory for an extra in-process app with other settings; closed after the test."""
    made = []

    def make(sync=None, **overrides):
        values = {f: getattr(settings, f) for f in settings.__dataclass_fields__}
        values.update(overrides)
        application = create_app(Settings(**values), sync=sync)
        made.append(application)
        return application
    yield make
    for application in made:
        application.parts.close()


# --- a real gunicorn master --------------------------------------------------------------
from fleet_helpers import child_pids  # noqa: E402  (one /proc reader for every test module)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


class Gunicorn(SimpleNamespace):
    def worker_pids(self) -> list[int]:
        return child_pids(self.proc.pid)


@pytest.fixture(scope="session")
def gunicorn(settings, services, tmp_path_factory, app):
    """``gunicorn -c fleet/gunicorn_conf.py`` with 2 workers, on a free port; SIGTERM at the end.

    It shares the store and Redis with the in-process app (``app`` is listed so it is
    closed after this master stops): both belong to one fleet.
    """
    home = tmp_path_factory.mktemp("gunicorn-home")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update({"GATEWAY_DATABASE_URL": settings.database_url, "GATEWAY_REDIS_URL": settings.redis_url,
                "GATEWAY_ADMIN_KEY": ADMIN_KEY, "GATEWAY_SECRET_KEY": SECRET_KEY,
                "GATEWAY_WORKERS": "2", "GATEWAY_HOME": str(home), "GATEWAY_LOG_LEVEL": "warning",
                "GATEWAY_ALLOW_FUNCTIONS": "pg_sleep",
                PASSWORD_ENV: services.pg.password()})
    log_path = home / "gunicorn.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen([str(ROOT / ".venv/bin/gunicorn"), "-c", "fleet/gunicorn_conf.py",
                             "--bind", f"127.0.0.1:{port}", "gateway.app:create_app()"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    alive = redis.Redis.from_url(settings.redis_url)
    hostname = socket.gethostname()
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log_path.read_text(errors="replace")
            workers = child_pids(proc.pid)
            registered = {k.decode() for k in alive.hkeys("gw:{fleet}:alive")}
            if len(workers) == 2 and all(f"{hostname}:{w}" in registered for w in workers):
                try:
                    if requests.get(base + "/ready", timeout=2).status_code == 200:
                        break
                except requests.RequestException:
                    pass
            assert time.monotonic() < deadline, "gunicorn did not come up:\n" + \
                log_path.read_text(errors="replace")
            time.sleep(0.1)
        yield Gunicorn(proc=proc, base=base, port=port, log=log_path)
    finally:
        workers = child_pids(proc.pid)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        alive.close()
        for pid in workers:  # workers leave with their master
            deadline = time.monotonic() + 10
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.05)


@pytest.fixture
def http(gunicorn, services):
    """An ``Api`` talking real HTTP to the gunicorn master."""
    session = requests.Session()
    yield Api(_http_sender(gunicorn.base, session), services)
    session.close()


@pytest.fixture
def http_endpoint(http, demo_connection):
    def make(sql: str, parameters: dict | None = None, **fields):
        fields.setdefault("connection", demo_connection)
        return http.endpoint(sql, parameters, **fields)
    return make


# --- run history -------------------------------------------------------------------------
def wait_for_history(superuser, request_ids, timeout=5.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        rows = superuser("SELECT request_id, query, version, status, code, row_count, key_id "
                         "FROM gw_run_history WHERE request_id = ANY(%s)", (list(request_ids),))
        found = {r[0]: r[1:] for r in rows}
        if len(found) == len(set(request_ids)) or time.monotonic() > deadline:
            return found
        time.sleep(0.05)
