"""The fixtures of every test: one real PostgreSQL and one real Redis for the whole session
(started through ``fleet.ops.local``, see ``helpers/services.py``), an in-process gateway app on
them, and a real gunicorn master for the end-to-end tests. What is not a fixture lives in
``helpers/``.

Every test makes its own connections, queries and keys with a unique suffix, so tests never
depend on each other's objects; the gateway processes a test starts (gunicorn masters,
``fleet up``) join the session's store and Redis with the session's keys.

Servers and their ports (fixed, so that two suites on one machine can be told apart;
each overridable from the environment). The PostgreSQL ports lie below Linux's ephemeral range
(32768-60999): a port in it can be the local end of some client's connection at the moment a
server starts, and two suites side by side here met "Address already in use" that way; the
Redis ports are above it:

- ``GATEWAY_TEST_PG_PORT`` (25439), ``GATEWAY_TEST_REDIS_PORT`` (63839): the session's pair
  (``services``), the store in database ``gateway``, the demo tables in ``demo``;
- ``GATEWAY_TEST_PRIVATE_PG_PORT`` (25459), ``GATEWAY_TEST_PRIVATE_REDIS_PORT`` (63859): the
  pair of a module's own (``private_services``), for fault tests that stop or restart a
  server (Redis restarted under load) so that nothing else sees the outage. The former
  names ``GATEWAY_TEST_FLEET_PG_PORT`` / ``GATEWAY_TEST_FLEET_REDIS_PORT`` are read too;
- ``GATEWAY_TEST_CORPUS_PG_PORT`` (25469): the hostile-input corpus's own PostgreSQL
  (``governance/test_governance_corpus.py``: hostile SQL runs there as the superuser);
- ``GATEWAY_TEST_LOCAL_PG_PORT`` (25419), ``GATEWAY_TEST_LOCAL_REDIS_PORT`` (63819): the
  embedded default's servers (``fleet/test_local.py`` tests ``fleet.ops.local`` itself).
"""
from __future__ import annotations

import falcon.testing
import psycopg2
import pytest

from fleet.app import create_app
from gateway.settings import Settings
from helpers.api import Api
from helpers.masters import Master
from helpers.services import PG_PORT, PRIVATE_PG_PORT, PRIVATE_REDIS_PORT, REDIS_PORT, start_services
from helpers.util import ADMIN_KEY, METRICS_TOKEN, PASSWORD_ENV, SECRET_KEY, unique


# --- servers ---------------------------------------------------------------------------
@pytest.fixture(scope="session")
def services(tmp_path_factory):
    """The session's PostgreSQL + Redis (``helpers.services.Services``)."""
    servers = start_services(tmp_path_factory.mktemp("svc"), PG_PORT, REDIS_PORT, demo=True)
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
    servers = start_services(tmp_path_factory.mktemp("private-svc"), PRIVATE_PG_PORT, PRIVATE_REDIS_PORT)
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
                    allow_functions="pg_sleep")


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
