"""The embedded default, for real: a local PostgreSQL and Redis started by fleet.ops.local."""
from __future__ import annotations

import json
import socket
import stat
import subprocess
import sys

import psycopg2
import pytest
import redis

from fleet.ops.local import LocalPostgres, LocalRedis, ensure_embedded, stop_embedded
from gateway.settings import Settings
from helpers.services import port_for, start_postgres, start_redis

# Its own PostgreSQL and Redis (the embedded default), started in its fixtures and by ensure_embedded.
pytestmark = pytest.mark.integration

# The embedded default's own servers: free ports, taken when the module is collected (its tests
# pass them to Settings and to processes of their own).
PG_PORT, REDIS_PORT = port_for("local_pg"), port_for("local_redis")


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("fleet-home")


@pytest.fixture(scope="module")
def settings(home):
    return Settings(home=str(home), pg_port=PG_PORT, redis_port=REDIS_PORT)


@pytest.fixture(scope="module", autouse=True)
def _stop_at_end(settings, home):
    yield
    stop_embedded(settings)
    assert not LocalPostgres(home, PG_PORT).is_running()
    assert not LocalRedis(home, REDIS_PORT).is_running()


@pytest.fixture(scope="module")
def pg(home):
    return start_postgres(home, PG_PORT)


@pytest.fixture(scope="module")
def rd(home):
    return start_redis(home, REDIS_PORT)


def test_concurrent_first_start(settings):
    """Two processes bootstrapping the same empty home at once: one initdb, same answers."""
    code = ("import json, sys; from fleet.ops.local import ensure_embedded; "
            "from gateway.settings import Settings; "
            "print(json.dumps(ensure_embedded(Settings(**json.loads(sys.argv[1])))))")
    arg = json.dumps({"home": settings.home, "pg_port": PG_PORT, "redis_port": REDIS_PORT})
    procs = [subprocess.Popen([sys.executable, "-c", code, arg], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [proc.communicate(timeout=60) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    first, second = (json.loads(out) for out, _ in outputs)
    assert first == second
    assert _select_one(first["GATEWAY_DATABASE_URL"]) == 1


def _select_one(url: str) -> int:
    conn = psycopg2.connect(url, connect_timeout=5)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
            return cur.fetchone()[0]
    finally:
        conn.close()


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_postgres_answers(pg, home):
    assert pg.is_running()
    assert _select_one(pg.url("postgres")) == 1
    assert pg.url("x").startswith(f"postgresql://postgres:{pg.password()}@127.0.0.1:{PG_PORT}/")
    assert _mode(home / "pg_password") == 0o600


def test_postgres_refuses_wrong_password(pg):
    with pytest.raises(psycopg2.OperationalError):
        psycopg2.connect(f"postgresql://postgres:wrong@127.0.0.1:{PG_PORT}/postgres",
                         connect_timeout=5)


def test_postgres_settings(pg):
    conn = psycopg2.connect(pg.url(), connect_timeout=5)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT current_setting('max_connections'), "
                        "current_setting('listen_addresses'), current_setting('fsync')")
            assert cur.fetchone() == ("300", "127.0.0.1", "on")
    finally:
        conn.close()


def test_postgres_start_twice_is_harmless(pg):
    pid = pg._pid()
    LocalPostgres(pg.home, PG_PORT).start()
    assert pg._pid() == pid
    assert _select_one(pg.url()) == 1


def test_ensure_database_is_idempotent(pg):
    pg.ensure_database("scratch")
    pg.ensure_database("scratch")
    assert _select_one(pg.url("scratch")) == 1


def test_redis_answers_with_password(rd, home):
    client = redis.Redis.from_url(rd.url(), socket_timeout=2)
    assert client.ping() is True
    client.close()
    assert _mode(home / "redis_password") == 0o600
    assert _mode(home / "redis.conf") == 0o600


def test_redis_refuses_unauthenticated(rd):
    # A raw socket: redis-py would retry the refused command with backoff (seconds).
    with socket.create_connection(("127.0.0.1", REDIS_PORT), timeout=2) as conn:
        conn.sendall(b"PING\r\n")
        assert conn.recv(200).startswith(b"-NOAUTH")
        conn.sendall(b"AUTH default wrong\r\n")
        assert conn.recv(200).startswith(b"-WRONGPASS")


def test_redis_start_twice_is_harmless(rd):
    pid = rd._pid()
    LocalRedis(rd.home, REDIS_PORT).start()
    assert rd._pid() == pid


def test_ensure_embedded(pg, rd, settings, home):
    env = ensure_embedded(settings)
    assert set(env) == {"GATEWAY_DATABASE_URL", "GATEWAY_REDIS_URL",
                        "GATEWAY_ADMIN_KEY", "GATEWAY_SECRET_KEY", "GATEWAY_METRICS_TOKEN"}
    assert env["GATEWAY_DATABASE_URL"].endswith("/gateway")
    assert _select_one(env["GATEWAY_DATABASE_URL"]) == 1
    assert redis.Redis.from_url(env["GATEWAY_REDIS_URL"]).ping() is True
    for name in ("admin_key", "secret_key", "metrics_token"):
        assert _mode(home / name) == 0o600
        assert len(env[f"GATEWAY_{name.upper()}"]) >= 40

    again = ensure_embedded(settings)
    assert again == env  # secrets are generated once, then stable


def test_ensure_embedded_leaves_configured_values_alone(pg, rd, settings):
    configured = Settings(home=settings.home, pg_port=PG_PORT, redis_port=REDIS_PORT,
                          database_url="postgresql://elsewhere/db", redis_url="redis://elsewhere",
                          admin_key="a", secret_key="s", metrics_token="m")
    assert ensure_embedded(configured) == {}


def test_only_the_superuser_may_connect_to_the_store_and_maintenance_databases(pg, rd, settings):
    """The embedded default takes back PUBLIC's CONNECT and TEMPORARY on ``gateway`` and
    ``postgres``: a login role (the demo roles are ones) can open a session on neither."""
    ensure_embedded(settings)
    role = "h_login_" + socket.gethostname().replace("-", "_")[:8].lower()
    with psycopg2.connect(pg.url("postgres")) as conn, conn.cursor() as cur:
        cur.execute(f"DROP ROLE IF EXISTS {role}")
        cur.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw-{role}'")
    try:
        for db in ("gateway", "postgres"):
            with pytest.raises(psycopg2.OperationalError, match="permission denied for database"):
                psycopg2.connect(host="127.0.0.1", port=PG_PORT, user=role, password=f"pw-{role}", dbname=db,
                                 connect_timeout=5).close()
        assert _select_one(pg.url("gateway")) == 1     # the superuser still does
    finally:
        with psycopg2.connect(pg.url("postgres")) as conn, conn.cursor() as cur:
            cur.execute(f"DROP ROLE {role}")


def test_concurrent_closing_to_public_never_fails(pg):
    """``close_to_public`` from several processes at once (two masters starting on one empty
    home: ``test_concurrent_first_start`` failed once in CI with PostgreSQL's "tuple
    concurrently updated" on the REVOKE): serialised, every caller succeeds."""
    import threading

    pg.ensure_database("gateway")
    errors: list[BaseException] = []

    def close() -> None:
        try:
            for _ in range(15):
                pg.close_to_public("gateway", "postgres")
        except BaseException as exc:     # noqa: BLE001  # the assertion below shows it
            errors.append(exc)
    threads = [threading.Thread(target=close) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors[:2]
