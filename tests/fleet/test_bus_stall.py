"""A management change that Redis does not take at first, while every worker's heartbeats keep
getting through (here: the changing process may not PUBLISH for a second; a stall or failover
seen by one client and not the others does the same): the workers' leases never run out, so
the change must still reach them (fleet/shared/bus.py ``announce`` publishes again until Redis takes
it), not merely be waited out. Two in-process apps on a PostgreSQL and Redis of this module's
own: one serving, one changing the catalog as a Redis user of its own."""
from __future__ import annotations

import threading
import time
from urllib.parse import urlsplit, urlunsplit

import falcon.testing
import pytest

from fleet.app import create_app
from gateway.settings import Settings
from helpers.api import Api
from helpers.util import ADMIN_KEY, SECRET_KEY, wait_until

pytestmark = pytest.mark.slow

USER, PASSWORD = "changer", "changer-password-0123"


def _as_user(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{USER}:{PASSWORD}@{parts.hostname}:{parts.port}"))


@pytest.fixture
def pair(private_services, tmp_path):
    """(serving app, its API, the changing app's API, a Redis client to change the user's rights)."""
    admin = private_services.redis_client()
    admin.acl_setuser(USER, enabled=True, passwords=[f"+{PASSWORD}"], keys=["*"], channels=["*"],
                      commands=["+@all"])
    made = [create_app(Settings(
        database_url=private_services.store_url, redis_url=url, admin_key=ADMIN_KEY, secret_key=SECRET_KEY,
        home=str(tmp_path / name), log_level="error", freshness_lease_ms=6000, bus_ping_ms=500,
        # The default: a change returns once every worker acknowledged it, or after this. At 1 s a
        # loaded machine's serving worker acknowledged later than that, and served the key after.
        sync_timeout_ms=2000)) for name, url in (("serving", private_services.redis_url),
                                                 ("changing", _as_user(private_services.redis_url)))]
    for app in made:
        wait_until(lambda a=app: a.parts.holder.fresh() is not None, 10, what="the catalog bus")
    yield made[0], *(Api.in_process(falcon.testing.TestClient(a), private_services) for a in made), admin
    for app in made:
        app.parts.close()
    admin.acl_deluser(USER)
    admin.close()


def test_a_key_revoked_while_redis_refuses_the_publish_is_refused_when_the_call_returns(pair, private_services):
    serving, serving_api, changing_api, admin = pair
    connection = changing_api.connection(password=private_services.pg.password())
    query = changing_api.query("SELECT 1 AS one", connection=connection)
    name, secret = changing_api.named_key([query], [connection])
    wait_until(lambda: serving_api.call(query, secret).status == 200, 5, what="the key on the serving app")
    admin.acl_setuser(USER, enabled=True, commands=["-publish", "-spublish"])
    allowed = threading.Timer(1.0, lambda: admin.acl_setuser(USER, enabled=True, commands=["+publish", "+spublish"]))
    allowed.start()
    try:
        started = time.monotonic()
        revoked = changing_api.manage("PATCH", f"/api-keys/{name}", {"active": False})
        took = time.monotonic() - started
    finally:
        allowed.join()
    assert revoked.status == 200, revoked
    assert serving.parts.holder.fresh() is not None     # the serving worker never stopped trusting its catalog
    after = serving_api.call(query, secret)
    assert after.status == 401, (after, f"the change took {took:.1f} s")
    assert took < 4.0                                   # published once allowed (1 s), not waited out (6.5 s)
