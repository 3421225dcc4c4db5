"""A change costs what it changed: a worker applies the rows the store's change log lists
since its generation (``gateway.model.catalog.refresh``) to a copy of its snapshot, and reads
the whole catalog only when that gap is unknown (a new worker, a pruned log, a store behind
the worker, a generation nobody logged).

Each test watches a ``CatalogHolder`` of its own on the session's store (the real one a worker
runs) while the in-process app makes changes through the Management API, and compares what
the holder built with a full load of the same generation.
"""
from __future__ import annotations

import gc
import random
import threading

import psycopg2
import pytest

from gateway.model import catalog as catalog_mod
from gateway.model.state import CatalogHolder
from helpers.util import unique


@pytest.fixture
def holder(services):
    h = CatalogHolder(lambda: psycopg2.connect(services.store_url))
    h.reload()
    yield h
    h.close()


def store_generation(superuser) -> int:
    return superuser("SELECT generation FROM gw_catalog_state")[0][0]


def full_load(services) -> catalog_mod.Catalog:
    conn = psycopg2.connect(services.store_url)
    conn.autocommit = True
    try:
        return catalog_mod.load(conn)
    finally:
        conn.close()


def shape(catalog: catalog_mod.Catalog) -> dict:
    """Everything a call reads from a snapshot, as plain values; and checks the snapshot's
    own indexes agree with it (a version holds the snapshot's connection object)."""
    # A key rotated within its grace period is also indexed by its previous secret's prefix.
    assert catalog.key_ids == {k.id: k.prefix for k in catalog.keys.values()}
    assert all(p in (k.prefix, k.previous_prefix) for p, k in catalog.keys.items())
    assert catalog.query_ids == {q.id: n for n, q in catalog.queries.items()}
    assert catalog.connection_ids == {c.id: c for c in catalog.connections.values()}
    for query in catalog.queries.values():
        for version in query.versions.values():
            assert version.connection is catalog.connection_ids[version.connection.id], (query.name, version.version)
        assert query.published is None or query.published is query.versions[query.published.version]
    return {
        "generation": catalog.generation,
        "keys": {p: (k.id, k.name, k.digest, k.queries, k.connections, k.active, k.expires_at, repr(k.grants))
                 for p, k in catalog.keys.items()},
        "connections": {n: (*c.identity, c.active) for n, c in catalog.connections.items()},
        "queries": {n: (q.id, q.published.version if q.published else None,
                        {v: (qv.connection.id, qv.sql, qv.published_at, qv.prepare_sql, qv.execute_sql)
                         for v, qv in q.versions.items()})
                    for n, q in catalog.queries.items()},
    }


def refresh(holder: CatalogHolder, superuser) -> str:
    holder.reload(at_least=store_generation(superuser))
    return holder.last.how


