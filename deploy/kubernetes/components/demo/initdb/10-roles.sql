-- Runs once, on an empty data volume (the postgres image runs /docker-entrypoint-initdb.d/*
-- in name order, as the superuser). Passwords come from the postgres service's environment,
-- i.e. from compose/.env; nothing secret is written in this file.
--
--   gateway      owns the `gateway` database: the gateway's store (GATEWAY_DATABASE_URL).
--   demo_reader  may only connect to the `demo` database and SELECT its demo tables
--                (20-demo.sql, 30-demo-grants.sql): the demo connection that `fleet seed`
--                creates logs in as this role, never as the superuser. Its attributes are
--                the ones fleet/ops/local/demo.py gives it on the embedded PostgreSQL.
--   demo_writer  may only connect to the `demo` database and run the load tests' deposit:
--                SELECT (aid, abalance), UPDATE (abalance) ON pgbench_accounts
--                (30-demo-grants.sql); the demo_writer connection logs in as this role.
\getenv store_password FLEET_STORE_PG_PASSWORD
\getenv demo_password GATEWAY_DEMO_PG_PASSWORD
\getenv demo_writer_password GATEWAY_DEMO_WRITER_PG_PASSWORD
CREATE ROLE gateway LOGIN PASSWORD :'store_password';
CREATE DATABASE gateway OWNER gateway;
-- A new database lets every role (PUBLIC) connect and make temporary tables: the demo roles
-- log in to `demo` alone (30-demo-grants.sql closes it the same way), never to the store.
REVOKE ALL ON DATABASE gateway FROM PUBLIC;
REVOKE ALL ON DATABASE postgres FROM PUBLIC;
CREATE ROLE demo_reader LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
    PASSWORD :'demo_password';
CREATE ROLE demo_writer LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
    PASSWORD :'demo_writer_password';
