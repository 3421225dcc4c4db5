"""The demo connections' roles (fleet/ops/local/demo.py): ``demo_reader`` (``create_demo_reader``) may
connect to the demo database and SELECT the demo tables, nothing else; ``demo_writer``
(``create_demo_writer``), the role of the load tests' write connection, may run the deposit
(``UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid``) and nothing
else: ``SELECT (aid, abalance), UPDATE (abalance) ON pgbench_accounts``. The gateway's
governance is defence in depth; these roles are the last wall, so every refusal here is the
database's own, whatever the gateway lets through.

The roles are made on a demo database of its own (the session's ``demo`` stays as the other
tests use it); roles are cluster-wide, and no other test uses ``demo_reader`` or ``demo_writer``.
"""
from __future__ import annotations

import falcon.testing
import psycopg2
import psycopg2.errors
import pytest

from fleet.ops import local
from fleet.ops.local.demo import (
    READER,
    WRITER,
    create_demo_data,
    create_demo_reader,
    create_demo_writer,
    demo_tables,
    reader_grants,
    writer_grants,
)
from fleet.ops.local.seed import update_login
from gateway.ports import LocalSync
from gateway.settings import Settings
from helpers.util import unique
from loadtests.scenarios.provision import DEPOSIT_SQL, queries

PASSWORD = "reader-" + unique("pw")
WRITER_PASSWORD = "writer-" + unique("pw")
PASSWORDS = {READER: PASSWORD, WRITER: WRITER_PASSWORD}
ROLES = [READER, WRITER]
PORT_OF: dict[str, int] = {}   # demo database -> the port of its server (the session's PostgreSQL)


@pytest.fixture(scope="module")
def demo_db(services, superuser):
    """A fresh demo database with the demo roles made on it; its name."""
    name = unique("demo_role")
    services.pg.ensure_database(name)
    create_demo_data(services.pg.url(name))
    create_demo_reader(services.pg.url(name), PASSWORD)
    create_demo_writer(services.pg.url(name), WRITER_PASSWORD)
    PORT_OF[name] = services.pg.port
    return name


def reader_url(db: str, password: str = PASSWORD, role: str = READER) -> str:
    return f"postgresql://{role}:{password}@127.0.0.1:{PORT_OF[db]}/{db}"


def as_role(db: str, statement: str, role: str = READER, args=None):
    """Run one statement as a demo role (autocommit: CREATE DATABASE needs it); its rows, or
    the count of rows it affected when it returns none."""
    conn = psycopg2.connect(reader_url(db, PASSWORDS[role], role), connect_timeout=5)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(statement, args)
            return cur.fetchall() if cur.description else cur.rowcount
    finally:
        conn.close()


def as_reader(db: str, statement: str):
    return as_role(db, statement, READER)


def as_writer(db: str, statement: str, args=None):
    return as_role(db, statement, WRITER, args)


def test_reads_every_demo_table(demo_db):
    counts = {t: as_reader(demo_db, f"SELECT count(*) FROM {t}")[0][0] for t in demo_tables()}
    assert counts == {"pgbench_branches": 10, "pgbench_accounts": 1_000_000,
                      "customers": 1_000, "orders": 5_000}
    assert as_reader(demo_db, "SELECT abalance FROM pgbench_accounts WHERE aid = 42") == [(0,)]


@pytest.mark.parametrize("role", ROLES)
def test_role_is_a_plain_login(demo_db, superuser, role):
    (row,) = superuser("SELECT rolsuper, rolcreatedb, rolcreaterole, rolreplication, rolbypassrls, "
                       "rolcanlogin, rolpassword LIKE 'SCRAM-SHA-256$%%' FROM pg_authid WHERE rolname = %s",
                       (role,))
    assert row == (False, False, False, False, False, True, True)
    assert superuser("SELECT 1 FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member "
                     "WHERE r.rolname = %s", (role,)) == []


