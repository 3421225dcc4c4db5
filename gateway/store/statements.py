"""Every statement the control plane runs against the store, by what it does.

Each function takes an open cursor (a ``RealDictCursor`` of the control plane's
transaction) and returns rows as dicts; none commits. The catalog's reads (each worker's
snapshot) are in ``store.catalog``; the run history's writes in ``store.history``.
"""
from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias

import psycopg2.extensions
import psycopg2.extras

if TYPE_CHECKING:
    from ..model.actor import Actor

Cursor: TypeAlias = psycopg2.extensions.cursor   # a RealDictCursor: rows are dicts

_SNAPSHOTS = {
    "connection": "SELECT to_jsonb(c) - 'password' || jsonb_build_object('password_set', c.password IS NOT NULL) "
                  "FROM gw_connections c WHERE c.name = %s",
    "query": "SELECT to_jsonb(q) || jsonb_build_object('versions', (SELECT jsonb_agg(jsonb_build_object("
             "'version', v.version, 'sql', v.sql, 'parameters', v.parameters, 'published_at', v.published_at) "
             "ORDER BY v.version) FROM gw_query_versions v WHERE v.query_id = q.id)) "
             "FROM gw_queries q WHERE q.name = %s",
    # Neither the secret's digest nor the previous one's (kept in the grants during a rotation's grace).
    "key": "SELECT jsonb_set(to_jsonb(k) - 'secret_hash', '{grants}', (coalesce(k.grants, '{}'::jsonb) - 'previous')) "
           "FROM gw_api_keys k WHERE k.name = %s",
}
_VERSIONS = ("SELECT v.*, c.name AS connection_name FROM gw_query_versions v "
             "JOIN gw_connections c ON c.id = v.connection_id ")


def _one(cur: Cursor) -> Any:
    return cur.fetchone()


def _placeholders(values: dict) -> str:
    return ", ".join(["%s"] * len(values))


# --- changes: the generation and the audit trail -------------------------------------------
def snapshot(cur: Cursor, kind: str, name: str) -> dict | None:
    """The object as the audit log shows it: secrets never included."""
    cur.execute(_SNAPSHOTS[kind], (name,))
    row = cur.fetchone()
    return None if row is None else next(iter(row.values()))


def bump_generation(cur: Cursor) -> int:
    cur.execute("UPDATE gw_catalog_state SET generation = generation + 1 RETURNING generation")
    return _one(cur)["generation"]


_PRUNE_EVERY = 64   # generations between prunes of the change log: one small delete, not one per change


