"""``/q/<name>``: paging, timeouts, database errors, run history."""
from __future__ import annotations

import threading
import time

import falcon.testing
import psycopg2
import pytest

from gateway.ports import LocalSync
from gateway.store.history import AdmittedUsage
from helpers.history import wait_for_history
from helpers.ports import free_port
from helpers.util import unique, wait_until

SERIES = "SELECT g AS n FROM generate_series(1, :total) AS g ORDER BY g"
SERIES_PARAMS = {"total": {"type": "int", "default": 25}}
SLOW = "SELECT pg_sleep(:seconds) AS slept"
SLOW_PARAMS = {"seconds": {"type": "float", "default": 1, "max": 5}}


def numbers(reply) -> list[int]:
    assert reply.status == 200, reply
    return [row["n"] for row in reply.json]


# --- paging ------------------------------------------------------------------------------
def test_default_page(api, endpoint):
    ep = endpoint(SERIES, SERIES_PARAMS)
    got = api.call(ep.query, ep.secret)
    assert numbers(got) == list(range(1, 11))
    assert (got.headers["X-Page"], got.headers["X-Page-Size"], got.headers["X-Has-More"],
            got.headers["X-Row-Count"]) == ("1", "10", "true", "10")


@pytest.mark.parametrize("total, page, size, expected, more", [
    (25, 2, 10, range(11, 21), "true"),
    (25, 3, 10, range(21, 26), "false"),
    (20, 2, 10, range(11, 21), "false"),   # exactly at the boundary
    (21, 2, 10, range(11, 21), "true"),    # one past it
    (10, 1, 10, range(1, 11), "false"),
    (5, 4, 2, [], "false"),                # past the end
    (3, 1, 1000, range(1, 4), "false"),    # the largest page size allowed
])
def test_pages(api, endpoint, total, page, size, expected, more):
    ep = endpoint(SERIES, SERIES_PARAMS)
    got = api.call(ep.query, ep.secret, {"total": str(total), "page": str(page), "page_size": str(size)})
    assert numbers(got) == list(expected)
    assert (got.headers["X-Page"], got.headers["X-Page-Size"], got.headers["X-Has-More"]) == \
        (str(page), str(size), more)


def test_paging_in_a_post_body(api, endpoint):
    ep = endpoint(SERIES, SERIES_PARAMS)
    got = api.post(ep.query, ep.secret, {"params": {"total": 12}, "page": 2, "page_size": 5})
    assert numbers(got) == [6, 7, 8, 9, 10] and got.headers["X-Has-More"] == "true"


@pytest.mark.parametrize("query_string", [
    "page_size=1001", "page=0", "page=abc", "page=-1", "page=1.5", "page_size=0", "page_size=x",
    "page=99999999999", "page=1&page=2",
])
def test_invalid_paging(api, endpoint, query_string):
    ep = endpoint(SERIES, SERIES_PARAMS)
    got = api.call(ep.query, ep.secret, query_string=query_string)
    assert got.status == 400 and got.json["code"] == "invalid_paging", got


def test_max_page_size_follows_the_setting(make_app, endpoint, api):
    ep = endpoint(SERIES, SERIES_PARAMS)
    small = falcon.testing.TestClient(make_app(sync=LocalSync(), max_page_size=5, default_page_size=3))
    headers = {"X-API-Key": ep.secret}
    got = small.simulate_get(f"/q/{ep.query}", headers=headers)
    assert [r["n"] for r in got.json] == [1, 2, 3]
    assert small.simulate_get(f"/q/{ep.query}", params={"page_size": "5"}, headers=headers).status_code == 200
    refused = small.simulate_get(f"/q/{ep.query}", params={"page_size": "6"}, headers=headers)
    assert refused.status_code == 400 and refused.json["code"] == "invalid_paging"


# --- timeouts ------------------------------------------------------------------------------
def test_timeout(api, endpoint):
    ep = endpoint(SLOW, SLOW_PARAMS)
    started = time.monotonic()
    got = api.call(ep.query, ep.secret, {"timeout": "0.05"})
    assert got.status == 504 and got.json["code"] == "query_timeout", got
    assert time.monotonic() - started < 0.9  # cancelled, not waited out
    posted = api.post(ep.query, ep.secret, {"timeout": 0.05})
    assert posted.status == 504 and posted.json["code"] == "query_timeout"
    # The lowered timeout does not stick to the pooled session.
    assert api.call(ep.query, ep.secret, {"seconds": "0.2"}).status == 200
    assert api.call(ep.query, ep.secret, {"seconds": "0", "timeout": "5"}).status == 200


