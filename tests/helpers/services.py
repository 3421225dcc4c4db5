"""Real PostgreSQL and Redis for tests, started through the product's own code path
(``fleet.ops.local``), so test setup and the embedded default cannot drift apart.

``start_services`` is the one factory of a PostgreSQL + Redis pair: ``conftest.py`` starts the
session's pair with it (every test that only uses the servers shares it), and the
``private_services`` fixture a pair of a module's own, for tests that stop or restart a
server (fault tests). ``start_postgres`` / ``start_redis`` start one server alone (the
embedded-default tests, the hostile-input corpus).

Each server gets a free port (``helpers.ports``: below the ephemeral range, locked across
processes), so pytest-xdist's workers and other checkouts' suites start theirs side by side;
``FIXED_PORTS`` names the environment variables that fix one for a serial run.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import psycopg2
import redis

from fleet.ops.local import LocalPostgres, LocalRedis
from fleet.ops.local.demo import create_demo_data
from helpers.ports import free_port
from helpers.util import ADMIN_KEY, METRICS_TOKEN, PASSWORD_ENV, SECRET_KEY

# The environment variables that fix a server's port instead of a free one (the first set wins),
# for a serial run that must use known ports (a firewall, a server watched from outside). Under
# pytest-xdist several workers would start one server each on the same port: the session refuses
# to start then (``conftest.py``), and ``GATEWAY_TEST_PORTS`` (a range) is the way to keep two
# suites apart.
FIXED_PORTS = {
    "pg": ("GATEWAY_TEST_PG_PORT",),                   # the session's pair
    "redis": ("GATEWAY_TEST_REDIS_PORT",),
    "private_pg": ("GATEWAY_TEST_PRIVATE_PG_PORT", "GATEWAY_TEST_FLEET_PG_PORT"),
    "private_redis": ("GATEWAY_TEST_PRIVATE_REDIS_PORT", "GATEWAY_TEST_FLEET_REDIS_PORT"),
    "corpus_pg": ("GATEWAY_TEST_CORPUS_PG_PORT",),
    "local_pg": ("GATEWAY_TEST_LOCAL_PG_PORT",),
    "local_redis": ("GATEWAY_TEST_LOCAL_REDIS_PORT",),
    "offline_pg": ("GATEWAY_TEST_OFFLINE_PG_PORT",),
    "offline_redis": ("GATEWAY_TEST_OFFLINE_REDIS_PORT",),
    "topology": ("GATEWAY_TEST_TOPOLOGY_PORT",),      # a base: helpers/redis_topologies.py
}


def fixed_port(role: str) -> int | None:
    """The port the environment fixes for ``role`` (a key of ``FIXED_PORTS``), if any."""
    for name in FIXED_PORTS[role]:
        if os.environ.get(name):
            return int(os.environ[name])
    return None


def fixed_port_variables() -> list[str]:
    return [name for names in FIXED_PORTS.values() for name in names if os.environ.get(name)]


def port_for(role: str) -> int:
    """``role``'s port: the one the environment fixes, else a free one (``helpers.ports``)."""
    fixed = fixed_port(role)
    return free_port() if fixed is None else fixed


def start_postgres(home: Path | str, port: int | None = None) -> LocalPostgres:
    """A running local PostgreSQL under ``home`` on 127.0.0.1:``port`` (default: a free one; ``.url(db)``)."""
    server = LocalPostgres(home, free_port() if port is None else port)
    server.start()
    return server


def start_redis(home: Path | str, port: int | None = None) -> LocalRedis:
    """A running password-protected Redis under ``home`` on 127.0.0.1:``port`` (default: a free one; ``.url()``)."""
    server = LocalRedis(home, free_port() if port is None else port)
    server.start()
    return server


class Services:
    """A PostgreSQL (the store in its ``gateway`` database) and a Redis, and what a test or a
    gateway process needs to use them."""

    def __init__(self, home: Path, pg: LocalPostgres, rd: LocalRedis, data_database: str):
        self.home = home
        self.pg = pg
        self.redis = rd
        self.data_database = data_database   # the database test connections read
        self.store_url = pg.url("gateway")

    @property
    def redis_url(self) -> str:
        return self.redis.url()

    def redis_client(self, timeout: float = 2.0) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url, socket_timeout=timeout, socket_connect_timeout=timeout)

    def sql(self, statement: str, args=(), db: str = "gateway"):
        """Run ``statement`` as the superuser on the store (or ``db``); its rows, if any."""
        conn = psycopg2.connect(self.pg.url(db), connect_timeout=5)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(statement, args)
                return cur.fetchall() if cur.description else None
        finally:
            conn.close()

    def env(self, home: Path, **settings) -> dict:
        """The environment of a gateway process (a gunicorn master, ``fleet``) on these
        servers, configured as the session's in-process app; ``settings``: more GATEWAY_*."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        env.update({"GATEWAY_DATABASE_URL": self.store_url, "GATEWAY_REDIS_URL": self.redis_url,
                    "GATEWAY_ADMIN_KEY": ADMIN_KEY, "GATEWAY_SECRET_KEY": SECRET_KEY,
                    "GATEWAY_METRICS_TOKEN": METRICS_TOKEN,
                    "GATEWAY_HOME": str(home), "GATEWAY_LOG_LEVEL": "warning",
                    # Timeout tests need a slow statement; the deny list refuses pg_sleep by default.
                    "GATEWAY_ALLOW_FUNCTIONS": "pg_sleep",
                    PASSWORD_ENV: self.pg.password()})
        env.update({"GATEWAY_" + k.upper(): str(v) for k, v in settings.items()})
        return env

    def stop(self) -> None:
        self.redis.stop()
        self.pg.stop()


def start_services(home: Path, pg_port: int | None = None, redis_port: int | None = None,
                   demo: bool = False) -> Services:
    """A running PostgreSQL + Redis pair under ``home``, the store's database made; with
    ``demo`` the ``demo`` database and its tables too (connections read it), else
    connections read ``postgres``."""
    home.mkdir(parents=True, exist_ok=True)
    pg = start_postgres(home, pg_port)
    try:
        rd = start_redis(home, redis_port)
    except BaseException:
        pg.stop()
        raise
    services = Services(home, pg, rd, "demo" if demo else "postgres")
    try:
        pg.ensure_database("gateway")
        if demo:
            pg.ensure_database("demo")
            create_demo_data(pg.url("demo"))
    except BaseException:
        services.stop()
        raise
    return services


def stalled(services: Services, seconds: float) -> threading.Thread:
    """``services``' Redis stopped now (SIGSTOP: its data and connections survive) and continued
    ``seconds`` later, on a thread of its own (join it)."""
    pid = int(services.redis.pid_file.read_text())
    os.kill(pid, signal.SIGSTOP)

    def resume():
        time.sleep(seconds)      # the stall the caller asked for
        os.kill(pid, signal.SIGCONT)
    thread = threading.Thread(target=resume)
    thread.start()
    return thread