def log_change(cur: Cursor, generation: int, kind: str, object_id: int, keep: int) -> None:
    """Record that ``generation`` changed one object, and forget changes more than ``keep``
    generations old (a worker that far behind loads the whole catalog). Called after
    ``bump_generation`` in the same transaction: the row lock on the generation orders the
    commits, so a snapshot that sees generation G sees every logged change up to G."""
    cur.execute("INSERT INTO gw_catalog_changes (generation, kind, id) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                (generation, kind, object_id))
    oldest = generation - keep
    if oldest > 0 and generation % _PRUNE_EVERY == 0:
        cur.execute("DELETE FROM gw_catalog_changes WHERE generation <= %s", (oldest,))
        cur.execute("UPDATE gw_catalog_state SET log_from = greatest(log_from, %s)", (oldest,))


def commit_change(cur: Cursor, actor: Actor, action: str, kind: str, name: str, before: dict | None,
                  after: dict | None, object_id: int | None, keep: int) -> int:
    """A change's bookkeeping in one round trip: bump the generation, log which object it
    changed (``log_change``; none when ``object_id`` is None) and write the audit entry
    (``insert_audit``), all at the new generation, which is returned. The generation's row
    lock is held from here to the commit, and every management call takes it: as one
    statement right before the commit it is held for one round trip and the commit, not
    three (the statements of the change itself run before it, unserialized)."""
    cur.execute("WITH g AS (UPDATE gw_catalog_state SET generation = generation + 1 RETURNING generation), "
                "c AS (INSERT INTO gw_catalog_changes (generation, kind, id) "
                "      SELECT generation, %(kind)s, %(id)s FROM g WHERE %(id)s IS NOT NULL ON CONFLICT DO NOTHING), "
                "a AS (INSERT INTO gw_audit (actor, client_ip, request_id, action, kind, name, before, after, "
                "      generation) SELECT %(actor)s, %(ip)s, %(rid)s, %(action)s, %(kind)s, %(name)s, %(before)s, "
                "      %(after)s, generation FROM g) "
                "SELECT generation FROM g",
                {"kind": kind, "id": object_id, "actor": actor.name, "ip": actor.ip, "rid": actor.request_id,
                 "action": action, "name": name, "before": psycopg2.extras.Json(before),
                 "after": psycopg2.extras.Json(after)})
    generation: int = _one(cur)["generation"]
    oldest = generation - keep
    if object_id is not None and oldest > 0 and generation % _PRUNE_EVERY == 0:
        cur.execute("DELETE FROM gw_catalog_changes WHERE generation <= %s", (oldest,))
        cur.execute("UPDATE gw_catalog_state SET log_from = greatest(log_from, %s)", (oldest,))
    return generation


def insert_audit(cur: Cursor, actor: Actor, action: str, kind: str, name: str, before: dict | None,
                 after: dict | None, generation: int) -> None:
    cur.execute("INSERT INTO gw_audit (actor, client_ip, request_id, action, kind, name, before, after, "
                "generation) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (actor.name, actor.ip, actor.request_id, action, kind, name,
                 psycopg2.extras.Json(before), psycopg2.extras.Json(after), generation))


def audit_entries(cur: Cursor, where: str, values: list, limit: int) -> list[dict]:
    cur.execute(f"SELECT * FROM gw_audit {where} ORDER BY id DESC LIMIT %s", values + [limit])
    return cur.fetchall()


def audit_count(cur: Cursor, where: str, values: list) -> int:
    cur.execute(f"SELECT count(*) AS n FROM gw_audit {where}", values)
    return cur.fetchone()["n"]


def history_entries(cur: Cursor, where: str, values: list, limit: int) -> list[dict]:
    # key_id 0 is the admin key on the data plane (no row of its own).
    cur.execute("SELECT h.id, h.at, h.request_id, CASE WHEN h.key_id = 0 THEN 'admin' ELSE k.name END AS key, "
                "h.query, h.version, h.status, h.code, "
                "h.row_count, h.duration_ms, h.worker FROM gw_run_history h "
                f"LEFT JOIN gw_api_keys k ON k.id = h.key_id {where} ORDER BY h.id DESC LIMIT %s",
                values + [limit])
    return cur.fetchall()


# --- connections -----------------------------------------------------------------------------
def connection(cur: Cursor, name: str) -> dict | None:
    cur.execute("SELECT * FROM gw_connections WHERE name = %s", (name,))
    return _one(cur)


def connections(cur: Cursor) -> list[dict]:
    cur.execute("SELECT * FROM gw_connections ORDER BY name")
    return cur.fetchall()


def insert_connection(cur: Cursor, values: dict) -> None:
    cur.execute(f"INSERT INTO gw_connections ({', '.join(values)}) VALUES ({_placeholders(values)})",
                list(values.values()))


def update_connection(cur: Cursor, name: str, values: dict) -> bool:
    sets = ", ".join(f"{c} = %s" for c in values)
    cur.execute(f"UPDATE gw_connections SET {sets}, updated_at = now() WHERE name = %s", [*values.values(), name])
    return cur.rowcount > 0


def delete_connection(cur: Cursor, name: str) -> bool:
    cur.execute("DELETE FROM gw_connections WHERE name = %s", (name,))
    return cur.rowcount > 0


# --- saved queries ---------------------------------------------------------------------------
def query(cur: Cursor, name: str, lock: bool = False) -> dict | None:
    cur.execute("SELECT * FROM gw_queries WHERE name = %s" + (" FOR UPDATE" if lock else ""), (name,))
    return _one(cur)


