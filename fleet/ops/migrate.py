"""``fleet migrate``: bring the store's schema up to this release's and exit, serving nothing.

What a release's migration job runs (deploy/kubernetes: a Job per release, before the new
pods). It applies the same migrations, through the same function and advisory lock, as every
worker applies when it boots (``gateway.app.build_app`` calls ``gateway.store.schema.migrate``),
so the job is not what makes the store current; it makes it current *once*, before the
release's workers boot, and outside their boot. A booting worker sends gunicorn no heartbeat:
one still migrating (or waiting on the lock) after gunicorn's ``timeout`` (60 s,
fleet/server/gunicorn_conf.py) is killed and started again, and the migration it held rolls back
with its connection, so a migration longer than that never completes at boot. The job has
no such limit.

What a worker does with a store at another version (``gateway.store.schema.migrate``):

* older than its code: applies the missing migrations itself at boot, each in one
  transaction under the advisory lock (concurrent boots wait for one another), then serves;
* newer than its code (the migration job of a later release ran, or a rollback): applies
  nothing, says nothing and serves on the newer schema. Migrations are append-only, so a
  newer store has every table and column an older worker reads; that the older worker
  reads *rows* a newer release wrote correctly is each migration's own promise.

This command says which of these it found.
"""
from __future__ import annotations

from collections.abc import Callable

import psycopg2

from gateway.settings import Settings
from gateway.store.schema import MIGRATIONS, migrate

from ..app import store_connector, wait_for_store


def migrate_store(settings: Settings, wait_s: float, say: Callable[[str], None] = print) -> int:
    """Apply the migrations this release knows (waiting up to ``wait_s`` for the store to
    accept connections); the store's schema version after. Raises SystemExit when there is
    no store to migrate: it never starts the embedded default."""
    if not settings.database_url:
        raise SystemExit("fleet migrate: GATEWAY_DATABASE_URL is not set (the store to migrate)")
    conn = wait_for_store(settings, wait_s)
    if conn is None:
        try:                      # once more, for the reason
            conn = store_connector(settings)()
        except psycopg2.OperationalError as error:
            raise SystemExit(f"fleet migrate: the store does not accept connections after {wait_s:g} s: "
                             f"{str(error).strip()}") from None
    try:
        version = migrate(conn)
    finally:
        conn.close()
    known = len(MIGRATIONS)
    if version > known:
        say(f"store schema at version {version}, newer than this release's {known}: nothing applied "
            "(this release's workers serve on it as it is)")
    else:
        say(f"store schema at version {version} (this release's newest)")
    return version
