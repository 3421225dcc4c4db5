"""Every stable error code is produced for real, with the documented status and body shape."""
from __future__ import annotations

import re
import threading
import time
from types import SimpleNamespace

import falcon.testing
import psycopg2
import psycopg2.extensions
import pytest

from gateway.errors import CODES
from gateway.http.common import ARRIVED
from gateway.http.management import ROUTES
from gateway.ports import LocalSync
from helpers import raw
from helpers.api import Reply
from helpers.ports import free_port
from helpers.util import ADMIN_KEY, ROOT, unique, wait_until

# A 500 is a bug: no request is supposed to be able to cause one.
NOT_PRODUCIBLE = {"internal_error"}
# Codes of features still being built while this suite was written; each needs a producer
# below once its feature lands.
PENDING: dict = {}


def _dead_redis_app(ctx, **overrides):
    return ctx.make_app(redis_url=f"redis://127.0.0.1:{free_port()}/0", **overrides)


def _terminate(ctx, *connections) -> None:
    pids = [conn.info.backend_pid for conn in connections]
    assert pids
    ctx.superuser("SELECT pg_terminate_backend(pid, 5000) FROM unnest(%s::int[]) AS pid", (pids,))


def _store_unavailable(ctx):
    """A store that refuses new sessions (its own database, so nothing else is disturbed)."""
    database = unique("gateway_store").lower()
    ctx.services.pg.ensure_database(database)
    app = ctx.make_app(sync=LocalSync(), database_url=ctx.services.pg.url(database))
    client = falcon.testing.TestClient(app)
    assert client.simulate_get("/api/v1/connections", headers=ctx.api.admin).status_code == 200
    ctx.superuser(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
    # The admin pool keeps a session open: end it too, so nothing reaches the store.
    ctx.superuser("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (database,))
    try:
        got = client.simulate_get("/api/v1/connections", headers=ctx.api.admin)
        ready = client.simulate_get("/ready")
        assert ready.status_code == 503 and ready.json["checks"]["store"] is False
    finally:
        ctx.superuser(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
    assert client.simulate_get("/api/v1/connections", headers=ctx.api.admin).status_code == 200  # recovers
    return got


def _catalog_stale(ctx):
    """Bus unreachable, so every request confirms the catalog with the store; the store
    becomes unreachable: the worker cannot confirm, and says so instead of serving. (A
    store session that merely died is replaced on the spot: see tests/execution/test_healing.py.)"""
    ep = ctx.endpoint("SELECT 1 AS one")
    app = _dead_redis_app(ctx)
    client = falcon.testing.TestClient(app)
    headers = {"X-API-Key": ep.secret}
    assert client.simulate_get(f"/q/{ep.query}", headers=headers).status_code == 200
    holder = app.parts.holder
    connect = holder._connect

    closed_port = free_port()   # a real connection attempt, refused: nothing listens there
    holder._connect = lambda: psycopg2.connect(host="127.0.0.1", port=closed_port, connect_timeout=2)
    try:
        _terminate(ctx, holder._conn)
        got = client.simulate_get(f"/q/{ep.query}", headers=headers)
    finally:
        holder._connect = connect
    assert client.simulate_get(f"/q/{ep.query}", headers=headers).status_code == 200  # recovers
    return got


def _admission_unavailable(ctx):
    ep = ctx.endpoint("SELECT 1 AS one")
    secret = ctx.api.key([ep.query], [ep.connection], rate_limit="1000/second")
    app = _dead_redis_app(ctx, redis_failure="closed")
    return falcon.testing.TestClient(app).simulate_get(f"/q/{ep.query}", headers={"X-API-Key": secret})


def _pool_exhausted(ctx):
    """The pool's one session held by something other than a call (as the warm-up or a schema
    read may hold one): calls never hold more sessions than their connection's bulkhead has
    places, and it has no more places than the pool has sessions."""
    ep = ctx.endpoint("SELECT 1 AS one")
    app = ctx.make_app(sync=LocalSync(), pool_size=1)
    pool = app.parts.pools.get(app.parts.holder.catalog.connections[ep.connection], False)
    pool.wait_s = 0.1
    session = pool.acquire()
    try:
        return falcon.testing.TestClient(app).simulate_get(f"/q/{ep.query}", headers={"X-API-Key": ep.secret})
    finally:
        pool.release(session)


def _sleeping_in_the_database(ctx) -> None:
    """Until a call's ``pg_sleep`` runs in the demo database."""
    wait_until(lambda: ctx.superuser("SELECT 1 FROM pg_stat_activity WHERE wait_event = 'PgSleep'", db="demo"),
               10, 0.01, "the holder's statement running")


def _connection_busy(ctx):
    """2 threads: 1 place on the connection, held by a call that does not come back (pg_sleep);
    nothing moves on it for longer than GATEWAY_CONNECTION_STALL_MS (200 ms here)."""
    ep = ctx.endpoint("SELECT pg_sleep(:s) AS slept", {"s": {"type": "float", "default": 0}})
    app = ctx.make_app(sync=LocalSync(), threads=2, connection_stall_ms=200)
    client = falcon.testing.TestClient(app)
    headers = {"X-API-Key": ep.secret}
    holder = threading.Thread(target=client.simulate_get, args=(f"/q/{ep.query}",),
                              kwargs={"params": {"s": "1.5"}, "headers": headers})
    holder.start()
    _sleeping_in_the_database(ctx)
    time.sleep(0.3)   # a sleep that is the test: past GATEWAY_CONNECTION_STALL_MS, nothing having moved
    try:
        return client.simulate_get(f"/q/{ep.query}", headers=headers)
    finally:
        holder.join()


def _deadline_exceeded(ctx):
    """``timeout=2`` for a request the server stamped as arrived 3 s ago (it waited for a thread)."""
    ep = ctx.endpoint("SELECT 1 AS one")
    return ctx.client.simulate_get(f"/q/{ep.query}", params={"timeout": "2"}, headers={"X-API-Key": ep.secret},
                                   extras={ARRIVED: time.monotonic() - 3})


def _too_many_concurrent(ctx):
    ep = ctx.endpoint("SELECT pg_sleep(:s) AS slept", {"s": {"type": "float", "default": 0}})
    secret = ctx.api.key([ep.query], [ep.connection], max_concurrent=1)
    holder = threading.Thread(target=ctx.api.call, args=(ep.query, secret), kwargs={"params": {"s": "1"}})
    holder.start()
    _sleeping_in_the_database(ctx)    # the holder has its place
    try:
        return ctx.api.call(ep.query, secret)
    finally:
        holder.join()


def _raw(result):
    return Reply(result.status_code, result.headers, result.content)


def _dup_connection(ctx):
    name = ctx.api.connection()
    return ctx.api.manage("POST", "/connections", {"name": name, "host": "h", "database": "d", "user": "u"})


def _dup_query(ctx):
    name = ctx.api.query("SELECT 1", connection=ctx.demo)
    return ctx.api.manage("POST", "/queries", {"name": name, "connection_name": ctx.demo, "sql": "SELECT 2"})


def _dup_key(ctx):
    name = unique("key")
    ctx.api.key(name=name)
    return ctx.api.manage("POST", "/api-keys", {"name": name})


def _connection_in_use(ctx):
    name = ctx.api.connection()
    ctx.api.query("SELECT 1", connection=name)
    return ctx.api.manage("DELETE", f"/connections/{name}")


def _password_sealed_elsewhere(ctx):
    from gateway.crypto import PasswordBox
    name = ctx.api.connection(password=ctx.services.pg.password())
    foreign = PasswordBox("another server's secret key").seal(ctx.services.pg.password())
    ctx.superuser("UPDATE gw_connections SET password = %s WHERE name = %s", (foreign, name))
    ctx.api.ok("PATCH", f"/connections/{name}", {"active": True})      # the fleet reloads it
    return ctx.api.manage("POST", "/queries", {"name": unique("q"), "sql": "SELECT 1", "connection_name": name})


def _rotate_twice(ctx):
    name = ctx.api.named_key()[0]
    ctx.api.ok("POST", f"/api-keys/{name}/rotate", {})
    return ctx.api.manage("POST", f"/api-keys/{name}/rotate", {})


def _draft(ctx):
    query = ctx.api.query("SELECT 1", connection=ctx.demo, publish=False)
    return query, ctx.api.key([query], [])


def _inactive(ctx):
    name = ctx.api.connection(active=False)
    ep = ctx.api.endpoint("SELECT 1", connection=name)
    return ctx.api.call(ep.query, ep.secret)


def _unreachable(ctx):
    # Saved while reachable (saving reads the schema), then pointed at a port nobody serves.
    connection = ctx.api.connection()
    ep = ctx.api.endpoint("SELECT 1", connection=connection)
    assert ctx.api.manage("PATCH", f"/connections/{connection}", {"port": free_port()}).status == 200
    return ctx.api.call(ep.query, ep.secret)


def _save(sql):
    return lambda ctx: ctx.api.manage("POST", "/queries", {"name": unique("q"), "connection_name": ctx.demo,
                                                           "sql": sql})


def _function_opaque(ctx):
    name = unique("f").lower()
    ctx.superuser(f"CREATE FUNCTION {name}() RETURNS int LANGUAGE sql AS 'SELECT 1'", db="demo")
    return _call(f"SELECT {name}() AS one", key_fields={"allowed_tables": ["public.customers"]})(ctx)


def _write_op_not_allowed(ctx):
    ep = ctx.endpoint("DELETE FROM orders WHERE id = -1")
    secret = ctx.api.key([ep.query], [ep.connection], allow_writes=True, allowed_write_ops=["insert"])
    app = ctx.make_app(sync=LocalSync(), allow_writes=True)   # loads the catalog made above
    client = falcon.testing.TestClient(app)
    return client.simulate_get(f"/q/{ep.query}", headers={"X-API-Key": secret})


def _too_many_rows_affected(ctx):
    """A guarded write past its max_affected_rows, on a server that allows writes: rolled back."""
    ep = ctx.endpoint("UPDATE orders SET status = status WHERE id <= 3", max_affected_rows=1)
    secret = ctx.api.key([ep.query], [ep.connection], allow_writes=True)
    client = falcon.testing.TestClient(ctx.make_app(sync=LocalSync(), allow_writes=True))
    versions = "SELECT xmin::text FROM orders WHERE id <= 3 ORDER BY id"
    before = ctx.superuser(versions, db="demo")
    got = client.simulate_get(f"/q/{ep.query}", headers={"X-API-Key": secret})
    assert ctx.superuser(versions, db="demo") == before   # nothing was changed
    return _raw(got)


def _events_unavailable(ctx):
    """Live events off (GATEWAY_EVENTS=0), or no Redis at all."""
    no_redis = ctx.make_app(sync=LocalSync(), redis_url="")
    got = falcon.testing.TestClient(no_redis).simulate_get("/events", headers=ctx.api.admin)
    assert (got.status_code, got.json["code"]) == (503, "events_unavailable")
    off = ctx.make_app(sync=LocalSync(), events=False)
    return _raw(falcon.testing.TestClient(off).simulate_get("/events", headers=ctx.api.admin))


def _open_stream(app, headers):
    """GET /events straight through WSGI: the stream (an endless iterable) is started, not drained."""
    started = {}
    body = app(falcon.testing.create_environ(path="/events", headers=headers),
               lambda status, headers, exc_info=None: started.update(status=status))
    assert started["status"].startswith("200"), started
    assert next(iter(body)).startswith(b": connected")
    return body


def _concurrent_change(ctx):
    # The connection changes every time the query's analysis reads its schema (outside the
    # write transaction): the save gives up after three tries instead of storing a version
    # analysed against a connection that is no longer the stored one.
    app = ctx.make_app(sync=LocalSync())
    manage = app.parts.manage
    schemas = manage.queries._schemas
    read_schema = schemas.fresh

    def changing(connection):
        got = read_schema(connection)
        manage.connections.update(connection.name, {"active": True})   # bumps updated_at
        return got
    schemas.fresh = changing
    try:
        return _raw(falcon.testing.TestClient(app).simulate_post(
            "/api/v1/queries", headers=ctx.api.admin,
            json={"name": unique("q"), "connection_name": ctx.demo, "sql": "SELECT 1 AS one"}))
    finally:
        schemas.fresh = read_schema


def _too_many_streams(ctx):
    app = ctx.make_app(sync=LocalSync(), events_max_streams=1)
    stream = _open_stream(app, ctx.api.admin)
    try:
        got = falcon.testing.TestClient(app).simulate_get("/events", headers=ctx.api.admin)
    finally:
        stream.close()
    _open_stream(app, ctx.api.admin).close()   # a closed stream frees its place
    return _raw(got)


def _call(sql, params=None, query_string=None, spec=None, body=None, key_fields=None):
    def produce(ctx):
        ep = ctx.endpoint(sql, spec)
        if key_fields is not None:
            secret = ctx.api.key(**{"queries": [ep.query], "connections": [ep.connection], **key_fields})
        else:
            secret = ep.secret
        if body is not None:
            return ctx.api.post(ep.query, secret, body)
        return ctx.api.call(ep.query, secret, params, query_string=query_string)
    return produce


def _twice(sql, **key_fields):
    def produce(ctx):
        ep = ctx.endpoint(sql)
        secret = ctx.api.key([ep.query], [ep.connection], **key_fields)
        first = ctx.api.call(ep.query, secret)
        assert first.status == 200, first
        return ctx.api.call(ep.query, secret)
    return produce


class _BrokenBody:
    """A request body whose reading fails, as gunicorn's does on a bad chunk size
    (tests/fleet/test_malformed_bodies.py sends the real bytes to a real master)."""

    def read(self, size=-1):
        raise OSError("Invalid chunk size: 'zz'")

    readline = readlines = read

    def __iter__(self):
        return iter(())


def test_a_body_the_application_cannot_read_is_malformed_request(ctx):
    """Behind a server without the front (TLS, another server), a body that breaks while the
    application reads it is the same typed 400, and closes."""
    check_error(_malformed_body(ctx), "malformed_request")


def _malformed_body(ctx):
    ep = ctx.endpoint("SELECT 1 AS one")
    got = ctx.client.simulate_post(f"/q/{ep.query}", headers={"X-API-Key": ep.secret,
                                                               "Content-Type": "application/json",
                                                               "Transfer-Encoding": "chunked"},
                                   extras={"wsgi.input": _BrokenBody(), "wsgi.input_terminated": True})
    assert got.headers["Connection"] == "close"
    return _raw(got)


def _post_matching_etag(ctx):
    """A POST whose If-None-Match names the ETag of the (cached) answer it would get."""
    ep = ctx.endpoint("SELECT 1 AS one", cache_ttl=60)
    etag = ctx.api.call(ep.query, ep.secret).headers["ETag"]
    return ctx.api.request("POST", f"/q/{ep.query}", json_body={},
                           headers={"X-API-Key": ep.secret, "If-None-Match": etag})


def _value_unrenderable(ctx):
    """No PostgreSQL value lacks a rendering any more (tests/execution/test_values.py): a data
    session whose int4 values are objects no format knows stands for a gap in the table."""
    from gateway.execution import values
    bad = psycopg2.extensions.new_type((23,), "GW_TEST_UNRENDERABLE", lambda text, cur: object())
    ep = ctx.endpoint("SELECT 1 AS v")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(values, "CASTERS", (*values.CASTERS, bad))
        client = falcon.testing.TestClient(ctx.make_app())
        got = client.simulate_get(f"/q/{ep.query}", headers={"X-API-Key": ep.secret})
    return Reply(got.status_code, got.headers, got.content)


def _from_the_front(data: bytes, wait_s: float = 5.0):
    """What the worker's front answers (fleet/server/front.py) to ``data`` on a new connection of the
    session's gunicorn master (its head timeout: 2 s)."""
    def produce(ctx):
        answer = raw.exchange(ctx.gunicorn().port, data, timeout=wait_s)
        assert answer.count(b"HTTP/1.1 ") == 1, answer         # one response, then the connection closed
        return raw.reply_of(answer)
    return produce


PRODUCERS = {
    "malformed_request": _from_the_front(b"POST /execute_sql HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                                         b"\r\nzz\r\n"),
    "request_timeout": _from_the_front(b"GET /health HTTP/1.1\r\nHost: x\r\n", wait_s=10),
    "headers_too_large": _from_the_front(b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n"),
    "unsupported_transfer_coding": _from_the_front(b"POST /execute_sql HTTP/1.1\r\nHost: x\r\n"
                                                   b"Transfer-Encoding: gzip, chunked\r\n\r\n"),
    "value_unrenderable": _value_unrenderable,
    "invalid_body": lambda ctx: ctx.api.request("POST", "/api/v1/connections", body=b"{not json",
                                                headers={**ctx.api.admin, "Content-Type": "application/json"}),
    "param_invalid": _call("SELECT :i AS i", {"i": "x"}, spec={"i": {"type": "int"}}),
    "param_required": _call("SELECT :i AS i", spec={"i": {"type": "int", "required": True}}),
    "pattern_unsupported": lambda ctx: ctx.api.manage("POST", "/queries", {
        "name": unique("q"), "connection_name": ctx.demo, "sql": "SELECT :s AS s",
        "parameters": {"s": {"type": "str", "pattern": r"(\w)\1"}}}),
    "invalid_paging": _call("SELECT 1", {"page": "0"}),
    "invalid_format": _call("SELECT 1", {"format": "xlsx"}),
    "invalid_timeout": _call("SELECT 1", {"timeout": "abc"}),
    "invalid_stream": _call("SELECT 1", {"stream": "true", "format": "json"}),
    "invalid_version": _call("SELECT 1", {"version": "abc"}),
    "invalid_cache": _call("SELECT 1", {"cache": "sometimes"}),
    "precondition_failed": _post_matching_etag,
    "metrics_disabled": lambda ctx: _raw(falcon.testing.TestClient(ctx.make_app(sync=LocalSync(), metrics_token=""))
                                         .simulate_get("/metrics", headers={"Authorization": "Bearer x"})),
    "invalid_sql": lambda ctx: ctx.api.manage("POST", "/queries", {"name": unique("q"), "connection_name": ctx.demo,
                                                                    "sql": "SELECT 'unterminated"}),
    "multiple_statements": _save("SELECT 1; SELECT 2"),
    "sql_not_allowed": _save("SELECT id FROM orders FOR UPDATE"),
    "function_not_allowed": _save("SELECT pg_read_file('/etc/passwd') AS f"),
    "unknown_table": _save("SELECT * FROM no_such_table"),
    "catalog_not_allowed": _save("SELECT query FROM pg_stat_activity"),
    "unknown_column": _save("SELECT no_such_column FROM customers"),
    "analysis_failed": _save("SELECT * FROM customers c, LATERAL pg_catalog.json_each('{}')"),
    "table_not_allowed": _call("SELECT id FROM customers", key_fields={"allowed_tables": ["public.orders"]}),
    "mask_unresolvable": _call("SELECT row_to_json(c) AS r FROM customers c",
                               key_fields={"mask": [{"column": "customers.email", "action": "hash"}]}),
    "ip_not_allowed": _call("SELECT 1 AS one", key_fields={"allowed_ips": ["10.0.0.0/8"]}),
    "function_opaque": lambda ctx: _function_opaque(ctx),
    "write_op_not_allowed": lambda ctx: _raw(_write_op_not_allowed(ctx)),
    "concurrent_change": lambda ctx: _concurrent_change(ctx),
    "query_failed": _call("SELECT 10 / :d AS q", {"d": "0"}, spec={"d": {"type": "int"}}),
    "unauthorized": lambda ctx: ctx.api.call(ctx.endpoint("SELECT 1").query, None),
    "key_expired": _call("SELECT 1", key_fields={"expires_at": "2001-01-01T00:00:00Z"}),
    # Granted neither the query nor its connection (grants are additive).
    "connection_forbidden": lambda ctx: ctx.api.call(ctx.api.endpoint("SELECT 1").query,
                                                     ctx.endpoint("SELECT 2").secret),
    "admin_only": lambda ctx: ctx.api.request("GET", "/api/v1/connections",
                                              headers={"X-API-Key": ctx.endpoint("SELECT 1").secret}),
    "unknown_field": lambda ctx: ctx.api.manage("POST", "/api-keys", {"name": unique("k"), "colour": "red"}),
    "connection_required": lambda ctx: ctx.api.adhoc(ctx.api.key([], [ctx.demo]), {"sql": "SELECT 1"}),
    "sql_required": lambda ctx: ctx.api.adhoc(ctx.api.key([], [ctx.demo]), {"connection_name": ctx.demo}),
    "not_published": lambda ctx: ctx.api.call(*_draft(ctx)),
    "key_rotation_pending": lambda ctx: _rotate_twice(ctx),
    "previous_secret_not_found": lambda ctx: ctx.api.manage("DELETE", f"/api-keys/{ctx.api.named_key()[0]}/previous"),
    "write_not_allowed": _call("DELETE FROM orders WHERE id = -1"),
    "query_not_found": lambda ctx: ctx.api.call(unique("none"), ctx.endpoint("SELECT 1").secret),
    "version_not_found": _call("SELECT 1", {"version": "2"}),
    "connection_not_found": lambda ctx: ctx.api.manage("GET", f"/connections/{unique('none')}"),
    "key_not_found": lambda ctx: ctx.api.manage("GET", f"/api-keys/{unique('none')}"),
    "cache_entry_not_found": lambda ctx: ctx.api.manage("GET", "/cache/entries/" + "0" * 32),
    "not_found": lambda ctx: ctx.api.request("GET", "/no/such/route"),
    "method_not_allowed": lambda ctx: ctx.api.manage("DELETE", "/connections"),
    "connection_exists": _dup_connection,
    "query_exists": _dup_query,
    "key_exists": _dup_key,
    "connection_in_use": _connection_in_use,
    "connection_password_unreadable": _password_sealed_elsewhere,
    "payload_too_large": lambda ctx: ctx.api.request("POST", f"/q/{unique('q')}", body=b"{" + b" " * 1_048_576 + b"}",
                                                     headers={"Content-Type": "application/json"}),
    "unsupported_media_type": lambda ctx: ctx.api.manage("POST", "/connections", body=b"name=x",
                                                         headers={"Content-Type": "application/x-www-form-urlencoded"}),
    "rate_limited": _twice("SELECT 1", rate_limit="1/minute"),
    "too_many_concurrent": _too_many_concurrent,
    "quota_exceeded": _twice("SELECT 1", quota={"calls": 1, "per": "day"}),
    "database_unavailable": _unreachable,
    "store_unavailable": lambda ctx: _raw(_store_unavailable(ctx)),
    "connection_inactive": _inactive,
    "admission_unavailable": lambda ctx: _raw(_admission_unavailable(ctx)),
    "catalog_stale": lambda ctx: _raw(_catalog_stale(ctx)),
    "pool_exhausted": lambda ctx: _raw(_pool_exhausted(ctx)),
    "connection_busy": lambda ctx: _raw(_connection_busy(ctx)),
    "deadline_exceeded": lambda ctx: _raw(_deadline_exceeded(ctx)),
    "query_timeout": _call("SELECT pg_sleep(1)", {"timeout": "0.05"}),
    "invalid_filter": lambda ctx: ctx.api.manage("GET", "/history", params={"colour": "red"}),
    "too_many_rows_affected": _too_many_rows_affected,
    "events_unavailable": _events_unavailable,
    "invalid_event_id": lambda ctx: ctx.api.request("GET", "/events", headers={**ctx.api.admin,
                                                                              "Last-Event-ID": "abc"}),
    "too_many_streams": _too_many_streams,
}


def test_every_code_has_a_producer():
    missing = set(CODES) - NOT_PRODUCIBLE - set(PENDING) - set(PRODUCERS)
    assert not missing, f"codes no test produces: {sorted(missing)}"
    assert set(PRODUCERS) <= set(CODES), set(PRODUCERS) - set(CODES)
    assert set(PENDING) <= set(CODES) and not set(PENDING) & set(PRODUCERS), "update PENDING"


@pytest.fixture
def ctx(api, client, endpoint, make_app, superuser, demo_connection, services, request):
    return SimpleNamespace(api=api, client=client, endpoint=endpoint, make_app=make_app, superuser=superuser,
                           demo=demo_connection, services=services,
                           gunicorn=lambda: request.getfixturevalue("gunicorn"))


def check_error(reply, code: str) -> dict:
    status = CODES[code][0]
    assert (reply.status, reply.json.get("code")) == (status, code), reply
    body = reply.json
    assert {"error", "code", "request_id"} <= set(body)
    assert set(body) - {"error", "code", "request_id"} <= {"errors", "sqlstate", "condition", "retry_after", "rows_affected",
                                                            "previous_expires_at",
                                                            "max_concurrent"}   # too_many_concurrent's, as QueryAPIGate's
    assert isinstance(body["error"], str) and body["error"]
    assert reply.headers["X-Request-Id"] == body["request_id"]
    assert reply.headers["Content-Type"] == "application/json"
    if status in (503, 429):
        assert int(reply.headers["Retry-After"]) >= 1
    return body


@pytest.mark.parametrize("code", sorted(PRODUCERS))
def test_code_is_produced(ctx, code):
    check_error(PRODUCERS[code](ctx), code)


def test_every_code_raised_in_the_source_is_listed():
    raised = set()
    patterns = [r'(?:bad_request|not_found|conflict|forbidden|unavailable)\(\s*"([a-z_]+)"',
                r'GatewayError\(\s*\d{3},\s*"([a-z_]+)"']
    for folder in ("gateway", "fleet"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            for pattern in patterns:
                raised.update(re.findall(pattern, text))
    from gateway.http.errors import FALCON_CODES as _FALCON_CODES
    raised.update(_FALCON_CODES.values())
    # data.py builds these from the reserved argument's name
    raised.update({"invalid_paging", "invalid_version", "invalid_timeout", "invalid_stream"})
    assert raised and raised <= set(CODES), raised - set(CODES)
    assert len(raised) > 25


# --- the HTTP edges ----------------------------------------------------------------------
@pytest.mark.parametrize("body, message", [
    (b"{not json", "not valid JSON"), (b"[1, 2]", "must be a JSON object"), (b'"text"', "must be a JSON object"),
    (b"42", "must be a JSON object"), (b"null", "must be a JSON object"), (b"\xff\xfe", "not valid JSON"),
])
def test_malformed_bodies(api, endpoint, body, message):
    ep = endpoint("SELECT 1 AS one")
    for reply in (api.request("POST", f"/q/{ep.query}", body=body,
                              headers={"X-API-Key": ep.secret, "Content-Type": "application/json"}),
                  api.manage("POST", "/api-keys", body=body, headers={"Content-Type": "application/json"})):
        assert message in check_error(reply, "invalid_body")["error"]


def test_empty_body_is_an_empty_object(api, endpoint):
    ep = endpoint("SELECT 1 AS one")
    got = api.request("POST", f"/q/{ep.query}", body=b"", headers={"X-API-Key": ep.secret})
    assert got.status == 200 and got.json == [{"one": 1}]


def test_post_body_fields(api, endpoint):
    ep = endpoint("SELECT 1 AS one")
    check_error(api.post(ep.query, ep.secret, {"params": [1]}), "invalid_body")
    assert "colour" in check_error(api.post(ep.query, ep.secret, {"colour": 1}), "invalid_body")["error"]


@pytest.mark.parametrize("path", ["/q/x", "/api/v1/connections"])
def test_payload_too_large(api, path):
    headers = {**api.admin, "Content-Type": "application/json"}
    check_error(api.request("POST", path, body=b'{"a": "' + b"x" * 1_048_600 + b'"}', headers=headers),
                "payload_too_large")


def test_body_limit_follows_the_setting(make_app, endpoint):
    ep = endpoint("SELECT :s AS s", {"s": "str"})
    client = falcon.testing.TestClient(make_app(sync=LocalSync(), max_body_bytes=100))
    headers = {"X-API-Key": ep.secret}
    assert client.simulate_post(f"/q/{ep.query}", json={"params": {"s": "x" * 50}}, headers=headers).status_code == 200
    got = client.simulate_post(f"/q/{ep.query}", json={"params": {"s": "x" * 100}}, headers=headers)
    assert got.status_code == 413 and got.json["code"] == "payload_too_large"


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
def test_wrong_content_type(api, endpoint, ctype):
    ep = endpoint("SELECT 1 AS one")
    got = api.request("POST", f"/q/{ep.query}", body=b'{"params": {}}',
                      headers={"X-API-Key": ep.secret, "Content-Type": ctype})
    check_error(got, "unsupported_media_type")
    ok = api.request("POST", f"/q/{ep.query}", body=b'{"params": {}}',
                     headers={"X-API-Key": ep.secret, "Content-Type": "application/json; charset=utf-8"})
    assert ok.status == 200


@pytest.mark.parametrize("method, path", [
    ("GET", "/"), ("GET", "/nope"), ("GET", "/q"), ("GET", "/api/v1"), ("GET", "/api/v2/connections"),
    ("POST", "/api/v1/connections/x/y/z"),
])
def test_unknown_routes(api, method, path):
    check_error(api.request(method, path, headers=api.admin), "not_found")


@pytest.mark.parametrize("method, path", [
    ("PUT", "/q/x"), ("DELETE", "/q/x"), ("DELETE", "/api/v1/connections"), ("PUT", "/api/v1/queries"),
    ("GET", "/api/v1/queries/x/publish"), ("POST", "/health"), ("DELETE", "/ready"),
])
def test_wrong_method(api, method, path):
    got = api.request(method, path, headers=api.admin)
    check_error(got, "method_not_allowed")
    assert got.headers.get("Allow"), "a 405 must say which methods the route has"


def _route_calls():
    for path, resource in ROUTES:
        concrete = path.replace("{name}", "anything")
        for method in ("GET", "POST", "PATCH", "PUT", "DELETE"):
            if hasattr(resource, f"on_{method.lower()}"):
                yield method, concrete


@pytest.mark.parametrize("method, path", list(_route_calls()))
@pytest.mark.parametrize("given", [None, "", "wrong", ADMIN_KEY + "x", ADMIN_KEY[:-1]],
                         ids=["none", "empty", "wrong", "admin-and-more", "admin-cut-short"])
def test_management_needs_the_admin_key(api, method, path, given):
    headers = {"Content-Type": "application/json"}
    if given is not None:
        headers["X-API-Key"] = given
    got = api.request(method, path, body=b"{}", headers=headers)
    check_error(got, "unauthorized")


def test_a_data_key_is_not_an_admin_key(api, endpoint):
    ep = endpoint("SELECT 1")
    check_error(api.request("GET", "/api/v1/connections", headers={"X-API-Key": ep.secret}), "admin_only")


def test_no_admin_key_configured_refuses_everyone(make_app):
    client = falcon.testing.TestClient(make_app(sync=LocalSync(), admin_key=""))
    for headers in ({}, {"X-API-Key": ""}, {"X-API-Key": ADMIN_KEY}):
        got = client.simulate_get("/api/v1/connections", headers=headers)
        assert got.status_code == 401 and got.json["code"] == "unauthorized"


def test_request_ids_are_unique(api, endpoint):
    ep = endpoint("SELECT 1 AS one")
    ids = [api.call(ep.query, ep.secret).headers["X-Request-Id"] for _ in range(5)]
    ids += [api.request("GET", "/nope").json["request_id"] for _ in range(5)]
    assert len(set(ids)) == 10
