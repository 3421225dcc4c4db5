"""Demo data for a fresh install: pgbench-style tables and a small customers/orders shop.

``create_demo_data(dsn)`` is idempotent: each table group is built in one transaction
(created, filled, indexed, committed together), so a group that exists is complete and is
skipped. An advisory lock serialises concurrent callers.

* ``pgbench_accounts`` (1,000,000 rows) and ``pgbench_branches`` (10 rows): the layout of
  ``pgbench -i -s 10`` (without tellers/history), for load tests of point lookups.
* ``customers`` (1,000 rows) and ``orders`` (5,000 rows): deterministic, friendlier
  data for examples and tutorials.

``create_demo_reader(dsn, password)`` makes the login role the demo connection uses,
``demo_reader``: it may connect to the demo database and SELECT the tables above, nothing
else. The gateway's governance is defence in depth; the role is the last wall, so a bug or a
granted ad-hoc statement can never do more than read these tables.

``create_demo_writer(dsn, password)`` makes ``demo_writer``, the role of the second demo
connection (``demo_writer``), the one the load tests' write, ``deposit``
(``UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid``), runs on:
it may read ``aid`` and ``abalance`` of ``pgbench_accounts`` (the UPDATE reads both) and
change ``abalance``, nothing else: no INSERT, no DELETE, no other column, no other table.

compose/initdb/30-demo-grants.sql is generated from the same grants (compose/gen_initdb.py).
"""
from __future__ import annotations

import psycopg2
from psycopg2 import sql
from psycopg2.extensions import encrypt_password

__all__ = ["create_demo_data", "create_demo_reader", "create_demo_writer", "demo_tables",
           "reader_grants", "writer_grants", "ACCOUNTS", "BRANCHES", "CUSTOMERS", "ORDERS", "READER",
           "WRITER"]

ACCOUNTS = 1_000_000
BRANCHES = 10
CUSTOMERS = 1_000
ORDERS = 5_000
_LOCK_KEY = 0x6677_0001  # pg_advisory_xact_lock key for "building demo data"
_ROLE_LOCK_KEY = 0x6677_0002  # ... for "making the demo role" (CREATE ROLE is not idempotent)
READER = "demo_reader"  # the demo connection's login (compose/initdb/10-roles.sql makes it too)
WRITER = "demo_writer"  # the demo_writer connection's login (10-roles.sql makes it too)

_PGBENCH = f"""
CREATE TABLE pgbench_branches (bid integer NOT NULL, bbalance integer, filler character(88));
CREATE TABLE pgbench_accounts (aid integer NOT NULL, bid integer, abalance integer,
                               filler character(84));
INSERT INTO pgbench_branches (bid, bbalance)
     SELECT b, 0 FROM generate_series(1, {BRANCHES}) AS b;
INSERT INTO pgbench_accounts (aid, bid, abalance, filler)
     SELECT aid, (aid - 1) / {ACCOUNTS // BRANCHES} + 1, 0, ''
       FROM generate_series(1, {ACCOUNTS}) AS aid;
ALTER TABLE pgbench_branches ADD PRIMARY KEY (bid);
ALTER TABLE pgbench_accounts ADD PRIMARY KEY (aid);
"""

_SHOP = f"""
CREATE TABLE customers (
    id         integer PRIMARY KEY,
    name       text NOT NULL,
    email      text NOT NULL UNIQUE,
    country    text NOT NULL,
    plan       text NOT NULL,
    created_at timestamptz NOT NULL
);
INSERT INTO customers (id, name, email, country, plan, created_at)
SELECT i,
       f.first || ' ' || l.last,
       lower(f.first || '.' || replace(l.last, ' ', '')) || i || '@example.com',
       (ARRAY['US','DE','FR','GB','NL','SE','ES','IT','CA','JP','BR','IN'])[i % 12 + 1],
       (ARRAY['free','free','free','pro','pro','team','enterprise'])[i % 7 + 1],
       timestamptz '2023-01-01 00:00:00+00' + i * interval '7 hours 13 minutes'
  FROM generate_series(1, {CUSTOMERS}) AS i,
       LATERAL (SELECT (ARRAY['Ada','Alan','Grace','Linus','Barbara','Donald','Edsger',
                              'Frances','Ken','Margaret','Niklaus','Radia','Tim','Yukihiro',
                              'Guido','Sophie'])[i % 16 + 1] AS first) f,
       LATERAL (SELECT (ARRAY['Lovelace','Turing','Hopper','Torvalds','Liskov','Knuth',
                              'Dijkstra','Allen','Thompson','Hamilton','Wirth','Perlman',
                              'Berners-Lee','Matsumoto','van Rossum','Wilson','Ritchie'])
                       [(i * 7) % 17 + 1] AS last) l;
CREATE TABLE orders (
    id          integer PRIMARY KEY,
    customer_id integer NOT NULL REFERENCES customers (id),
    amount      numeric(10, 2) NOT NULL,
    status      text NOT NULL,
    ordered_at  timestamptz NOT NULL
);
INSERT INTO orders (id, customer_id, amount, status, ordered_at)
SELECT i,
       (i * 7919) % {CUSTOMERS} + 1,
       round(((i * 7927) % 50000) / 100.0 + 4.99, 2),
       (ARRAY['paid','paid','paid','shipped','shipped','pending','refunded','cancelled'])
           [i % 8 + 1],
       timestamptz '2023-06-01 00:00:00+00' + i * interval '2 hours 17 minutes'
  FROM generate_series(1, {ORDERS}) AS i;
CREATE INDEX orders_customer_id_idx ON orders (customer_id);
CREATE INDEX orders_ordered_at_idx ON orders (ordered_at);
"""

