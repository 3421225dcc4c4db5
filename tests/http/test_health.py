"""/health (liveness, no I/O) and /ready (store and Redis reachable)."""
from __future__ import annotations

from helpers.ports import free_port


def test_health(api):
    got = api.request("GET", "/health")
    assert got.status == 200 and got.json == {"status": "ok"}
    assert got.headers["Content-Type"] == "application/json"


def test_ready(api):
    got = api.request("GET", "/ready")
    assert got.status == 200, got
    assert got.json == {"status": "ready", "checks": {"store": True, "redis": True}}


def test_not_ready_without_redis(make_app):
    import falcon.testing

    client = falcon.testing.TestClient(make_app(redis_url=f"redis://127.0.0.1:{free_port()}/0"))
    got = client.simulate_get("/ready")
    assert got.status_code == 503
    assert got.json == {"status": "not_ready", "checks": {"store": True, "redis": False}}
    assert client.simulate_get("/health").status_code == 200  # alive all the same