# Each must fail with 42501 (insufficient_privilege): refused by the database itself.
REFUSED = {
    "pg_authid": "SELECT rolname, rolpassword FROM pg_authid",
    "pg_read_file": "SELECT pg_read_file('PG_VERSION')",
    "pg_read_binary_file": "SELECT pg_read_binary_file('/etc/passwd')",
    "pg_ls_dir": "SELECT pg_ls_dir('.')",
    "copy_to_file": "COPY customers TO '/tmp/gw_demo_reader_copy'",
    "copy_to_program": "COPY (SELECT 1) TO PROGRAM 'true'",
    "insert": "INSERT INTO customers (id, name, email, country, plan, created_at) "
              "VALUES (-1, 'x', 'x@example.com', 'DE', 'free', now())",
    "update": "UPDATE orders SET status = 'paid' WHERE id = 1",
    "delete": "DELETE FROM pgbench_accounts WHERE aid = 1",
    "truncate": "TRUNCATE pgbench_branches",
    "select_for_update": "SELECT * FROM customers WHERE id = 1 FOR UPDATE",
    "create_table": "CREATE TABLE public.gw_reader_made (i int)",
    "create_temp_table": "CREATE TEMP TABLE gw_reader_temp (i int)",
    "create_schema": "CREATE SCHEMA gw_reader_schema",
    "create_function": "CREATE FUNCTION public.gw_reader_f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    "create_database": "CREATE DATABASE gw_reader_db",
    "create_role": "CREATE ROLE gw_reader_role",
    "alter_table": "ALTER TABLE customers ADD COLUMN note text",
    "drop_table": "DROP TABLE orders",
    "alter_own_role": "ALTER ROLE {role} SUPERUSER",
    "set_role": "SET ROLE postgres",
}


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("statement", REFUSED.values(), ids=REFUSED.keys())
def test_refused(demo_db, statement, role):
    with pytest.raises(psycopg2.errors.InsufficientPrivilege):
        as_role(demo_db, statement.replace("{role}", role), role)


@pytest.mark.parametrize("role", ROLES)
def test_a_table_not_granted_stays_unreadable(demo_db, superuser, role):
    """Only the demo tables are granted, by name: a table made later (also in a new schema)
    is not readable, though the role may read the catalog's description of it."""
    table = unique("secrets")
    superuser(f"CREATE TABLE public.{table} AS SELECT 'top secret'::text AS s", db=demo_db)
    superuser(f"CREATE SCHEMA {table}; CREATE TABLE {table}.t AS SELECT 1 AS i", db=demo_db)
    for name in (f"public.{table}", f"{table}.t"):
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            as_role(demo_db, f"SELECT * FROM {name}", role)


def test_only_the_demo_role_may_connect(demo_db, superuser):
    """PUBLIC's default CONNECT is revoked: another login role cannot open a session."""
    other = unique("other")
    superuser(f"CREATE ROLE {other} LOGIN PASSWORD 'x-{other}'")
    with pytest.raises(psycopg2.OperationalError, match="permission denied for database"):
        psycopg2.connect(reader_url(demo_db, f"x-{other}", other), connect_timeout=5).close()


def test_remaking_resets_password_and_attributes(services, demo_db, superuser):
    superuser(f"ALTER ROLE {READER} CREATEDB")
    create_demo_reader(services.pg.url(demo_db), "another-" + PASSWORD)
    try:
        with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
            psycopg2.connect(reader_url(demo_db), connect_timeout=5).close()
        assert superuser("SELECT rolcreatedb FROM pg_roles WHERE rolname = %s", (READER,)) == [(False,)]
        psycopg2.connect(reader_url(demo_db, "another-" + PASSWORD), connect_timeout=5).close()
    finally:
        create_demo_reader(services.pg.url(demo_db), PASSWORD)
    assert as_reader(demo_db, "SELECT count(*) FROM customers") == [(1_000,)]


def test_grants_name_the_demo_tables():
    """The text compose/initdb/30-demo-grants.sql is generated from (tests/fleet/test_compose.py
    checks the file is current) names the demo tables: not ALL TABLES, no default privileges."""
    grants = reader_grants()
    assert "GRANT SELECT ON pgbench_branches, pgbench_accounts, customers, orders TO demo_reader;" in grants
    assert "ALL TABLES" not in grants and "DEFAULT PRIVILEGES" not in grants


