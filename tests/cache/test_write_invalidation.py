"""Writes through the gateway invalidate every cached read whose answer they can change, however
the two statements name the rows they share (one in-process app that runs writes, real
PostgreSQL and Redis): a partition or an inheritance child and its parent, a schema-qualified
and an unqualified name, quoted identifiers, ``INSERT ... ON CONFLICT``."""
from __future__ import annotations

import threading

import falcon.testing
import pytest

from helpers.api import Api
from helpers.util import unique, wait_until


def writing_app(make_app):
    """An app that runs writes (GATEWAY_ALLOW_WRITES), once its cache bus is connected (a bus
    that connects empties the memory: a hit the test expects would be a miss)."""
    app = make_app(allow_writes=True)
    wait_until(lambda: app.parts.cache._sync.fresh(), 10, what="the cache bus")
    return app


@pytest.fixture
def writer(make_app, services):
    """A writing app's API client."""
    return Api.in_process(falcon.testing.TestClient(writing_app(make_app)), services)


@pytest.fixture
def names(superuser):
    made: list[str] = []

    def make(prefix: str) -> str:
        name = unique(prefix).replace("-", "_")
        made.append(name)
        return name
    yield make
    for name in reversed(made):
        # {name}_moved: a table renamed, with a view named {name} over it (dropped with it).
        superuser(f"DROP TABLE IF EXISTS {name}_moved CASCADE; DROP TABLE IF EXISTS {name} CASCADE", db="demo")


def values(reply) -> list:
    assert reply.status == 200, reply
    return [row["v"] for row in reply.json]


def cached_then_written(api, connection: str, read_sql: str, write_sql: str) -> tuple[list, list, str]:
    """Cache ``read_sql``'s answer, run ``write_sql`` through the gateway (it sets v = 'new'),
    then read again: (the answer before, the answer after, its X-Cache)."""
    read = api.query(read_sql, connection=connection, cache_ttl=600)
    write = api.query(write_sql, connection=connection)
    secret = api.key([read, write], [connection], allow_writes=True)
    before = api.call(read, secret)
    assert api.call(read, secret).headers["X-Cache"] == "hit"
    wrote = api.call(write, secret)
    assert wrote.status == 200 and wrote.headers.get("X-Rows-Affected") == "1", wrote
    after = api.call(read, secret)
    return values(before), values(after), after.headers["X-Cache"]


def test_a_write_to_a_partition_invalidates_a_cached_read_of_its_parent(writer, names, superuser):
    parent, part = names("cache_pp"), names("cache_pc")
    superuser(f"CREATE TABLE {parent} (id int, v text) PARTITION BY LIST (id); "
              f"CREATE TABLE {part} PARTITION OF {parent} FOR VALUES IN (1, 2); "
              f"INSERT INTO {parent} VALUES (1, 'old')", db="demo")
    connection = writer.connection()
    before, after, state = cached_then_written(writer, connection, f"SELECT v FROM {parent} WHERE id = 1",
                                               f"UPDATE {part} SET v = 'new' WHERE id = 1")
    assert before == ["old"] and (after, state) == (["new"], "miss")


def test_a_write_through_a_parent_invalidates_a_cached_read_of_its_partition(writer, names, superuser):
    parent, part = names("cache_pp"), names("cache_pc")
    superuser(f"CREATE TABLE {parent} (id int, v text) PARTITION BY LIST (id); "
              f"CREATE TABLE {part} PARTITION OF {parent} FOR VALUES IN (1, 2); "
              f"INSERT INTO {parent} VALUES (1, 'old')", db="demo")
    connection = writer.connection()
    before, after, state = cached_then_written(writer, connection, f"SELECT v FROM {part} WHERE id = 1",
                                               f"UPDATE {parent} SET v = 'new' WHERE id = 1")
    assert before == ["old"] and (after, state) == (["new"], "miss")


def test_a_write_to_an_inheritance_child_invalidates_a_cached_read_of_its_parent(writer, names, superuser):
    parent, child = names("cache_ip"), names("cache_ic")
    superuser(f"CREATE TABLE {parent} (id int, v text); CREATE TABLE {child} () INHERITS ({parent}); "
              f"INSERT INTO {child} VALUES (1, 'old')", db="demo")
    connection = writer.connection()
    before, after, state = cached_then_written(writer, connection, f"SELECT v FROM {parent} WHERE id = 1",
                                               f"UPDATE {child} SET v = 'new' WHERE id = 1")
    assert before == ["old"] and (after, state) == (["new"], "miss")


