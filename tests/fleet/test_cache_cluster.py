"""The cache's Redis side on Redis Cluster (three masters, each with a replica,
``helpers.redis_topologies``): the shared tier's scripts (a fill, purges by query, by a write's
tables, by key and of everything, a fill that began before a purge) and the acknowledged purge
bus (sharded pub/sub on the master of ``{fleet}``).

Every key a cache script touches, declared or built inside it, carries the ``{fleet}`` hash tag,
so each script runs on one master; a key in another slot would fail there ("Script attempted to
access a non local key in a cluster node"): so a script that works here keeps its keys together."""
from __future__ import annotations

import time

import pytest
from redis.cluster import key_slot

from fleet.shared import cache as fleet_cache
from fleet.shared.cache import RedisCacheSync, RedisSharedTier
from gateway.cache.entry import Entry, encode_rows, mac_key
from gateway.cache.memory import MemoryCache
from helpers.redis_topologies import Cluster
from helpers.util import wait_until

pytestmark = pytest.mark.slow

DB = "127.0.0.1:5432/demo"
OTHER_DB = "127.0.0.1:5432/other"
SECRET = mac_key("cluster-test-secret")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    topology = Cluster(tmp_path_factory.mktemp("cache-cluster")).start()
    yield topology
    topology.stop()


def entry(digest: str, query: str, tables=("public.t",), db: str = DB, wildcard: bool = False,
          ttl: float = 60.0, value: int = 1) -> Entry:
    rows = [(1, value)]
    now, mono = time.time(), time.monotonic()
    return Entry(digest, query, 1, db, frozenset(tables), wildcard, ("id", "v"), rows, 1, now, now + ttl, mono + ttl,
                 encode_rows(("id", "v"), rows, 1))


def fill(tier: RedisSharedTier, made: Entry) -> None:
    """A worker's miss: ask the tier (the token), then store its answer with that token."""
    found, token = tier.get(made.digest)
    assert found is None and token is not None
    tier.put(made, token)
    assert tier.errors == 0, "the put script failed on the cluster (a key outside its slot?)"


def test_every_key_of_the_cache_scripts_shares_one_slot():
    p = fleet_cache.PREFIX
    keys = [fleet_cache.GEN, fleet_cache.INDEXES, fleet_cache.SEQ, fleet_cache.ACKS, fleet_cache.ALIVE,
            fleet_cache.CHANNEL, p + "e:abc", p + "q:account", p + "d:" + DB, p + "w:" + DB,
            p + "t:" + DB + "|public.t"]
    assert len({key_slot(k.encode()) for k in keys}) == 1, {k: key_slot(k.encode()) for k in keys}


def test_shared_tier_fills_and_purges_on_a_cluster(cluster):
    one, two = RedisSharedTier(cluster.url, SECRET), RedisSharedTier(cluster.url, SECRET)
    made = {
        "a": entry("a" * 64, "qa", tables=("public.t",)),
        "b": entry("b" * 64, "qb", tables=("public.u",)),
        "view": entry("c" * 64, "qc", tables=(), wildcard=True),           # read through a view: any write to DB
        "other": entry("d" * 64, "qd", tables=("public.u",), db=OTHER_DB),
        "key": entry("e" * 64, "qe", tables=("public.v",)),
    }
    for e in made.values():
        fill(one, e)
    # The other worker finds every entry, sealed and whole.
    for e in made.values():
        found, _ = two.get(e.digest)
        assert found is not None and found.rows == [(1, 1)] and found.query == e.query, e.query
    # ... all of them (and their indexes) on the one master of {fleet}
    master = cluster.master_of(fleet_cache.GEN).client()
    assert all(master.exists(fleet_cache.PREFIX + "e:" + e.digest) for e in made.values())
    assert master.scard(fleet_cache.INDEXES) >= 5

    def present() -> set[str]:
        return {name for name, e in made.items() if two.get(e.digest)[0] is not None}

    two.purge({"op": "query", "name": "qa"})
    assert present() == {"b", "view", "other", "key"}
    # A write to public.u on DB: the entry that read it and the one that read through a view; not OTHER_DB's.
    two.purge({"op": "tables", "db": DB, "tables": ["public.u"]})
    assert present() == {"other", "key"}
    two.purge({"op": "key", "key": made["key"].digest})
    assert present() == {"other"}

    # A fill that began before a purge is not stored after it.
    late = entry("f" * 64, "qf")
    found, token = one.get(late.digest)
    assert found is None
    two.purge({"op": "db", "db": OTHER_DB})
    one.put(late, token)
    assert one.get(late.digest)[0] is None and present() == set()

    fill(one, late)
    assert one.get(late.digest)[0] is not None
    two.purge({"op": "all"})
    assert one.get(late.digest)[0] is None
    assert master.scard(fleet_cache.INDEXES) == 0
    assert one.errors == 0 and two.errors == 0


def test_purge_bus_reaches_every_worker_on_a_cluster(cluster):
    tier = RedisSharedTier(cluster.url, SECRET)
    workers = [RedisCacheSync(cluster.url, lease_ms=1000, ping_ms=100, sync_timeout_ms=3000, shared=tier)
               for _ in range(2)]
    memories = [MemoryCache(1 << 20) for _ in workers]
    purger = RedisCacheSync(cluster.url, lease_ms=1000, ping_ms=100, sync_timeout_ms=3000)
    try:
        for sync, memory in zip(workers, memories, strict=True):
            sync.start(memory)
        wait_until(lambda: all(s.connected and s.fresh() for s in workers), 15, what="both workers on the bus")
        for memory in memories:
            for e in (entry("1" * 64, "q1"), entry("2" * 64, "q2", tables=("public.u",))):
                assert memory.put(e, memory.mark(e.query, e.db))

        answer = purger.announce({"op": "query", "name": "q1"})
        assert answer.get("workers", 0) >= 2 and answer["pending"] == [], answer
        # acknowledged means applied: q1 is gone from both memories at once, q2 stays
        assert [(m.get("1" * 64), m.get("2" * 64) is not None) for m in memories] == [(None, True)] * 2
        assert all(s.applied == 1 for s in workers)

        answer = purger.announce({"op": "tables", "db": DB, "tables": ["public.u"]})
        assert answer["pending"] == [] and all(len(m) == 0 for m in memories), answer
        # The bus's keys and channel were served by the master of {fleet}: its acks are there.
        master = cluster.master_of(fleet_cache.ACKS).client()
        acks = master.hgetall(fleet_cache.ACKS)
        assert len(acks) >= 2 and all(int(v) >= 2 for v in acks.values()), acks
    finally:
        for sync in workers + [purger]:
            sync.close()
