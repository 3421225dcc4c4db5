"""The cache's fixtures shared by its modules that run a real gunicorn master."""
from __future__ import annotations

import pytest

from helpers.api import Api
from helpers.masters import Master

WORKERS = 4   # the master's workers (test_fleet_cache, test_fleet_cache_attacks)


@pytest.fixture(scope="module")
def master(services, tmp_path_factory, app):
    """A master of WORKERS workers with the Redis purge bus and the shared tier, writes allowed:
    one per module that uses it."""
    fleet = Master(services, tmp_path_factory.mktemp("cache-master"), workers=WORKERS, cache_shared="on",
                   allow_writes="on")
    try:
        yield fleet.start(90)
    finally:
        fleet.stop()


@pytest.fixture
def fleet_api(master, services):
    api = Api.over_http(master.base, services)
    yield api
    api.close()