# --- demo_writer: the deposit and nothing else ----------------------------------------------
def privileges(superuser, db: str, role: str) -> set[tuple]:
    """Every privilege granted to ``role`` on a relation of ``db``, or on one of its columns:
    (relation, column or None, privilege)."""
    rows = superuser(
        "SELECT c.relname, NULL, a.privilege_type FROM pg_class c, aclexplode(c.relacl) a "
        " WHERE a.grantee = %(role)s::regrole "
        "UNION ALL "
        "SELECT c.relname, att.attname::text, a.privilege_type "
        "  FROM pg_attribute att JOIN pg_class c ON c.oid = att.attrelid, aclexplode(att.attacl) a "
        " WHERE a.grantee = %(role)s::regrole", {"role": role}, db=db)
    return set(rows)


DEPOSIT_PRIVILEGES = {("pgbench_accounts", "aid", "SELECT"), ("pgbench_accounts", "abalance", "SELECT"),
                      ("pgbench_accounts", "abalance", "UPDATE")}


def test_writer_has_exactly_the_deposit_columns(demo_db, superuser):
    """No table-wide privilege at all: SELECT on aid and abalance (the UPDATE reads both),
    UPDATE on abalance; on the database CONNECT only, on schema public USAGE only."""
    assert privileges(superuser, demo_db, WRITER) == DEPOSIT_PRIVILEGES
    (row,) = superuser("SELECT has_database_privilege(%(r)s, current_database(), 'CONNECT'), "
                       "has_database_privilege(%(r)s, current_database(), 'CREATE'), "
                       "has_database_privilege(%(r)s, current_database(), 'TEMPORARY'), "
                       "has_schema_privilege(%(r)s, 'public', 'USAGE'), "
                       "has_schema_privilege(%(r)s, 'public', 'CREATE')", {"r": WRITER}, db=demo_db)
    assert row == (True, False, False, True, False)


def test_writer_runs_the_deposit(demo_db, superuser):
    """The load tests' deposit, with its parameters bound as the gateway binds them
    (PREPARE/EXECUTE), changes one account's balance; the writer may read it back."""
    assert DEPOSIT_SQL == "UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid"
    statement = DEPOSIT_SQL.replace(":delta", "$1").replace(":aid", "$2")
    changed = "SELECT count(*) FROM pgbench_accounts WHERE abalance <> 0"
    (before,), = superuser(changed, db=demo_db)
    conn = psycopg2.connect(reader_url(demo_db, WRITER_PASSWORD, WRITER), connect_timeout=5)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(f"PREPARE deposit (int, int) AS {statement}")
            cur.execute("EXECUTE deposit (5, 77)")
            assert cur.rowcount == 1
            cur.execute("EXECUTE deposit (4, 77)")
    finally:
        conn.close()
    assert as_writer(demo_db, "UPDATE pgbench_accounts SET abalance = abalance + %s WHERE aid = %s",
                     (1, 78)) == 1
    assert superuser("SELECT aid, abalance FROM pgbench_accounts WHERE aid IN (77, 78) ORDER BY aid",
                     db=demo_db) == [(77, 9), (78, 1)]
    assert as_writer(demo_db, "SELECT aid, abalance FROM pgbench_accounts WHERE aid = 77") == [(77, 9)]
    # No other account changed.
    assert superuser(changed, db=demo_db) == [(before + 2,)]