_GROUPS = {  # first table of the group -> (all its tables, DDL + data)
    "pgbench_accounts": (("pgbench_branches", "pgbench_accounts"), _PGBENCH),
    "customers": (("customers", "orders"), _SHOP),
}


# Explicit, so that re-running puts back any attribute someone added to the role by hand.
_ROLE_ATTRIBUTES = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"

# {role} and {database} are identifiers, {tables} the demo tables. A new database lets every
# role (PUBLIC) connect and create temporary tables: here only the demo roles may connect and
# nobody but the owner may create. Before PostgreSQL 15 PUBLIC could also create in schema
# public. No default privileges: a table added later stays unreadable until granted.
_READER_GRANTS = """\
REVOKE ALL ON DATABASE {database} FROM PUBLIC;
GRANT CONNECT ON DATABASE {database} TO {role};
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO {role};
GRANT SELECT ON {tables} TO {role};
"""

# The writer's: the deposit's columns and nothing else. An UPDATE needs SELECT on every column
# it reads (abalance in SET, aid in WHERE) besides UPDATE on the column it sets. Every grant on
# the demo tables is revoked first (column grants go with a table's REVOKE ALL), so remaking the
# role also takes back whatever was granted to it by hand. Run after the reader's grants, which
# close the database to PUBLIC.
_WRITER_GRANTS = """\
GRANT CONNECT ON DATABASE {database} TO {role};
GRANT USAGE ON SCHEMA public TO {role};
REVOKE ALL ON {tables} FROM {role};
GRANT SELECT (aid, abalance), UPDATE (abalance) ON pgbench_accounts TO {role};
"""


def demo_tables() -> list[str]:
    """Every table ``create_demo_data`` builds: what the demo role may read."""
    return [table for tables, _ddl in _GROUPS.values() for table in tables]


def reader_grants(role: str = READER, database: str = "demo") -> str:
    """The grants of the demo role as SQL text (plain names: for the compose init script)."""
    return _READER_GRANTS.format(role=role, database=database, tables=", ".join(demo_tables()))


def writer_grants(role: str = WRITER, database: str = "demo") -> str:
    """The grants of the writer role as SQL text (plain names: for the compose init script)."""
    return _WRITER_GRANTS.format(role=role, database=database, tables=", ".join(demo_tables()))


def create_demo_data(dsn: str) -> list[str]:
    """Build the demo tables that are missing in ``dsn``; return the tables created
    (empty when everything was already there)."""
    conn = psycopg2.connect(dsn, connect_timeout=10)
    try:
        _try_pg_stat_statements(conn)
        created: list[str] = []
        with conn, conn.cursor() as cur:  # one transaction: all or nothing
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            for marker, (tables, ddl) in _GROUPS.items():
                cur.execute("SELECT to_regclass(%s) IS NOT NULL", (f"public.{marker}",))
                if cur.fetchone()[0]:
                    continue
                cur.execute(ddl)
                created.extend(tables)
        if created:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("VACUUM ANALYZE " + ", ".join(created))
        return created
    finally:
        conn.close()


def create_demo_reader(dsn: str, password: str, role: str = READER) -> None:
    """Make ``role`` (or reset its attributes and password) and grant it reading the demo
    tables of ``dsn``'s database; run it as a superuser, after ``create_demo_data``."""
    _make_role(dsn, password, role, _READER_GRANTS)


def create_demo_writer(dsn: str, password: str, role: str = WRITER) -> None:
    """Make ``role`` (or reset its attributes, password and grants) and grant it exactly the
    deposit: ``SELECT (aid, abalance), UPDATE (abalance) ON pgbench_accounts``. Run it as a
    superuser, after ``create_demo_reader`` (which closes the database to PUBLIC)."""
    _make_role(dsn, password, role, _WRITER_GRANTS)


def _make_role(dsn: str, password: str, role: str, grants: str) -> None:
    conn = psycopg2.connect(dsn, connect_timeout=10)
    try:
        # Hashed here, as psql's \password does: the clear text never reaches the server,
        # its log or pg_stat_statements.
        verifier = encrypt_password(password, role, conn)
        ident = sql.Identifier(role)
        with conn, conn.cursor() as cur:  # one transaction: the role never exists ungranted
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_ROLE_LOCK_KEY,))
            cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,))
            verb = "ALTER" if cur.fetchone() else "CREATE"
            cur.execute(sql.SQL(f"{verb} ROLE {{}} {_ROLE_ATTRIBUTES} PASSWORD %s").format(ident),
                        (verifier,))
            cur.execute("SELECT current_database()")
            tables = sql.SQL(", ").join(sql.Identifier(t) for t in demo_tables())
            cur.execute(sql.SQL(grants).format(
                role=ident, database=sql.Identifier(cur.fetchone()[0]), tables=tables))
    finally:
        conn.close()


def _try_pg_stat_statements(conn: psycopg2.extensions.connection) -> None:
    """``CREATE EXTENSION pg_stat_statements`` when the server has it; failures ignored."""
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_stat_statements'")
            if cur.fetchone():
                cur.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    except psycopg2.Error:
        pass
