"""The limits block's envoy reference (loadtests/peers/fixed_window.py) against the session's real Redis: fixed
windows per descriptor, one pipeline per call, the near-cache of counters over their limit, the client address
counted with the key, fail-open; and the gateway run with it (loadtests/peers/envoy_app.py), in process."""
from __future__ import annotations

import dataclasses
import itertools
import random
import time

import falcon.testing

from gateway.errors import GatewayError
from gateway.model.catalog import ApiKey
from helpers.api import Api
from loadtests.peers import envoy_app
from loadtests.peers.fixed_window import Descriptor, FixedWindowAdmission, cache_key

_ids = itertools.count(random.randrange(10**6, 10**8))


def key(**grants) -> ApiKey:
    key_id = next(_ids)
    return ApiKey({"id": key_id, "name": f"k{key_id}", "prefix": "", "secret_hash": b"", "expires_at": None,
                   "grants": grants})


class Wall:
    """A settable wall clock (the windows are aligned to it)."""

    def __init__(self):
        self.now = 1_900_000_000.25 + next(_ids) * 100   # a window no other test shares

    def __call__(self) -> float:
        return self.now


def admission(settings, wall, rate_limit="", **kw) -> FixedWindowAdmission:
    return FixedWindowAdmission(settings.redis_url, dataclasses.replace(settings, rate_limit=rate_limit),
                                wall=wall, **kw)


def commands(client) -> dict:
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in client.info("commandstats").items()}


def admitted(adm: FixedWindowAdmission, k: ApiKey, calls: int, ip: str | None = None) -> list[str]:
    """Each call's outcome: 'ok' or the refusal's code."""
    out = []
    for _ in range(calls):
        try:
            if ip is not None:
                adm.admit_ip(ip)
            adm.admit_key(k)
            out.append("ok")
        except GatewayError as refusal:
            out.append(refusal.code)
    return out


def test_a_key_gets_its_limit_per_fixed_window_and_no_burst(settings, rdb):
    wall = Wall()
    adm = admission(settings, wall)
    k = key(rate_limit="5/second", rate_limit_burst=50)      # envoy has no burst: 5 a window
    try:
        assert admitted(adm, k, 7) == ["ok"] * 5 + ["rate_limited"] * 2
        wall.now += 1.0                                       # the next window: a new counter
        assert admitted(adm, k, 6) == ["ok"] * 5 + ["rate_limited"]
        window = cache_key(Descriptor("api_key", str(k.id), 5, 1, "key"), int(wall.now))
        assert window == f"gateway_api_key_{k.id}_{int(wall.now)}"
        assert int(rdb.get(window)) == 6             # the refused call was counted too (envoy's rule)
        assert 0 < rdb.ttl(window) <= 1              # EXPIRE unit seconds
    finally:
        adm.close()


def test_one_pipeline_per_call_with_an_incrby_and_an_expire_per_descriptor(settings, rdb):
    wall = Wall()
    adm = admission(settings, wall, rate_limit="1000/minute")
    k = key(rate_limit="100/second", quota={"calls": 1000, "per": "day"})
    try:
        before = commands(rdb)
        assert admitted(adm, k, 10, ip="10.9.8.7") == ["ok"] * 10
        after = commands(rdb)
        # three descriptors (the address, the key, its quota), each INCRBY + EXPIRE, in 10 round trips
        assert after.get("incrby", 0) - before.get("incrby", 0) == 30
        assert after.get("expire", 0) - before.get("expire", 0) == 30
        assert adm.round_trips == 10
        day = int(wall.now) // 86400 * 86400
        assert int(rdb.get(f"gateway_quota_{k.id}_{day}")) == 10
        assert int(rdb.get(f"gateway_remote_address_10.9.8.7_{int(wall.now) // 60 * 60}")) == 10
    finally:
        adm.close()


def test_the_near_cache_answers_a_counter_over_its_limit_without_redis(settings, rdb):
    wall = Wall()
    adm = admission(settings, wall)
    k = key(rate_limit="3/second")
    try:
        assert admitted(adm, k, 4) == ["ok"] * 3 + ["rate_limited"]
        trips = adm.round_trips
        assert admitted(adm, k, 20) == ["rate_limited"] * 20     # held over for the rest of the window
        assert adm.round_trips == trips
        wall.now += 1.0      # a new window names a new counter: Redis is asked again
        assert admitted(adm, k, 3) == ["ok"] * 3 and adm.round_trips == trips + 3
    finally:
        adm.close()
    # without the near-cache every call is a round trip
    plain = admission(settings, Wall(), near_cache=False)
    try:
        assert admitted(plain, k, 10) == ["ok"] * 3 + ["rate_limited"] * 7 and plain.round_trips == 10
    finally:
        plain.close()


def test_the_client_address_is_counted_with_the_key_and_refused_there(settings, rdb):
    wall = Wall()
    adm = admission(settings, wall, rate_limit="2/minute")
    k = key(rate_limit="100/second")
    try:
        assert admitted(adm, k, 3, ip="10.1.2.3") == ["ok", "ok", "rate_limited"]
        assert adm.round_trips == 3                      # one pipeline per call for both descriptors
        # an address whose call never reached admit_key is counted alone by the next admit_ip
        adm.admit_ip("10.4.5.6")
        adm.admit_ip("10.7.8.9")
        minute = int(wall.now) // 60 * 60
        assert int(rdb.get(f"gateway_remote_address_10.4.5.6_{minute}")) == 1
        assert adm.round_trips == 4
    finally:
        adm.close()


def test_a_calls_quota_is_a_day_window_and_refused_as_a_quota(settings):
    wall = Wall()
    adm = admission(settings, wall)
    k = key(quota={"calls": 3, "per": "day"})
    try:
        assert admitted(adm, k, 5) == ["ok"] * 3 + ["quota_exceeded"] * 2
        assert adm.usage([k])[0]["calls_used"] == 4    # the near-cache kept the last one from Redis
    finally:
        adm.close()


def test_redis_unreachable_fails_open(settings):
    closed = dataclasses.replace(settings, redis_timeout_ms=200)
    adm = FixedWindowAdmission("redis://127.0.0.1:1/0", closed, wall=Wall())
    try:
        assert admitted(adm, key(rate_limit="1/second"), 3) == ["ok"] * 3
        assert adm.fallbacks == 3 and adm.round_trips == 0
    finally:
        adm.close()


def test_the_gateway_runs_with_it_through_the_harness_factory(settings, services, rdb):
    app = envoy_app.create_app(dataclasses.replace(settings, rate_limit="1000/minute", trust_proxy=1))
    try:
        api = Api.in_process(falcon.testing.TestClient(app), services)
        connection = api.connection()
        query = api.query("SELECT 1 AS one", connection=connection)
        secret = api.key([query], [connection], rate_limit="3/second")
        for _ in range(5):      # six calls inside one wall second (else try again in the next)
            while time.time() % 1 > 0.3:
                time.sleep(0.05)
            second = int(time.time())
            statuses = [api.call(query, secret, headers={"X-Forwarded-For": "10.3.3.3"}).status for _ in range(6)]
            if int(time.time()) == second:
                break
        assert statuses == [200] * 3 + [429] * 3, statuses
        assert rdb.get(f"gateway_remote_address_10.3.3.3_{second // 60 * 60}") is not None
    finally:
        app.parts.close()