# Each must fail with 42501 (insufficient_privilege): only the deposit's columns are granted.
WRITER_REFUSED = {
    # no INSERT, no DELETE, no TRUNCATE
    "insert": "INSERT INTO pgbench_accounts (aid, bid, abalance, filler) VALUES (-1, 1, 0, '')",
    "insert_granted_columns": "INSERT INTO pgbench_accounts (aid, abalance) VALUES (-1, 0)",
    "upsert": "INSERT INTO pgbench_accounts (aid, abalance) VALUES (1, 0) "
              "ON CONFLICT (aid) DO UPDATE SET abalance = excluded.abalance",
    "delete": "DELETE FROM pgbench_accounts WHERE aid = 1",
    "truncate": "TRUNCATE pgbench_accounts",
    # no other column of pgbench_accounts: not set, not read in WHERE or RETURNING
    "update_bid": "UPDATE pgbench_accounts SET bid = 2 WHERE aid = 1",
    "update_filler": "UPDATE pgbench_accounts SET filler = 'x' WHERE aid = 1",
    "update_aid": "UPDATE pgbench_accounts SET aid = -aid WHERE aid = 1",
    "update_where_bid": "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE bid = 1",
    "update_returning_bid": "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = 1 RETURNING bid",
    "update_returning_star": "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = 1 RETURNING *",
    "update_from_branches": "UPDATE pgbench_accounts a SET abalance = b.bbalance FROM pgbench_branches b "
                            "WHERE b.bid = 1 AND a.aid = 1",
    # no other table, written
    "update_branches": "UPDATE pgbench_branches SET bbalance = bbalance + 1 WHERE bid = 1",
    "update_customers": "UPDATE customers SET plan = 'enterprise' WHERE id = 1",
    "update_orders": "UPDATE orders SET status = 'paid' WHERE id = 1",
    "insert_orders": "INSERT INTO orders (id, customer_id, amount, status, ordered_at) "
                     "VALUES (-1, 1, 1, 'paid', now())",
    "delete_customers": "DELETE FROM customers WHERE id = 1",
    # ... or read
    "select_star": "SELECT * FROM pgbench_accounts WHERE aid = 1",
    "select_bid": "SELECT aid, bid FROM pgbench_accounts WHERE aid = 1",
    "select_filler": "SELECT filler FROM pgbench_accounts WHERE aid = 1",
    "select_branches": "SELECT bid FROM pgbench_branches",
    "select_customers": "SELECT id, email FROM customers",
    "count_orders": "SELECT count(*) FROM orders",
    "join": "SELECT a.aid, b.bid FROM pgbench_accounts a JOIN pgbench_branches b ON b.bid = 1 WHERE a.aid = 1",
    # no lock on the whole table, no index, no change to it
    "lock_table": "BEGIN; LOCK TABLE pgbench_accounts IN ACCESS EXCLUSIVE MODE; COMMIT",
    "create_index": "CREATE INDEX ON pgbench_accounts (abalance)",
    "alter_table": "ALTER TABLE pgbench_accounts ADD COLUMN note text",
    "grant_on": "GRANT SELECT ON pgbench_accounts TO demo_reader",
}


@pytest.mark.parametrize("statement", WRITER_REFUSED.values(), ids=WRITER_REFUSED.keys())
def test_writer_refused(demo_db, statement):
    with pytest.raises(psycopg2.errors.InsufficientPrivilege):
        as_writer(demo_db, statement)


def test_remaking_the_writer_takes_back_what_was_granted_by_hand(services, demo_db, superuser):
    superuser(f"ALTER ROLE {WRITER} CREATEDB", db=demo_db)
    superuser(f"GRANT UPDATE (bid), DELETE ON pgbench_accounts TO {WRITER}; "
              f"GRANT SELECT ON customers TO {WRITER}; GRANT INSERT ON orders TO {WRITER}", db=demo_db)
    assert as_writer(demo_db, "SELECT count(*) FROM customers") == [(1_000,)]
    assert privileges(superuser, demo_db, WRITER) > DEPOSIT_PRIVILEGES
    create_demo_writer(services.pg.url(demo_db), WRITER_PASSWORD)
    assert privileges(superuser, demo_db, WRITER) == DEPOSIT_PRIVILEGES
    assert superuser("SELECT rolcreatedb FROM pg_roles WHERE rolname = %s", (WRITER,)) == [(False,)]
    with pytest.raises(psycopg2.errors.InsufficientPrivilege):
        as_writer(demo_db, "SELECT count(*) FROM customers")
    # ... and leaves the reader's grants alone.
    assert privileges(superuser, demo_db, READER) == {(t, None, "SELECT") for t in demo_tables()}