def test_a_write_naming_a_table_otherwise_invalidates_what_read_it(writer, names, superuser):
    """Schema-qualified against unqualified and quoted, mixed-case names; ON CONFLICT DO UPDATE."""
    plain, mixed = names("cache_n"), names("Cache_M")
    superuser(f'CREATE TABLE {plain} (id int PRIMARY KEY, v text); INSERT INTO {plain} VALUES (1, \'old\'); '
              f'CREATE TABLE "{mixed}" (id int PRIMARY KEY, v text); INSERT INTO "{mixed}" VALUES (1, \'old\')',
              db="demo")
    connection = writer.connection()
    before, after, state = cached_then_written(writer, connection, f"SELECT v FROM {plain} WHERE id = 1",
                                               f"UPDATE public.{plain} SET v = 'new' WHERE id = 1")
    assert before == ["old"] and (after, state) == (["new"], "miss")
    before, after, state = cached_then_written(writer, connection, f'SELECT v FROM public."{mixed}" WHERE id = 1',
                                               f'INSERT INTO "{mixed}" AS m VALUES (1, \'new\') '
                                               f'ON CONFLICT (id) DO UPDATE SET v = excluded.v')
    assert before == ["old"] and (after, state) == (["new"], "miss")


def test_a_call_after_a_write_never_joins_a_fill_that_read_before_it(writer, names, superuser):
    """Single flight: a call that arrives while another call of the same entry is still reading
    the database waits for that answer. One that arrives after a write (or a purge) was answered
    must not take it when that read began before the write: it may hold the older rows."""
    table = names("cache_sf")
    superuser(f"CREATE TABLE {table} (id int PRIMARY KEY, v text); INSERT INTO {table} VALUES (1, 'old')", db="demo")
    api = writer
    connection = api.connection()
    read = api.query(f"SELECT v, pg_sleep(1.0) AS slept FROM {table} WHERE id = 1", connection=connection,
                     cache_ttl=600)
    write = api.query(f"UPDATE {table} SET v = :v WHERE id = 1", {"v": {"type": "str"}}, connection=connection)
    purge_read = api.query(f"SELECT v FROM {table} WHERE id = 1", connection=connection)
    secret = api.key([read, write, purge_read], [connection], allow_writes=True)
    for step, change in (("write", lambda: api.call(write, secret, {"v": "new"})),
                         ("purge", lambda: api.manage("DELETE", "/cache/entries", params={"query": read}))):
        before = values(api.call(purge_read, secret))[0]
        first: list = []
        leader = threading.Thread(target=lambda into=first: into.append(api.call(read, secret)))
        leader.start()
        # The leader's read has begun: its snapshot is the old rows (or it was answered from the cache).
        wait_until(lambda answered=first: answered or superuser(
            "SELECT 1 FROM pg_stat_activity WHERE wait_event = 'PgSleep'", db="demo"), 10, 0.01, "the leader reading")
        if step == "purge":
            superuser(f"UPDATE {table} SET v = 'newer' WHERE id = 1", db="demo")   # outside the gateway
        changed = change()
        assert changed.status in (200, 204), changed
        late = api.call(read, secret)        # sent after the change was answered, while the leader still reads
        leader.join()
        assert values(first[0]) == [before]
        expected = "new" if step == "write" else "newer"
        assert values(late) == [expected], (step, late.headers.get("X-Cache"))
        assert values(api.call(read, secret)) == [expected], step


def test_a_write_through_another_spelling_of_the_server_invalidates_what_read_it(writer, names, superuser):
    """Two connections to one database, one by name (localhost) and one by address: the gateway
    cannot tell from a host's text that they reach the same server, so it must not assume not."""
    table = names("cache_alias")
    superuser(f"CREATE TABLE {table} (id int PRIMARY KEY, v text); INSERT INTO {table} VALUES (1, 'old')", db="demo")
    api = writer
    by_name, by_address = api.connection(host="localhost"), api.connection(host="127.0.0.1")
    read = api.query(f"SELECT v FROM {table} WHERE id = 1", connection=by_name, cache_ttl=600)
    write = api.query(f"UPDATE {table} SET v = 'new' WHERE id = 1", connection=by_address)
    secret = api.key([read, write], [by_name, by_address], allow_writes=True)
    assert values(api.call(read, secret)) == ["old"]
    assert api.call(read, secret).headers["X-Cache"] == "hit"
    wrote = api.call(write, secret)
    assert wrote.status == 200 and wrote.headers.get("X-Rows-Affected") == "1", wrote
    after = api.call(read, secret)
    assert values(after) == ["new"], after.headers["X-Cache"]


