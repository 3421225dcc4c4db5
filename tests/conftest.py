"""The fixtures of every test: one real PostgreSQL and one real Redis for the whole session
(started through ``fleet.ops.local``, see ``helpers/services.py``), an in-process gateway app on
them, and a real gunicorn master for the end-to-end tests. What is not a fixture lives in
``helpers/``.

Every test makes its own connections, queries and keys with a unique suffix, so tests never
depend on each other's objects; the gateway processes a test starts (gunicorn masters,
``fleet up``) join the session's store and Redis with the session's keys.

Tiers: every test is marked ``unit``, ``integration`` or ``fleet`` as it is collected, by what it
uses (``helpers/tiers.py`` has the rules; an explicit marker wins), so ``pytest -m unit`` runs in
well under a minute and a new test lands in a tier without a thought.

Ports: every server gets a free one (``helpers/ports.py``): below Linux's ephemeral range
(32768-60999), where no client's connection can hold the port between the moment it is picked
and the moment the server binds it (two suites side by side met "Address already in use" that
way), and locked across processes, so pytest-xdist's workers and other checkouts' suites never
pick the same one. Each xdist worker starts its own session pair (its own store, Redis and
gunicorn master): tests share them through unique names, but a fleet's bus, heartbeats and
events are per Redis, and what one worker's fault tests do must not reach another's.
``GATEWAY_TEST_PORTS=low-high`` narrows the range; ``helpers.services.FIXED_PORTS`` lists the
variables that fix a server's port for a serial run (``GATEWAY_TEST_PG_PORT``...).

Servers: the session's pair (``services``), the store in database ``gateway``, the demo tables
in ``demo``; a module's own pair (``private_services``) for fault tests that stop or restart a
server (Redis restarted under load), so that nothing else sees the outage; the hostile-input
corpus's own PostgreSQL (``governance/test_governance_corpus.py``: hostile SQL runs there as the
superuser); the embedded default's servers (``fleet/test_local.py`` tests ``fleet.ops.local`` itself).

Timeouts (pytest-timeout): ``timeout`` in setup.cfg for every test, ``SLOW_TIMEOUT_S`` for those
marked ``slow``: a hang fails with the test's name and the stacks of every thread.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import falcon.testing
import psycopg2
import pytest

from fleet.app import create_app
from gateway.settings import Settings
from helpers import tiers
from helpers.api import Api
from helpers.masters import Master
from helpers.services import fixed_port_variables, port_for, start_services
from helpers.util import ADMIN_KEY, METRICS_TOKEN, PASSWORD_ENV, ROOT, SECRET_KEY, unique

SLOW_TIMEOUT_S = 300


# --- tiers, timeouts, order ---------------------------------------------------------------
def _temp_root_of_this_checkout(config) -> None:
    """The session's temporary folders under a root of this checkout's own, not the machine's
    shared ``/tmp/pytest-of-<user>``: the embedded PostgreSQL runs as the ``postgres`` user, which
    reaches its data folder through a search bit (``o+x``) that ``fleet.ops.local`` adds on the way
    there; every pytest session that starts on the machine resets ``pytest-of-<user>`` to 0700,
    and another checkout's suite starting then failed an ``initdb`` of ours ("Permission
    denied" on ``global/pg_control``)."""
    if config.option.basetemp or os.environ.get("PYTEST_DEBUG_TEMPROOT") or hasattr(config, "workerinput"):
        return
    root = Path(tempfile.gettempdir()) / f"gateway-tests-{hashlib.sha1(str(ROOT).encode()).hexdigest()[:10]}"
    root.mkdir(mode=0o711, exist_ok=True)
    os.environ["PYTEST_DEBUG_TEMPROOT"] = str(root)


def pytest_addoption(parser):
    parser.addoption("--store-durations", action="store_true",
                     help="write each file's seconds to tests/durations.json (the order of later xdist runs)")