def test_writer_grants_name_the_deposit_columns_only():
    """The text compose/initdb/30-demo-grants.sql is generated from."""
    grants = writer_grants()
    table_grants = [line for line in grants.splitlines() if line.startswith("GRANT") and " ON " in line
                    and " DATABASE " not in line and " SCHEMA " not in line]
    assert table_grants == ["GRANT SELECT (aid, abalance), UPDATE (abalance) ON pgbench_accounts TO demo_writer;"]
    assert "ALL TABLES" not in grants and "DEFAULT PRIVILEGES" not in grants


def test_through_the_gateway_the_writer_runs_the_deposit_only(api, demo_db, make_app, superuser):
    """The load tests' deposit (its saved SQL and parameters) on a demo_writer connection, with
    a key and a server that allow writes: one row changed. Any other statement on that
    connection is refused by the database."""
    connection = api.connection(database=demo_db, user=WRITER, password=WRITER_PASSWORD)
    deposit = queries(write_connection=connection)["deposit"]
    assert deposit["sql"] == DEPOSIT_SQL and deposit["connection_name"] == connection
    ok = api.query(DEPOSIT_SQL, deposit["parameters"], connection=connection)
    other = api.query("UPDATE pgbench_accounts SET bid = bid WHERE aid = :aid",
                      {"aid": {"type": "int", "required": True}}, connection=connection)
    read = api.query("SELECT aid, bid FROM pgbench_accounts WHERE aid = :aid",
                     {"aid": {"type": "int", "required": True}}, connection=connection)
    key = api.key([ok, other, read], [connection], allow_writes=True)
    client = falcon.testing.TestClient(make_app(sync=LocalSync(), allow_writes=True))
    done = client.simulate_post(f"/q/{ok}", json={"params": {"aid": 79, "delta": 3}}, headers={"X-API-Key": key})
    assert done.status_code == 200, done.text
    assert done.headers["X-Rows-Affected"] == "1"
    assert superuser("SELECT abalance FROM pgbench_accounts WHERE aid = 79", db=demo_db) == [(3,)]
    for name in (other, read):
        refused = client.simulate_post(f"/q/{name}", json={"params": {"aid": 79}}, headers={"X-API-Key": key})
        assert refused.status_code == 400, refused.text
        assert (refused.json["code"], refused.json["sqlstate"]) == ("query_failed", "42501")


def test_through_the_gateway_the_role_is_the_last_wall(api, demo_db, make_app, superuser):
    """A key granted writes, on a server that allows them: the analysis lets the UPDATE
    through, the database refuses it, nothing changes."""
    connection = api.connection(database=demo_db, user=READER, password=PASSWORD)
    read = api.endpoint("SELECT id, plan FROM customers WHERE id = :id",
                        {"id": {"type": "int", "required": True}}, connection=connection)
    got = api.call(read.query, read.secret, {"id": "7"})
    assert got.status == 200 and got.json == [{"id": 7, "plan": "free"}], got
    write = api.endpoint("UPDATE customers SET plan = 'enterprise' WHERE id = :id",
                         {"id": {"type": "int", "required": True}}, connection=connection)
    writer = api.key([write.query], [connection], allow_writes=True)
    client = falcon.testing.TestClient(make_app(sync=LocalSync(), allow_writes=True))
    refused = client.simulate_post(f"/q/{write.query}", json={"params": {"id": 7}},
                                   headers={"X-API-Key": writer})
    assert refused.status_code == 400, refused.text
    assert (refused.json["code"], refused.json["sqlstate"]) == ("query_failed", "42501")
    assert superuser("SELECT plan FROM customers WHERE id = 7", db=demo_db) == [("free",)]


# --- the embedded runner's side: the password file and the saved connection's login ------------
@pytest.mark.parametrize("password, file", [(local.demo_reader_password, "pg_demo_password"),
                                            (local.demo_writer_password, "pg_demo_writer_password")])
def test_password_is_generated_once_and_private(tmp_path, password, file):
    settings = Settings(home=str(tmp_path))
    first, fresh = password(settings)
    assert fresh and len(first) >= 32
    assert (tmp_path / file).stat().st_mode & 0o777 == 0o600
    assert password(settings) == (first, False)
    (tmp_path / file).unlink()
    second, fresh = password(settings)
    assert fresh and second != first


