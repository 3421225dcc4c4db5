"""The store connection of rare reads: reopened once when the store dropped it, the store's
error passed on when a fresh one fails too."""
from __future__ import annotations

import psycopg2
import pytest

from gateway.store.oneconn import OneConnection


def test_a_connection_the_store_dropped_is_opened_again(services):
    opened = []

    def connect():
        opened.append(psycopg2.connect(services.store_url, application_name="oneconn-test"))
        return opened[-1]
    one = OneConnection(connect)
    try:
        (pid,) = one.fetchone("SELECT pg_backend_pid()")
        with psycopg2.connect(services.store_url) as admin, admin.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s)", (pid,))   # as a store restart would
        (again,) = one.fetchone("SELECT pg_backend_pid()")
        assert again != pid and len(opened) == 2
        assert one.fetchone("SELECT %s::int + 1", (41,)) == (42,)
    finally:
        one.close()


def test_the_error_reaches_the_caller_when_a_fresh_connection_fails_too(services):
    def connect():
        return psycopg2.connect(services.store_url.rsplit("/", 1)[0] + "/no_such_database")
    one = OneConnection(connect)
    with pytest.raises(psycopg2.OperationalError):
        one.fetchone("SELECT 1")
    one.close()