def test_each_kind_of_change_applies_incrementally(api, holder, services, superuser):
    full = holder.full_loads
    connection = api.connection()
    assert refresh(holder, superuser) == "changes"
    query = api.query("SELECT 1 AS v", connection=connection)
    api.ok("POST", f"/queries/{query}/versions",
           {"connection_name": connection, "sql": "SELECT 2 AS v", "parameters": {}, "publish": False})
    name, secret = api.named_key([query], [connection])
    other_name, _ = api.named_key([query], [connection])
    assert refresh(holder, superuser) == "changes"
    # Four changes (a query, its version, two keys): their rows, not the catalog's.
    assert holder.last.changes == 4 and holder.last.rows <= 1 + 4 + 4, holder.last.rows
    before = holder.catalog
    api.ok("POST", f"/queries/{query}/publish", {"version": 2})
    assert refresh(holder, superuser) == "changes"
    after = holder.catalog
    assert after.queries[query].published.version == 2
    assert before.queries[query].published.version == 1          # the old snapshot is untouched
    # What a change left alone is the same object: a publish changes neither keys nor
    # connections, and keeps version 1 as it was (version 2 is rebuilt: its published_at moved).
    assert after.keys is before.keys and after.connections is before.connections
    assert after.plans is before.plans
    assert after.queries[query].versions[1] is before.queries[query].versions[1]
    assert shape(holder.catalog) == shape(full_load(services))

    prefix = secret.split("_")[1]
    kid = holder.catalog.keys[prefix].id
    holder.catalog.plans.setdefault(kid, {})["memo"] = "kept until the key changes"
    other = next(k for k in holder.catalog.keys.values() if k.name == other_name)
    holder.catalog.plans.setdefault(other.id, {})["memo"] = "kept"
    api.ok("PATCH", f"/api-keys/{name}", {"active": False})
    assert refresh(holder, superuser) == "changes"
    assert holder.catalog.keys[prefix].active is False
    assert kid not in holder.catalog.plans and holder.catalog.plans[other.id] == {"memo": "kept"}
    rotated = api.ok("POST", f"/api-keys/{name}/rotate", {"grace_minutes": 0}).json["secret"]
    assert refresh(holder, superuser) == "changes"
    assert prefix not in holder.catalog.keys and holder.catalog.keys[rotated.split("_")[1]].id == kid
    # With a grace period, the previous secret's prefix finds the key too, until its next change.
    again = api.ok("POST", f"/api-keys/{name}/rotate", {"grace_minutes": 5}).json["secret"]
    assert refresh(holder, superuser) == "changes"
    assert holder.catalog.keys[again.split("_")[1]] is holder.catalog.keys[rotated.split("_")[1]]

    # A changed connection: every version on it now holds the new one, nothing read again.
    api.ok("PATCH", f"/connections/{connection}", {"active": False})
    assert refresh(holder, superuser) == "changes"
    assert holder.last.rows <= 3, holder.last.rows
    versions = holder.catalog.queries[query].versions
    assert all(v.connection.active is False for v in versions.values())
    assert shape(holder.catalog) == shape(full_load(services))

    api.ok("DELETE", f"/api-keys/{name}")
    api.ok("DELETE", f"/queries/{query}")
    assert refresh(holder, superuser) == "changes"
    assert query not in holder.catalog.queries and kid not in holder.catalog.key_ids
    assert shape(holder.catalog) == shape(full_load(services))
    assert holder.full_loads == full, "no change needed a full load"


@pytest.mark.parametrize("gap", ["pruned", "unlogged", "behind", "new"])
def test_an_unknown_gap_loads_everything(api, holder, services, superuser, gap):
    connection = api.connection()
    query = api.query("SELECT 1 AS v", connection=connection)
    name = unique("key")
    api.named_key([query], [connection], name=name)
    if gap == "pruned":          # the log no longer reaches back to this worker's generation
        superuser("DELETE FROM gw_catalog_changes WHERE generation <= %s", (store_generation(superuser),))
        superuser("UPDATE gw_catalog_state SET log_from = generation")
    elif gap == "unlogged":      # a generation bumped by a release that logs nothing
        superuser("UPDATE gw_catalog_state SET generation = generation + 1")
    elif gap == "behind":        # the store went back (restored): the worker is ahead of it
        holder.catalog.generation = store_generation(superuser) + 1000
    else:
        holder.catalog = catalog_mod.Catalog.empty()
    full = holder.full_loads
    gc.unfreeze()
    holder.reload()
    assert holder.last.how == "full" and holder.full_loads == full + 1
    # The loaded catalog is out of the cyclic collector's reach (no full pass walks it again).
    assert gc.get_freeze_count() > len(holder.catalog.keys)
    assert shape(holder.catalog) == shape(full_load(services))
    assert name in {k.name for k in holder.catalog.keys.values()}
    # And the next change applies incrementally again.
    api.ok("PATCH", f"/api-keys/{name}", {"queries": []})
    assert refresh(holder, superuser) == "changes"
    assert shape(holder.catalog) == shape(full_load(services))