def test_a_write_that_cascades_through_a_foreign_key_invalidates_what_read_the_other_table(writer, names,
                                                                                            superuser):
    """ON DELETE CASCADE / SET NULL (and ON UPDATE ...): PostgreSQL changes the referencing
    table's rows too, though the statement names only the referenced one."""
    customers, orders, notes = names("cache_fk_c"), names("cache_fk_o"), names("cache_fk_n")
    superuser(f"CREATE TABLE {customers} (id int PRIMARY KEY); "
              f"CREATE TABLE {orders} (id int PRIMARY KEY, customer int REFERENCES {customers} ON DELETE CASCADE, "
              f"v text); "
              f"CREATE TABLE {notes} (id int PRIMARY KEY, o int REFERENCES {orders} ON DELETE SET NULL, v text); "
              f"INSERT INTO {customers} VALUES (1), (2); INSERT INTO {orders} VALUES (1, 1, 'old'), (2, 2, 'kept'); "
              f"INSERT INTO {notes} VALUES (1, 1, 'note')", db="demo")
    api = writer
    connection = api.connection()
    read = api.query(f"SELECT v FROM {orders} ORDER BY id", connection=connection, cache_ttl=600)
    chained = api.query(f"SELECT o AS v FROM {notes}", connection=connection, cache_ttl=600)
    delete = api.query(f"DELETE FROM {customers} WHERE id = 1", connection=connection)
    secret = api.key([read, chained, delete], [connection], allow_writes=True)
    assert values(api.call(read, secret)) == ["old", "kept"] and values(api.call(chained, secret)) == [1]
    assert api.call(read, secret).headers["X-Cache"] == "hit"
    wrote = api.call(delete, secret)
    assert wrote.status == 200 and wrote.headers.get("X-Rows-Affected") == "1", wrote
    after = api.call(read, secret)
    assert values(after) == ["kept"], after.headers["X-Cache"]
    assert values(api.call(chained, secret)) == [None]        # two foreign keys away


def test_a_write_invalidates_what_read_a_table_that_has_become_a_view_of_it(writer, names, superuser):
    """A migration replaced the table a cached query reads with a view over its new name: the
    stored analysis still says table, the schema the worker reads says view."""
    table = names("cache_tv")
    superuser(f"CREATE TABLE {table} (id int PRIMARY KEY, v text); INSERT INTO {table} VALUES (1, 'old')", db="demo")
    api = writer
    connection = api.connection()
    read = api.query(f"SELECT v FROM {table} WHERE id = 1", connection=connection, cache_ttl=600)
    secret = api.key([read], [connection])
    assert values(api.call(read, secret)) == ["old"]
    superuser(f"ALTER TABLE {table} RENAME TO {table}_moved; CREATE VIEW {table} AS SELECT * FROM {table}_moved",
              db="demo")
    write = api.query(f"UPDATE {table}_moved SET v = 'new' WHERE id = 1", connection=connection)
    secret = api.key([read, write], [connection], allow_writes=True)
    # Cached again under the schema as it is now, if the worker has read it since (the entry is
    # keyed by what the version's columns are under it: gateway.pipeline.plans.reading).
    assert values(api.call(read, secret)) == ["old"]
    cached = api.call(read, secret)
    assert cached.headers["X-Cache"] == "hit" and values(cached) == ["old"]
    wrote = api.call(write, secret)
    assert wrote.status == 200 and wrote.headers.get("X-Rows-Affected") == "1", wrote
    after = api.call(read, secret)
    assert values(after) == ["new"], after.headers["X-Cache"]