def queries(cur: Cursor) -> list[dict]:
    cur.execute("SELECT * FROM gw_queries ORDER BY name")
    return cur.fetchall()


def insert_query(cur: Cursor, name: str) -> int:
    cur.execute("INSERT INTO gw_queries (name) VALUES (%s) RETURNING id", (name,))
    return _one(cur)["id"]


def set_version_cache_ttl(cur: Cursor, query_id: int, version: int, seconds: int | None) -> bool:
    cur.execute("UPDATE gw_query_versions SET cache_ttl = %s WHERE query_id = %s AND version = %s",
                (seconds, query_id, version))
    return cur.rowcount > 0


def set_query_cache_ttl(cur: Cursor, query_id: int, seconds: int) -> None:
    cur.execute("UPDATE gw_queries SET cache_ttl = %s WHERE id = %s", (seconds, query_id))


def delete_query(cur: Cursor, name: str) -> bool:
    cur.execute("DELETE FROM gw_queries WHERE name = %s", (name,))
    return cur.rowcount > 0


def last_version(cur: Cursor, query_id: int) -> int:
    cur.execute("SELECT max(version) AS v FROM gw_query_versions WHERE query_id = %s", (query_id,))
    return _one(cur)["v"]


def insert_version(cur: Cursor, values: dict, publish: bool) -> None:
    cur.execute(f"INSERT INTO gw_query_versions ({', '.join(values)}, published_at) VALUES "
                f"({_placeholders(values)}, {'now()' if publish else 'NULL'})", list(values.values()))


def mark_published(cur: Cursor, query_id: int, version: int) -> bool:
    cur.execute("UPDATE gw_query_versions SET published_at = coalesce(published_at, now()) "
                "WHERE query_id = %s AND version = %s", (query_id, version))
    return cur.rowcount > 0


def serve_version(cur: Cursor, query_id: int, version: int | None) -> None:
    cur.execute("UPDATE gw_queries SET published_version = %s, updated_at = now() WHERE id = %s", (version, query_id))


def versions_of(cur: Cursor, query_id: int) -> list[dict]:
    cur.execute(_VERSIONS + "WHERE v.query_id = %s ORDER BY v.version", (query_id,))
    return cur.fetchall()


def all_versions(cur: Cursor) -> list[dict]:
    cur.execute(_VERSIONS + "ORDER BY v.query_id, v.version")
    return cur.fetchall()


# --- API keys ----------------------------------------------------------------------------------
def key(cur: Cursor, name: str, lock: bool = False) -> dict | None:
    cur.execute("SELECT * FROM gw_api_keys WHERE name = %s" + (" FOR UPDATE" if lock else ""), (name,))
    return _one(cur)


def keys(cur: Cursor) -> list[dict]:
    cur.execute("SELECT * FROM gw_api_keys ORDER BY name")
    return cur.fetchall()


def insert_key(cur: Cursor, name: str, prefix: str, digest: bytes, grants: dict,
               expires_at: datetime | None) -> None:
    cur.execute("INSERT INTO gw_api_keys (name, prefix, secret_hash, grants, expires_at) VALUES (%s, %s, %s, %s, %s)",
                (name, prefix, digest, psycopg2.extras.Json(grants), expires_at))


def update_key_grants(cur: Cursor, key_id: int, grants: dict, expires_at: datetime | None) -> None:
    cur.execute("UPDATE gw_api_keys SET grants = %s, expires_at = %s WHERE id = %s",
                (psycopg2.extras.Json(grants), expires_at, key_id))


def rotate_key(cur: Cursor, key_id: int, prefix: str, digest: bytes) -> None:
    cur.execute("UPDATE gw_api_keys SET prefix = %s, secret_hash = %s, rotated_at = now() WHERE id = %s",
                (prefix, digest, key_id))


def delete_key(cur: Cursor, name: str) -> bool:
    cur.execute("DELETE FROM gw_api_keys WHERE name = %s", (name,))
    return cur.rowcount > 0