def test_racing_changes_end_consistent_with_the_store(api, app, holder, services, superuser):
    """Changes of every kind from several threads at once, while a watcher refreshes at
    random moments: every snapshot it builds is the store at its generation, and the end
    state is the store's."""
    connection = api.connection()
    queries = [api.query("SELECT 1 AS v", connection=connection) for _ in range(3)]
    for q in queries:
        api.ok("POST", f"/queries/{q}/versions",
               {"connection_name": connection, "sql": "SELECT 2 AS v", "parameters": {}, "publish": False})
    keys = [api.named_key(queries, [connection])[0] for _ in range(4)]
    errors: list = []
    stop = threading.Event()

    def changer(seed: int) -> None:
        rng = random.Random(seed)
        mine = [unique("race")]
        try:
            for i in range(25):
                pick = rng.random()
                if pick < 0.25:
                    api.ok("POST", f"/queries/{rng.choice(queries)}/publish", {"version": rng.choice((1, 2))})
                elif pick < 0.45:
                    api.ok("PATCH", f"/api-keys/{rng.choice(keys)}", {"queries": rng.sample(queries, 2)})
                elif pick < 0.55:
                    # With a grace period (the key indexed by two prefixes); a rotation still pending
                    # is ended instead.
                    key = rng.choice(keys)
                    got = api.manage("POST", f"/api-keys/{key}/rotate", {"grace_minutes": 5})
                    if got.status == 409:
                        assert got.json["code"] == "key_rotation_pending", got
                        ended = api.manage("DELETE", f"/api-keys/{key}/previous")
                        assert ended.status in (200, 404), ended
                    else:
                        assert got.status == 200, got
                elif pick < 0.75:
                    name = unique("race")
                    api.named_key(queries, [connection], name=name)
                    mine.append(name)
                elif pick < 0.9 and len(mine) > 1:
                    api.ok("DELETE", f"/api-keys/{mine.pop(rng.randrange(1, len(mine)))}")
                else:
                    api.ok("PATCH", f"/connections/{connection}", {"options": {"n": i}})
        except BaseException as exc:   # noqa: BLE001 - reported below
            errors.append(exc)

    snapshots = []

    def watcher() -> None:
        rng = random.Random(7)
        while not stop.is_set():
            holder.reload()
            snapshots.append(holder.catalog)
            stop.wait(rng.random() * 0.02)

    threads = [threading.Thread(target=changer, args=(s,)) for s in range(4)]
    watching = threading.Thread(target=watcher)
    watching.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    stop.set()
    watching.join(10)
    assert not errors, errors[:3]
    full = holder.full_loads
    holder.reload()
    assert holder.full_loads == full
    assert shape(holder.catalog) == shape(full_load(services))
    assert len({s.generation for s in snapshots}) > 5, "the watcher saw the changes one by one"
    # The session app (its own bus thread) ends at the store's state as well.
    app.parts.holder.reload()
    assert shape(app.parts.holder.catalog) == shape(full_load(services))
    # Changes from one call to another stayed within each snapshot's generation.
    generations = [s.generation for s in snapshots]
    assert generations == sorted(generations)


def test_a_change_logs_audits_and_prunes_at_its_generation(api, holder, services, superuser, monkeypatch):
    """``store.commit_change``: one statement bumps the generation, logs the changed object and
    writes the audit entry, all at that generation; every ``_PRUNE_EVERY`` generations the log
    forgets what is older than ``CHANGE_LOG_KEEP`` (and says so in ``log_from``), and a worker
    that far behind loads everything."""
    from gateway.control import changes as changes_mod
    from gateway.store import statements
    monkeypatch.setattr(changes_mod, "CHANGE_LOG_KEEP", 3)
    connection = api.connection()
    query = api.query("SELECT 1 AS v", connection=connection)
    name = unique("key")
    api.named_key([query], [connection], name=name)
    (kid,) = superuser("SELECT id FROM gw_api_keys WHERE name = %s", (name,))[0]
    generation = store_generation(superuser)
    assert superuser("SELECT kind, id FROM gw_catalog_changes WHERE generation = %s", (generation,)) == [("key", kid)]
    assert superuser("SELECT action, kind, name FROM gw_audit WHERE generation = %s",
                     (generation,)) == [("create", "key", name)]
    behind = holder.catalog.generation
    # Changes until a generation a multiple of _PRUNE_EVERY has passed: the log was pruned then.
    for i in range(statements._PRUNE_EVERY + 1):
        api.ok("PATCH", f"/api-keys/{name}", {"queries": [] if i % 2 else [query]})
    now = store_generation(superuser)
    pruned_at = now - now % statements._PRUNE_EVERY
    assert pruned_at > behind + 3
    (log_from,) = superuser("SELECT log_from FROM gw_catalog_state")[0]
    assert log_from == pruned_at - 3
    assert superuser("SELECT min(generation) FROM gw_catalog_changes")[0][0] == pruned_at - 2
    # One log row and one audit entry for every generation since.
    assert superuser("SELECT count(*), count(DISTINCT generation) FROM gw_catalog_changes")[0] == (
        now - log_from, now - log_from)
    assert superuser("SELECT count(*) FROM gw_audit WHERE generation > %s", (behind,))[0][0] == now - behind
    holder.reload()
    assert holder.last.how == "full"   # it was behind what the log still holds
    assert shape(holder.catalog) == shape(full_load(services))