@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan", "inf", "1e10"])
def test_invalid_timeout(api, endpoint, value):
    ep = endpoint(SLOW, SLOW_PARAMS)
    got = api.call(ep.query, ep.secret, {"timeout": value, "seconds": "0"})
    assert got.status == 400 and got.json["code"] == "invalid_timeout", got


def test_invalid_timeout_in_body(api, endpoint):
    ep = endpoint(SLOW, SLOW_PARAMS)
    for value in (True, [1], "x", -0.5):
        got = api.post(ep.query, ep.secret, {"timeout": value, "params": {"seconds": 0}})
        assert got.status == 400 and got.json["code"] == "invalid_timeout", (value, got)


def test_server_statement_timeout(make_app, endpoint):
    ep = endpoint(SLOW, SLOW_PARAMS)
    strict = falcon.testing.TestClient(make_app(sync=LocalSync(), statement_timeout_ms=100))
    got = strict.simulate_get(f"/q/{ep.query}", params={"seconds": "0.5"}, headers={"X-API-Key": ep.secret})
    assert got.status_code == 504 and got.json["code"] == "query_timeout"
    # A caller cannot raise the server's timeout.
    got = strict.simulate_get(f"/q/{ep.query}", params={"seconds": "0.5", "timeout": "10"},
                              headers={"X-API-Key": ep.secret})
    assert got.status_code == 504


# --- database outcomes ---------------------------------------------------------------------
def test_data_errors_are_400_and_the_session_recovers(api, endpoint, superuser):
    ep = endpoint("SELECT 10 / :d AS q", {"d": {"type": "int", "required": True}})
    failed = api.call(ep.query, ep.secret, {"d": "0"})
    assert failed.status == 400 and failed.json["code"] == "query_failed", failed
    assert failed.json["sqlstate"] == "22012" and failed.json["condition"] == "division_by_zero"
    assert "division by zero" not in failed.json["error"]   # the server's own text goes to the log only
    assert api.call(ep.query, ep.secret, {"d": "5"}).json == [{"q": 2}]
    # A table dropped after the query was saved (saving checks that it exists).
    table = unique("gone").lower()
    superuser(f"CREATE TABLE {table} (id int)", db="demo")
    missing = endpoint(f"SELECT id FROM {table}")
    superuser(f"DROP TABLE {table}", db="demo")
    got = api.call(missing.query, missing.secret)
    assert got.status == 400 and got.json["sqlstate"] == "42P01"
    assert api.call(missing.query, missing.secret).json["code"] == "query_failed"


def test_database_errors_never_echo_values(api, demo_connection, superuser, caplog):
    # PostgreSQL quotes the value it could not cast: a masked column's value among them.
    email = superuser("SELECT email FROM customers WHERE id = 1", db="demo")[0][0]
    query = api.query("SELECT id FROM customers WHERE id = 1 AND email::int = 0", connection=demo_connection)
    secret = api.key([query], [demo_connection], mask=[{"column": "customers.email", "action": "hash"}])
    got = api.call(query, secret)
    assert got.status == 400 and got.json["code"] == "query_failed", got
    assert got.json["sqlstate"] == "22P02" and got.json["condition"] == "invalid_text_representation"
    assert email not in got.text and "invalid input syntax" not in got.text
    adhoc = api.request("POST", "/execute_sql", headers={"X-API-Key": api.key([], [demo_connection])},
                        json_body={"sql": "SELECT email::int FROM customers WHERE id = 1",
                                   "connection_name": demo_connection})
    assert adhoc.status == 400 and email not in adhoc.text, adhoc
    # The operator still finds the full message in the log, under the request id.
    assert any(got.json["request_id"] in r.getMessage() and email in r.getMessage() for r in caplog.records)


