"""Demo data for a fresh install: pgbench-style tables and a small customers/orders shop.

``create_demo_data(dsn)`` is idempotent: each table group is built in one transaction
(created, filled, indexed, committed together), so a group that exists is complete and is
skipped. An advisory lock serialises concurrent callers.

* ``pgbench_accounts`` (1,000,000 rows) and ``pgbench_branches`` (10 rows): the layout of
  ``pgbench -i -s 10`` (without tellers/history), for load tests of point lookups.
* ``customers`` (1,000 rows) and ``orders`` (5,000 rows): deterministic, friendlier
  data for examples and tutorials.
"""
from __future__ import annotations

import psycopg2

__all__ = ["create_demo_data", "ACCOUNTS", "BRANCHES", "CUSTOMERS", "ORDERS"]

ACCOUNTS = 1_000_000
BRANCHES = 10
CUSTOMERS = 1_000
ORDERS = 5_000
_LOCK_KEY = 0x6677_0001  # pg_advisory_xact_lock key for "building demo data"

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


def _try_pg_stat_statements(conn) -> None:
    """``CREATE EXTENSION pg_stat_statements`` when the server has it; failures ignored."""
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_stat_statements'")
            if cur.fetchone():
                cur.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    except psycopg2.Error:
        pass
