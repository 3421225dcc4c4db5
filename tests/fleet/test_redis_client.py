"""``GATEWAY_REDIS_URL``'s three forms, read by ``fleet.shared.redis_client.RedisTarget`` (the
clients themselves are tested against real servers: test_redis_cluster.py,
test_redis_sentinel.py), and a URL of no known form refused at start-up."""
from __future__ import annotations

import pytest

from fleet.shared.redis_client import RedisTarget
from gateway.settings import Settings


def test_one_server():
    target = RedisTarget.parse("redis://:pw@127.0.0.1:6379/2")
    assert (target.mode, target.nodes) == ("single", ())


def test_cluster_seeds_and_password():
    target = RedisTarget.parse("redis+cluster://:p%40ss@10.0.0.1:7000,10.0.0.2:7001,[::1]:7002")
    assert target.mode == "cluster"
    assert target.nodes == (("10.0.0.1", 7000), ("10.0.0.2", 7001), ("::1", 7002))
    assert (target.username, target.password, target.db) == (None, "p@ss", 0)


def test_sentinel_master_db_and_sentinel_password():
    target = RedisTarget.parse("redis+sentinel://app:pw@s1:26379,s2:26380/gw/3?sentinel_password=sp")
    assert target.mode == "sentinel"
    assert target.nodes == (("s1", 26379), ("s2", 26380))
    assert (target.username, target.password, target.master, target.db, target.sentinel_password) == \
        ("app", "pw", "gw", 3, "sp")


@pytest.mark.parametrize("url", ["redis+sentinel://s1:26379", "redis+cluster://", "redis+cluster://h:1/2",
                                 "memcached://h:1"])
def test_malformed_urls_are_refused(url):
    with pytest.raises(ValueError):
        RedisTarget.parse(url)


def test_settings_refuse_an_unknown_scheme():
    with pytest.raises(SystemExit, match="GATEWAY_REDIS_URL"):
        Settings(redis_url="http://127.0.0.1:6379")
    assert Settings(redis_url="redis+cluster://127.0.0.1:7000").redis_url