def test_no_error_path_echoes_the_servers_text(api, demo_connection, superuser, make_app, caplog):
    """A function's RAISE (message, DETAIL, HINT, CONTEXT), a constraint's DETAIL quoting the
    key (``Key (e)=(alan...) already exists``) on a granted write, saved and ad hoc: the
    caller gets the SQLSTATE and a generic message only; the log gets all of it, with the
    request id (before, only the first line was logged)."""
    email = superuser("SELECT email FROM customers WHERE id = 1", db="demo")[0][0]
    function, table = unique("boom").lower(), unique("uniq").lower()
    superuser(f"""CREATE FUNCTION {function}(t text) RETURNS int LANGUAGE plpgsql AS $$
                  BEGIN RAISE NOTICE 'notice %%', t;
                        RAISE EXCEPTION 'exc %%', t USING DETAIL = 'detail ' || t, HINT = 'hint ' || t; END $$;
                  CREATE TABLE {table} (e text UNIQUE); INSERT INTO {table} VALUES ('{email}');""", db="demo")
    raising = api.query(f"SELECT {function}(email) AS x FROM customers WHERE id = 1", connection=demo_connection)
    duplicate = api.query(f"INSERT INTO {table} SELECT email FROM customers WHERE id = 1",
                          connection=demo_connection)
    secret = api.key([raising, duplicate], [demo_connection], allow_writes=True)
    client = falcon.testing.TestClient(make_app(sync=LocalSync(), allow_writes=True))
    replies = [client.simulate_get(f"/q/{raising}", headers={"X-API-Key": secret}),
               client.simulate_post(f"/q/{duplicate}", json={}, headers={"X-API-Key": secret})]
    for sql in (f"SELECT {function}(email) AS x FROM customers WHERE id = 1",
                f"INSERT INTO {table} SELECT email FROM customers WHERE id = 1"):
        replies.append(client.simulate_post("/execute_sql", headers={"X-API-Key": secret},
                                            json={"sql": sql, "connection_name": demo_connection}))
    wanted = ["P0001", "23505", "P0001", "23505"]
    for reply, sqlstate in zip(replies, wanted, strict=True):
        assert reply.status_code == 400 and reply.json["code"] == "query_failed", reply.text
        assert reply.json["sqlstate"] == sqlstate, reply.text
        for word in (email, email.split("@")[0], "exc ", "detail", "hint", "notice", "already exists", "Key ("):
            assert word not in reply.text, (word, reply.text)
        logged = [r.getMessage() for r in caplog.records if reply.json["request_id"] in r.getMessage()]
        assert logged and all(email in m for m in logged), logged
        if sqlstate == "P0001":
            assert "DETAIL: detail " + email in logged[0] and "HINT: hint " + email in logged[0], logged
            assert "CONTEXT: PL/pgSQL function" in logged[0], logged
        else:
            assert f"DETAIL: Key (e)=({email}) already exists" in logged[0], logged


def test_sessions_are_read_only(api, endpoint, superuser):
    # The analysis refuses what it sees (FOR UPDATE, writable CTEs...); the session is the
    # second line: a read that writes through a function is refused by PostgreSQL itself.
    sequence = unique("seq").lower()
    superuser(f"CREATE SEQUENCE {sequence}", db="demo")
    ep = endpoint(f"SELECT nextval('{sequence}') AS n")
    got = api.call(ep.query, ep.secret)
    assert got.status == 403 and got.json["code"] == "write_not_allowed", got


def test_writes_are_refused_by_default(api, endpoint):
    ep = endpoint("UPDATE customers SET plan = plan WHERE id = :id", {"id": {"type": "int", "required": True}})
    assert api.manage("GET", f"/queries/{ep.query}").json["versions"][0]["kind"] == "write"
    got = api.post(ep.query, ep.secret, {"params": {"id": 1}})
    assert got.status == 403 and got.json["code"] == "write_not_allowed", got