def test_each_role_has_its_own_password(tmp_path):
    settings = Settings(home=str(tmp_path))
    assert local.demo_reader_password(settings)[0] != local.demo_writer_password(settings)[0]


class FakeApi:
    """Answers GET /connections/<name> with ``saved`` (None: 404) and records PATCHes."""

    def __init__(self, saved: dict | None, name: str = "demo"):
        self.saved, self.patches, self.name = saved, [], name

    def call(self, method, path, body=None, key=None):
        assert path == f"/api/v1/connections/{self.name}"
        if method == "GET":
            return (200, self.saved) if self.saved else (404, {"code": "connection_not_found"})
        self.patches.append(body)
        return 200, {**self.saved, **body}


LOGIN = {"host": "127.0.0.1", "port": 5432, "database": "demo", "user": READER, "password": "p"}


@pytest.mark.parametrize("saved_user, force, patched", [
    ("postgres", False, True),     # seeded by an older `fleet up` as the superuser: moved off it
    (READER, False, False),        # already the reader: left alone (no change, no audit entry)
    (READER, True, True),          # the password file was regenerated: the new password is saved
])
def test_update_login(saved_user, force, patched):
    api = FakeApi({"name": "demo", "user": saved_user})
    update_login(api, LOGIN, force=force)
    assert api.patches == ([LOGIN] if patched else [])


def test_update_login_without_a_saved_connection():
    api = FakeApi(None)
    update_login(api, LOGIN, force=True)
    assert api.patches == []


def test_update_login_of_the_writer_connection():
    api = FakeApi({"name": "demo_writer", "user": "postgres"}, name="demo_writer")
    writer = {**LOGIN, "user": WRITER}
    update_login(api, writer, name="demo_writer")
    assert api.patches == [writer]


def test_fleet_up_seeds_the_demo_connections_with_the_demo_roles(services, demo_db, superuser, monkeypatch,
                                                                    tmp_path):
    """What `fleet up` saves as the demo connections (``fleet.ops.cli._seed_embedded``, on the
    embedded PostgreSQL: here the session's, the passwords this module's): the logins of
    ``demo_reader`` and ``demo_writer``, never the superuser's, and the saved login can read
    the demo tables and nothing else."""
    from fleet.ops import cli

    saved: dict = {}
    monkeypatch.setattr(cli.local, "demo_database_url", lambda settings: services.pg.url(demo_db))
    monkeypatch.setattr(cli.local, "demo_reader_password", lambda settings: (PASSWORD, False))
    monkeypatch.setattr(cli.local, "demo_writer_password", lambda settings: (WRITER_PASSWORD, False))
    monkeypatch.setattr(cli, "update_login", lambda api, login, force=False, name="demo":
                        saved.setdefault("update", []).append((name, login["user"])))
    monkeypatch.setattr(cli, "seed", lambda api, login, key_file, writer=None:
                        saved.update(demo=login, writer=writer) or "secret")
    settings = Settings(home=str(tmp_path), pg_port=services.pg.port, admin_key="a")
    assert cli._seed_embedded(settings, "http://127.0.0.1:1", tmp_path) == "secret"
    assert saved["demo"]["user"] == READER and saved["writer"]["user"] == WRITER
    assert sorted(saved["update"]) == [("demo", READER), ("demo_writer", WRITER)]
    for login in (saved["demo"], saved["writer"]):
        url = f"postgresql://{login['user']}:{login['password']}@127.0.0.1:{services.pg.port}/{demo_db}"
        with psycopg2.connect(url, connect_timeout=5) as conn, conn.cursor() as cur:
            cur.execute("SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = current_user")
            assert cur.fetchone() == (False, False, False)
    table = unique("not_demo")
    superuser(f"CREATE TABLE public.{table} AS SELECT 1 AS i", db=demo_db)
    with pytest.raises(psycopg2.errors.InsufficientPrivilege):
        as_role(demo_db, f"SELECT * FROM public.{table}", saved["demo"]["user"])
    assert as_role(demo_db, "SELECT count(*) FROM customers", saved["demo"]["user"]) == [(1000,)]
