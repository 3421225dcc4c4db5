"""Real PostgreSQL and Redis for tests, started through the product's own code path
(``fleet.local``), so test setup and the embedded default cannot drift apart.

From a conftest::

    from services import start_postgres, start_redis

    @pytest.fixture(scope="session")
    def pg(tmp_path_factory):
        server = start_postgres(tmp_path_factory.mktemp("svc"), 54419)
        yield server
        server.stop()
"""
from __future__ import annotations

from pathlib import Path

from fleet.local import LocalPostgres, LocalRedis


def start_postgres(home: Path | str, port: int) -> LocalPostgres:
    """A running local PostgreSQL under ``home`` on 127.0.0.1:``port`` (``.url(db)``)."""
    server = LocalPostgres(home, port)
    server.start()
    return server


def start_redis(home: Path | str, port: int) -> LocalRedis:
    """A running password-protected Redis under ``home`` on 127.0.0.1:``port`` (``.url()``)."""
    server = LocalRedis(home, port)
    server.start()
    return server