def test_writes_when_the_server_and_the_key_allow_them(api, endpoint, make_app):
    ep = endpoint("UPDATE customers SET plan = plan WHERE id <= :n", {"n": {"type": "int", "required": True}})
    writer = api.key([ep.query], [ep.connection], allow_writes=True)
    # The server's ceiling is off by default: not even a key that may write can.
    assert api.post(ep.query, writer, {"params": {"n": 2}}).json["code"] == "write_not_allowed"
    client = falcon.testing.TestClient(make_app(sync=LocalSync(), allow_writes=True))
    got = client.simulate_post(f"/q/{ep.query}", json={"params": {"n": 2}}, headers={"X-API-Key": writer})
    assert got.status_code == 200, got.text
    assert got.headers["X-Rows-Affected"] == "2"
    refused = client.simulate_post(f"/q/{ep.query}", json={"params": {"n": 2}}, headers={"X-API-Key": ep.secret})
    assert refused.status_code == 403 and refused.json["code"] == "write_not_allowed"
    streamed = client.simulate_get(f"/q/{ep.query}", params={"n": "2", "stream": "true", "format": "csv"},
                                   headers={"X-API-Key": writer})
    assert streamed.status_code == 400 and streamed.json["code"] == "invalid_stream"


def test_inactive_connection(api):
    connection = api.connection()
    ep = api.endpoint("SELECT 1 AS one", connection=connection)
    assert api.call(ep.query, ep.secret).status == 200
    assert api.manage("PATCH", f"/connections/{connection}", {"active": False}).json["active"] is False
    got = api.call(ep.query, ep.secret)
    assert got.status == 403 and got.json["code"] == "connection_inactive", got   # QueryAPIGate's status
    assert api.manage("PATCH", f"/connections/{connection}", {"active": True}).status == 200
    assert api.call(ep.query, ep.secret).status == 200


def test_reserved_arguments_and_headers_on_a_saved_query(api, endpoint):
    """What a call without reserved arguments skips (``SavedCall.resolve``, ``split_reserved``, the
    ``Cache-Control`` test) still applies to a call with them."""
    ep = endpoint(SERIES, SERIES_PARAMS)
    assert numbers(api.call(ep.query, ep.secret, {"total": 3})) == [1, 2, 3]
    own = api.call(ep.query, ep.secret, {"total": 2, "connection_name": ep.connection})
    assert numbers(own) == [1, 2]
    other = api.call(ep.query, ep.secret, {"connection_name": unique("other")})
    assert other.status == 400 and other.json["code"] == "invalid_body", other
    assert numbers(api.call(ep.query, ep.secret, {"total": 2, "version": "1"})) == [1, 2]
    missing = api.call(ep.query, ep.secret, {"version": "9"})
    assert missing.status == 404 and missing.json["code"] == "version_not_found", missing
    paged = api.call(ep.query, ep.secret, {"total": 5, "page_size": 2, "page": 2})
    assert numbers(paged) == [3, 4]
    # a Cache-Control header on a query without cache_ttl changes nothing
    assert numbers(api.call(ep.query, ep.secret, {"total": 1}, headers={"Cache-Control": "no-cache"})) == [1]
    bad = api.call(ep.query, ep.secret, {"total": 1, "cache": "maybe"}, headers={"Cache-Control": "no-cache"})
    assert bad.status == 400 and bad.json["code"] == "invalid_cache", bad


def test_unreachable_database(api):
    connection = api.connection()
    ep = api.endpoint("SELECT 1 AS one", connection=connection)
    # Saved while reachable (saving reads the schema); now nothing listens there.
    assert api.manage("PATCH", f"/connections/{connection}", {"port": free_port()}).status == 200
    got = api.call(ep.query, ep.secret)
    assert got.status == 503 and got.json["code"] == "database_unavailable", got
    assert got.headers["Retry-After"] == "1"


def test_a_refused_login_says_why_in_the_log_only(api, caplog):
    connection = api.connection()
    ep = api.endpoint("SELECT 1 AS one", connection=connection)
    database = unique("nodb").lower()
    assert api.manage("PATCH", f"/connections/{connection}", {"database": database}).status == 200
    for params in ({}, {"stream": "true", "format": "csv"}):
        got = api.call(ep.query, ep.secret, params)
        assert got.status == 503 and got.json["code"] == "database_unavailable", got
        assert database not in got.text and "does not exist" not in got.text, got.text
        logged = [r.getMessage() for r in caplog.records if got.json["request_id"] in r.getMessage()]
        assert any(f'database "{database}" does not exist' in m for m in logged), logged


