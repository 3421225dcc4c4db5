-- The demo connection reads, never writes: demo_reader gets SELECT on the demo tables
-- (built by 20-demo.sql, generated from fleet/demo.py).
\connect demo
GRANT CONNECT ON DATABASE demo TO demo_reader;
GRANT USAGE ON SCHEMA public TO demo_reader;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO demo_reader;
