"""The local runner: an embedded PostgreSQL and Redis under the fleet home (``embedded``),
the demo data and its least-privileged roles (``demo``), and the demo's connections,
queries and key made through the Management API (``seed``). ``fleet up`` uses all three;
the gateway itself uses none of them."""
from .embedded import (
    LocalPostgres,
    LocalRedis,
    demo_database_url,
    demo_reader_password,
    demo_writer_password,
    ensure_embedded,
    find_pg_bindir,
    find_redis_server,
    stop_embedded,
)

__all__ = ["LocalPostgres", "LocalRedis", "ensure_embedded", "stop_embedded", "demo_database_url",
           "demo_reader_password", "demo_writer_password", "find_pg_bindir", "find_redis_server"]
