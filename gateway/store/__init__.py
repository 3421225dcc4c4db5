"""The gateway's own store in PostgreSQL: schema, migrations and data access."""
