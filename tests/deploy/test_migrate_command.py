"""``fleet migrate`` (fleet/ops/migrate.py), the command deploy/kubernetes' migration Job runs, against
a real PostgreSQL: it brings an empty store to this release's schema and exits, runs again
without change, says so when the store is newer than the release (and applies nothing), and
fails with the reason when there is no store to reach, never starting the embedded default."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gateway.store.schema import MIGRATIONS
from helpers.util import unique

# Runs the fleet CLI against a real PostgreSQL: the integration tier.
pytestmark = pytest.mark.integration


def fleet_migrate(url: str, *args: str, home: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update({"GATEWAY_DATABASE_URL": url, "GATEWAY_HOME": home})
    return subprocess.run([sys.executable, "-m", "fleet.ops.cli", "migrate", *args], env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def empty_store(services):
    name = unique("migrate").lower()
    services.sql(f"CREATE DATABASE {name}", db="postgres")
    try:
        yield name
    finally:
        services.sql(f"DROP DATABASE {name} WITH (FORCE)", db="postgres")


def test_an_empty_store_is_migrated_once(services, empty_store, tmp_path):
    url = services.pg.url(empty_store)
    first = fleet_migrate(url, home=str(tmp_path))
    assert first.returncode == 0, first.stderr
    assert f"store schema at version {len(MIGRATIONS)} (this release's newest)" in first.stdout
    assert services.sql("SELECT max(version), count(*) FROM gw_schema_version", db=empty_store) == [
        (len(MIGRATIONS), len(MIGRATIONS))]
    again = fleet_migrate(url, home=str(tmp_path))
    assert again.returncode == 0 and again.stdout == first.stdout
    assert services.sql("SELECT count(*) FROM gw_schema_version", db=empty_store) == [(len(MIGRATIONS),)]
    assert not (tmp_path / "pg").exists() and not any(tmp_path.iterdir()), "it started something under its home"


def test_a_newer_store_is_left_as_it_is(services, empty_store, tmp_path):
    url = services.pg.url(empty_store)
    assert fleet_migrate(url, home=str(tmp_path)).returncode == 0
    newer = len(MIGRATIONS) + 1     # what a later release's job left
    services.sql("INSERT INTO gw_schema_version (version) VALUES (%s)", (newer,), db=empty_store)
    out = fleet_migrate(url, home=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert f"store schema at version {newer}, newer than this release's {len(MIGRATIONS)}: nothing applied" in out.stdout
    assert services.sql("SELECT max(version) FROM gw_schema_version", db=empty_store) == [(newer,)]


def test_no_store_is_a_clear_failure(tmp_path):
    out = fleet_migrate("postgresql://gateway:x@127.0.0.1:1/gateway", "--wait", "0.5", home=str(tmp_path))
    assert out.returncode != 0
    assert "fleet migrate: the store does not accept connections after 0.5 s" in out.stderr
    unset = fleet_migrate("", home=str(tmp_path))
    assert unset.returncode != 0 and "GATEWAY_DATABASE_URL is not set" in unset.stderr
    assert not any(tmp_path.iterdir()), "it started the embedded default"