def test_a_pool_of_one_is_a_bulkhead_of_one(make_app, endpoint, superuser):
    """A connection's bulkhead has no more places than its pool has sessions: a second call
    while the one session is busy is refused by the bulkhead (``connection_busy``), never left
    waiting for a session (``pool_exhausted``, before the bulkhead)."""
    ep = endpoint(SLOW, SLOW_PARAMS)
    one = make_app(sync=LocalSync(), pool_size=1)
    client = falcon.testing.TestClient(one)
    connection = one.parts.holder.catalog.connections[ep.connection]
    one.parts.pools.get(connection, False).wait_s = 0.2
    headers = {"X-API-Key": ep.secret}
    slow = {}
    thread = threading.Thread(target=lambda: slow.update(
        r=client.simulate_get(f"/q/{ep.query}", params={"seconds": "1"}, headers=headers)))
    thread.start()
    wait_until(lambda: superuser("SELECT 1 FROM pg_stat_activity WHERE wait_event = 'PgSleep'", db="demo"), 10, 0.01,
               "the slow call holding the one session")
    busy = client.simulate_get(f"/q/{ep.query}", params={"seconds": "0"}, headers=headers)
    thread.join()
    assert busy.status_code == 503 and busy.json["code"] == "connection_busy", busy.text
    assert busy.headers["Retry-After"]
    assert slow["r"].status_code == 200
    assert client.simulate_get(f"/q/{ep.query}", params={"seconds": "0"}, headers=headers).status_code == 200


# --- run history ----------------------------------------------------------------------------
def test_run_history(api, endpoint, superuser):
    ep = endpoint(SERIES, SERIES_PARAMS)
    ok = api.call(ep.query, ep.secret, {"total": "3"})
    bad = api.call(ep.query, ep.secret, {"total": "x"})
    unknown = api.call(unique("nothing"), ep.secret)
    odd = api.call("odd%00name%09tab", ep.secret)  # text COPY must escape
    key_id = superuser("SELECT id FROM gw_api_keys WHERE name = %s", (ep.key,))[0][0]
    ids = [r.headers["X-Request-Id"] for r in (ok, bad, unknown, odd)]
    assert len(set(ids)) == 4
    found = wait_for_history(superuser, ids)
    assert found[ids[0]] == (ep.query, 1, 200, None, 3, key_id)
    assert found[ids[1]] == (ep.query, 1, 400, "param_invalid", None, key_id)
    assert found[ids[2]][2:4] == (404, "query_not_found")
    # A NUL cannot travel in COPY: it is replaced, and the batch (and every later one) is written.
    assert found[ids[3]][0] == "odd\ufffdname\ttab"


def test_history_marks_admitted_calls_and_reads_them_back(api, endpoint, superuser, services):
    """A run records whether it passed admission (its key's quota was charged: a call that
    fails after admission counts, one refused before it does not); ``AdmittedUsage`` reads
    back what a key was admitted since a time, as a quota counter lost with Redis is rebuilt."""
    ep = endpoint(SERIES, SERIES_PARAMS)
    since = time.time() - 1
    replies = [api.call(ep.query, ep.secret, {"total": "3"}), api.call(ep.query, ep.secret, {"total": "4"}),
               api.call(ep.query, ep.secret, {"total": "x"}),      # 400 after admission: charged
               api.call(unique("nothing"), ep.secret)]             # 404 before admission: not charged
    ids = [r.headers["X-Request-Id"] for r in replies]
    assert len(wait_for_history(superuser, ids)) == 4
    key_id = superuser("SELECT id FROM gw_api_keys WHERE name = %s", (ep.key,))[0][0]
    flags = dict(superuser("SELECT request_id, admitted FROM gw_run_history WHERE request_id = ANY(%s)", (ids,)))
    assert [flags[i] for i in ids] == [True, True, True, False]
    usage = AdmittedUsage(lambda: psycopg2.connect(services.store_url))
    try:
        assert usage(key_id, since) == (3, 7)
        assert usage(key_id, time.time() + 60) == (0, 0)
        # Runs written before the column existed count when they succeeded.
        superuser("UPDATE gw_run_history SET admitted = NULL WHERE request_id = ANY(%s)", (ids,))
        assert usage(key_id, since) == (2, 7)
    finally:
        usage.close()
