"""Schema migrations, applied at start-up.

Each migration is applied once, in order, inside one transaction that holds a
transaction-level advisory lock: when many workers start at once, one applies and the
others wait, then find nothing left to do. Migrations are append-only: never edit one
that has shipped, add the next.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psycopg2.extensions

MIGRATIONS: list[str] = [
    # 1: connections, saved queries with versions, API keys, run history
    """
    CREATE TABLE gw_connections (
        id          serial PRIMARY KEY,
        name        text NOT NULL UNIQUE,
        db          text NOT NULL DEFAULT 'postgres',
        host        text NOT NULL,
        port        integer NOT NULL DEFAULT 5432,
        database    text NOT NULL,
        username    text NOT NULL,
        password    text,
        active      boolean NOT NULL DEFAULT true,
        options     jsonb NOT NULL DEFAULT '{}'::jsonb,
        created_at  timestamptz NOT NULL DEFAULT now(),
        updated_at  timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE gw_queries (
        id                serial PRIMARY KEY,
        name              text NOT NULL UNIQUE,
        published_version integer,
        created_at        timestamptz NOT NULL DEFAULT now(),
        updated_at        timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE gw_query_versions (
        query_id       integer NOT NULL REFERENCES gw_queries(id) ON DELETE CASCADE,
        version        integer NOT NULL,
        connection_id  integer NOT NULL REFERENCES gw_connections(id),
        sql            text NOT NULL,
        parameters     jsonb NOT NULL DEFAULT '{}'::jsonb,
        description    text NOT NULL DEFAULT '',
        tags           jsonb NOT NULL DEFAULT '[]'::jsonb,
        extra          jsonb NOT NULL DEFAULT '{}'::jsonb,
        published_at   timestamptz,
        created_at     timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (query_id, version)
    );
    CREATE TABLE gw_api_keys (
        id          serial PRIMARY KEY,
        name        text NOT NULL UNIQUE,
        prefix      text NOT NULL UNIQUE,
        secret_hash bytea NOT NULL,
        grants      jsonb NOT NULL DEFAULT '{}'::jsonb,
        expires_at  timestamptz,
        created_at  timestamptz NOT NULL DEFAULT now(),
        rotated_at  timestamptz
    );
    CREATE TABLE gw_run_history (
        id           bigserial PRIMARY KEY,
        at           timestamptz NOT NULL,
        request_id   text NOT NULL,
        key_id       integer,
        query        text,
        version      integer,
        status       smallint NOT NULL,
        code         text,
        row_count    integer,
        duration_ms  real NOT NULL,
        worker       text NOT NULL
    );
    CREATE INDEX gw_run_history_at ON gw_run_history (at);
    CREATE INDEX gw_run_history_query_at ON gw_run_history (query, at);
    -- The catalog's generation: bumped in the same transaction as every management change,
    -- so it is the truth the fleet's bus only carries.
    CREATE TABLE gw_catalog_state (
        id          integer PRIMARY KEY DEFAULT 1 CHECK (id = 1),
        generation  bigint NOT NULL
    );
    INSERT INTO gw_catalog_state (id, generation) VALUES (1, 0);
    """,
    # 2: the audit log of management changes
    """
    CREATE TABLE gw_audit (
        id          bigserial PRIMARY KEY,
        at          timestamptz NOT NULL DEFAULT now(),
        actor       text NOT NULL,
        client_ip   text,
        request_id  text,
        action      text NOT NULL,
        kind        text NOT NULL,
        name        text NOT NULL,
        before      jsonb,
        after       jsonb,
        generation  bigint NOT NULL
    );
    CREATE INDEX gw_audit_at ON gw_audit (at);
    CREATE INDEX gw_audit_kind_name ON gw_audit (kind, name, at);
    """,
    # 3: which runs passed admission (their key's rate limit and quota were charged), so a
    # quota counter lost with Redis is rebuilt from the history (fleet.shared.leases); NULL on runs
    # written before this column, where status 200 stands for it. The index serves that
    # rebuild: one key's runs since its period began.
    """
    ALTER TABLE gw_run_history ADD COLUMN admitted boolean;
    CREATE INDEX gw_run_history_key_at ON gw_run_history (key_id, at);
    """,
    # 4: the catalog's change log: which objects each generation changed, written in the
    # transaction that bumps it (gateway.control.changes), so a worker at generation g
    # applies only the rows changed after g (gateway.model.state) instead of reading the
    # whole catalog. ``log_from``: the log holds every change after it; a worker older than
    # that (or new, or ahead of the store) loads everything. Changes before this migration
    # were not logged, hence it starts at the current generation.
    """
    CREATE TABLE gw_catalog_changes (
        generation  bigint NOT NULL,
        kind        text NOT NULL CHECK (kind IN ('connection', 'query', 'key')),
        id          integer NOT NULL,
        PRIMARY KEY (generation, kind, id)
    );
    ALTER TABLE gw_catalog_state ADD COLUMN log_from bigint;
    UPDATE gw_catalog_state SET log_from = generation;
    ALTER TABLE gw_catalog_state ALTER COLUMN log_from SET NOT NULL;
    """,
    # 5: response caching (gateway.cache): seconds a read's answer may be served from the
    # cache. The query's value is the default of its new versions; a version holds its own,
    # resolved when it is saved (0 or NULL: not cached).
    """
    ALTER TABLE gw_queries ADD COLUMN cache_ttl integer;
    ALTER TABLE gw_query_versions ADD COLUMN cache_ttl integer;
    """,
    # 6: the cache's purge counter (gateway.store.purges): every purge and every write that
    # invalidates bumps it, so a worker that cannot hear the cache's bus checks it before
    # serving from memory (the catalog's rule, for the cache).
    """
    CREATE TABLE gw_cache_state (
        id      integer PRIMARY KEY DEFAULT 1 CHECK (id = 1),
        purges  bigint NOT NULL
    );
    INSERT INTO gw_cache_state (id, purges) VALUES (1, 0);
    """,
    # 7: a version's analysis in one document: the governance analysis (``extra.governance``)
    # joins PostgreSQL's reading (``extra.analysis``: positional text, parameter order, paged
    # form; the same ``kind``, as the save checked). A version saved before governance has no
    # analysis version in it and stays refused at plan time until it is saved again, as before.
    """
    UPDATE gw_query_versions
       SET extra = (extra - 'governance')
                   || jsonb_build_object('analysis', (extra -> 'governance') || (extra -> 'analysis'))
     WHERE jsonb_typeof(extra -> 'governance') = 'object' AND jsonb_typeof(extra -> 'analysis') = 'object';
    """,
]

_LOCK_ID = 0x6777_6669  # "gwfi": any constant shared by every process of the fleet


def migrate(conn: psycopg2.extensions.connection) -> int:
    """Bring the store up to date; returns the schema version. Safe to call concurrently."""
    old_autocommit = conn.autocommit
    conn.autocommit = False
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_ID,))
            cur.execute("""CREATE TABLE IF NOT EXISTS gw_schema_version (
                               version integer PRIMARY KEY,
                               applied_at timestamptz NOT NULL DEFAULT now())""")
            cur.execute("SELECT coalesce(max(version), 0) FROM gw_schema_version")
            current = cur.fetchone()[0]
            for number, sql in enumerate(MIGRATIONS, start=1):
                if number <= current:
                    continue
                cur.execute(sql)
                cur.execute("INSERT INTO gw_schema_version (version) VALUES (%s)", (number,))
                current = number
        conn.commit()
        return current
    except BaseException:
        conn.rollback()
        raise
    finally:
        conn.autocommit = old_autocommit