def pytest_configure(config):
    _temp_root_of_this_checkout(config)
    if config.getoption("store_durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(tiers.DurationTable(), "gateway-durations")
    fixed = fixed_port_variables()
    if fixed and tiers.xdist_workers(config) > 1:
        raise pytest.UsageError(f"{', '.join(fixed)} fix(es) a server's port, which several xdist workers "
                                "cannot share: run with -n 0, or unset it (free ports are picked and locked, "
                                "GATEWAY_TEST_PORTS=low-high narrows their range)")
    tiers.refuse_servers()


@pytest.hookimpl(tryfirst=True)     # before xdist's own, which reads the markers
def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(tiers.tier_of(item))
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
    if tiers.xdist_workers(config):
        tiers.heaviest_first(items)


@pytest.hookimpl(tryfirst=True)     # before the fixtures of the test are set up
def pytest_runtest_setup(item):
    tiers.current = tiers.tier_of(item)


# --- servers ---------------------------------------------------------------------------
@pytest.fixture(scope="session")
def services(tmp_path_factory):
    """The session's PostgreSQL + Redis (``helpers.services.Services``)."""
    servers = start_services(tmp_path_factory.mktemp("svc"), port_for("pg"), port_for("redis"), demo=True)
    try:
        with pytest.MonkeyPatch.context() as patch:
            # for the in-process apps; gateway processes get it from ``Services.env``
            patch.setenv(PASSWORD_ENV, servers.pg.password())
            yield servers
    finally:
        servers.stop()


@pytest.fixture
def redis_url(services) -> str:
    return services.redis_url


@pytest.fixture
def rdb(services):
    """A client of the session's Redis."""
    client = services.redis_client()
    yield client
    client.close()


@pytest.fixture(scope="module")
def private_services(tmp_path_factory):
    """A PostgreSQL + Redis pair of this module's own, for tests that stop or restart a server;
    connections read its ``postgres`` database."""
    servers = start_services(tmp_path_factory.mktemp("private-svc"), port_for("private_pg"), port_for("private_redis"))
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture(scope="session")
def settings(services, tmp_path_factory) -> Settings:
    return Settings(database_url=services.store_url, redis_url=services.redis_url,
                    admin_key=ADMIN_KEY, secret_key=SECRET_KEY, metrics_token=METRICS_TOKEN,
                    home=str(tmp_path_factory.mktemp("gw-home")), log_level="warning",
                    # Timeout tests need a slow statement; the deny list refuses pg_sleep by default.
                    allow_functions="pg_sleep",
                    # A loaded test machine's Redis is slow, not lost: past the default 250 ms an
                    # in-process app decided locally (a key's 3/minute admitted a 4th call). Tests
                    # of a lost or stalled Redis stop one of their own or name a closed port.
                    redis_timeout_ms=1000)


@pytest.fixture(scope="session")
def superuser(services):
    """``superuser(sql, args=(), db="gateway")``: run SQL as the superuser on the store or
    another database of the session's PostgreSQL; the rows, if any."""
    return services.sql


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


@pytest.fixture
def api(client, services) -> Api:
    return Api.in_process(client, services)


@pytest.fixture(scope="session")
def demo_connection(app, services) -> str:
    """A connection to the demo database shared by tests that do not change it."""
    return Api.in_process(falcon.testing.TestClient(app), services).connection(unique("demo"))


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


@pytest.fixture
def opened_sessions(monkeypatch):
    """Every psycopg2 session opened from here on, as (application name, connection): the real
    driver, counted."""
    seen: list[tuple[str, object]] = []
    real = psycopg2.connect

    def connect(*args, **kwargs):
        conn = real(*args, **kwargs)
        seen.append((kwargs.get("application_name", ""), conn))
        return conn
    monkeypatch.setattr(psycopg2, "connect", connect)
    return seen


# --- a real gunicorn master --------------------------------------------------------------
@pytest.fixture(scope="session")
def gunicorn(services, tmp_path_factory, app) -> Master:
    """``gunicorn -c fleet/server/gunicorn_conf.py`` with 2 workers, on a free port; SIGTERM at the end.

    It shares the store and Redis with the in-process app (``app`` is listed so it is
    closed after this master stops): both belong to one fleet.
    """
    master = Master(services, tmp_path_factory.mktemp("gunicorn-home"), workers=2, instance="",
                    head_timeout_s=2)     # tests/http/test_errors.py waits for a request_timeout
    try:
        yield master.start(60)
    finally:
        master.stop()


@pytest.fixture
def http(gunicorn, services):
    """An ``Api`` talking real HTTP to the gunicorn master."""
    api = Api.over_http(gunicorn.base, services)
    yield api
    api.close()


@pytest.fixture
def http_endpoint(http, demo_connection):
    def make(sql: str, parameters: dict | None = None, **fields):
        fields.setdefault("connection", demo_connection)
        return http.endpoint(sql, parameters, **fields)
    return make