def test_a_write_saved_after_the_worker_read_its_schema_invalidates_by_what_it_does_not_know(
        make_app, services, names, superuser):
    """A worker's copy of the schema (its trees) is read again every 30 s: a partition made since
    is not in it. A write saved after the copy was read may name one; the worker cannot tell
    which parent it belongs to, so it must drop every cached answer of the database."""
    serving_app = writing_app(make_app)
    serving = Api.in_process(falcon.testing.TestClient(serving_app), services)
    managing = Api.in_process(falcon.testing.TestClient(writing_app(make_app)), services)
    parent = names("cache_sp")
    superuser(f"CREATE TABLE {parent} (id int, v text) PARTITION BY LIST (id); "
              f"CREATE TABLE {parent}_1 PARTITION OF {parent} FOR VALUES IN (1); "
              f"INSERT INTO {parent} VALUES (1, 'old')", db="demo")
    connection = managing.connection()
    read = managing.query(f"SELECT v FROM {parent} ORDER BY id", connection=connection, cache_ttl=600)
    secret = managing.key([read], [connection])
    wait_until(lambda: serving.call(read, secret).status == 200, 5, what="the query on the serving app")
    wait_until(lambda: serving.call(read, secret).headers.get("X-Cache") == "hit", 5, what="a hit")
    schemas = serving_app.parts.schemas       # the serving app's schema read behind its first call, done
    identity = next(c for c in serving_app.parts.holder.current().connections.values() if c.name == connection).identity
    wait_until(lambda: identity in schemas._kin and identity not in schemas._loading, 10, 0.02,
               "the serving app's copy of the schema")
    superuser(f"CREATE TABLE {parent}_2 PARTITION OF {parent} FOR VALUES IN (2); "
              f"INSERT INTO {parent} VALUES (2, 'old')", db="demo")
    write = managing.query(f"UPDATE {parent}_2 SET v = 'new' WHERE id = 2", connection=connection)
    secret = managing.key([read, write], [connection], allow_writes=True)
    managing.ok("DELETE", "/cache/entries", params={"query": read})   # the DDL was made outside the gateway
    wait_until(lambda: write in serving_app.parts.holder.current().queries, 5, what="the write on the serving app")
    assert values(serving.call(read, secret)) == ["old", "old"]
    wrote = serving.call(write, secret)
    assert wrote.status == 200 and wrote.headers.get("X-Rows-Affected") == "1", wrote
    after = serving.call(read, secret)
    assert values(after) == ["old", "new"], after.headers["X-Cache"]


def test_a_write_that_fails_or_is_rolled_back_answers_its_error_and_keeps_the_cache(writer, names, superuser):
    table = names("cache_fail")
    superuser(f"CREATE TABLE {table} (id int PRIMARY KEY, v text); "
              f"INSERT INTO {table} VALUES (1, 'old'), (2, 'other')", db="demo")
    api = writer
    connection = api.connection()
    read = api.query(f"SELECT v FROM {table} ORDER BY id", connection=connection, cache_ttl=600)
    duplicate = api.query(f"INSERT INTO {table} VALUES (1, 'new')", connection=connection)
    too_many = api.query(f"UPDATE {table} SET v = 'new'", connection=connection, max_affected_rows=1)
    secret = api.key([read, duplicate, too_many], [connection], allow_writes=True)
    assert values(api.call(read, secret)) == ["old", "other"]
    for name in (duplicate, too_many):
        failed = api.call(name, secret)
        assert 400 <= failed.status < 500 and "X-Cache-Invalidated" not in failed.headers, failed
    adhoc = api.adhoc(secret, {"connection_name": connection, "sql": f"UPDATE {table} SET id = 2 WHERE id = 1"})
    assert 400 <= adhoc.status < 500, adhoc
    kept = api.call(read, secret)
    assert kept.headers["X-Cache"] == "hit" and values(kept) == ["old", "other"]


def test_a_write_that_fires_a_trigger_invalidates_what_read_the_table_it_writes(writer, names, superuser):
    """A trigger (or a rule) on the written table may write any other: the statement names
    neither the function nor that table."""
    audited, log = names("cache_trg"), names("cache_trl")
    superuser(f"CREATE TABLE {log} (id int PRIMARY KEY, v text); INSERT INTO {log} VALUES (1, 'old'); "
              f"CREATE TABLE {audited} (id int PRIMARY KEY, v text); INSERT INTO {audited} VALUES (1, 'old'); "
              f"CREATE FUNCTION {audited}_f() RETURNS trigger LANGUAGE plpgsql AS "
              f"$$BEGIN UPDATE {log} SET v = NEW.v WHERE id = 1; RETURN NEW; END$$; "
              f"CREATE TRIGGER {audited}_t AFTER UPDATE ON {audited} FOR EACH ROW EXECUTE FUNCTION {audited}_f()",
              db="demo")
    try:
        before, after, state = cached_then_written(writer, writer.connection(), f"SELECT v FROM {log} WHERE id = 1",
                                                   f"UPDATE {audited} SET v = 'new' WHERE id = 1")
        assert before == ["old"] and (after, state) == (["new"], "miss")
    finally:
        superuser(f"DROP TABLE {audited}; DROP FUNCTION {audited}_f()", db="demo")
