"""The Management API, driven the way a QueryAPIGate user's script drives it."""
from __future__ import annotations

import hashlib

import pytest

from helpers.util import PASSWORD_ENV, unique


def test_connection_lifecycle(api, monkeypatch, services):
    # The password is a reference to the server's environment, resolved when a session opens.
    env_name = unique("GW_TEST_PW").upper()
    monkeypatch.setenv(env_name, services.pg.password())
    name = unique("conn")
    doc = {"name": name, "db": "postgres", "host": "127.0.0.1", "port": services.pg.port, "database": "demo",
           "user": "postgres", "password": "${%s}" % env_name}
    created = api.manage("POST", "/connections", doc)
    assert created.status == 201, created
    assert created.json["name"] == name and created.json["password"] == "********"
    assert created.json["port"] == services.pg.port and created.json["user"] == "postgres"

    again = api.manage("POST", "/connections", doc)
    assert again.status == 409 and again.json["code"] == "connection_exists"

    listed = api.manage("GET", "/connections")
    assert listed.status == 200
    assert name in [c["name"] for c in listed.json["items"]]
    assert services.pg.password() not in listed.text

    query = api.query("SELECT current_user AS who, current_database() AS db", connection=name)
    secret = api.key([query], [name])
    got = api.call(query, secret)
    assert got.status == 200, got
    assert got.json == [{"who": "postgres", "db": "demo"}]

    in_use = api.manage("DELETE", f"/connections/{name}")
    assert in_use.status == 409 and in_use.json["code"] == "connection_in_use"
    assert api.manage("DELETE", f"/queries/{query}").status == 204
    assert api.manage("DELETE", f"/connections/{name}").status == 204
    gone = api.manage("GET", f"/connections/{name}")
    assert gone.status == 404 and gone.json["code"] == "connection_not_found"
    assert api.manage("DELETE", f"/connections/{name}").json["code"] == "connection_not_found"


def test_unset_environment_password_fails_to_connect(api):
    name = api.connection()
    query = api.query("SELECT 1 AS one", connection=name)
    # Saved while the password worked; now it names a variable the server does not have.
    unset = "${GW_TEST_NEVER_SET_%s}" % unique("x").upper()
    assert api.manage("PATCH", f"/connections/{name}", {"password": unset}).status == 200
    got = api.call(query, api.key([query], [name]))
    assert got.status == 503 and got.json["code"] == "database_unavailable", got
    assert got.headers["Retry-After"]


def test_literal_password_and_patch(api, services):
    name = api.connection(password=services.pg.password())
    query = api.query("SELECT 1 AS one", connection=name)
    secret = api.key([query], [name])
    assert api.call(query, secret).status == 200
    # A wrong password takes effect at once (the pool is replaced).
    patched = api.manage("PATCH", f"/connections/{name}", {"password": "wrong"})
    assert patched.status == 200 and patched.json["password"] == "********"
    assert api.call(query, secret).json["code"] == "database_unavailable"
    assert api.manage("PATCH", f"/connections/{name}", {"password": "${%s}" % PASSWORD_ENV}).status == 200
    assert api.call(query, secret).status == 200
    assert api.manage("PATCH", f"/connections/{unique('none')}", {"port": 1}).json["code"] == \
        "connection_not_found"


def test_a_password_sealed_under_another_secret_key_is_a_typed_conflict(api, services, superuser):
    """A store moved between servers whose GATEWAY_SECRET_KEY differ: the password cannot be
    opened. Saving a query on the connection and calling one answer 409, never 500."""
    from gateway.crypto import PasswordBox
    name = api.connection(password=services.pg.password())
    query = api.query("SELECT 1 AS one", connection=name)
    secret = api.key([query], [name])
    assert api.call(query, secret).status == 200
    foreign = PasswordBox("another server's secret key").seal(services.pg.password())
    superuser("UPDATE gw_connections SET password = %s WHERE name = %s", (foreign, name))
    assert api.manage("PATCH", f"/connections/{name}", {"port": services.pg.port}).status == 200   # the fleet reloads it
    saved = api.manage("POST", "/queries", {"name": unique("q"), "sql": "SELECT 2 AS two", "connection_name": name})
    assert (saved.status, saved.json["code"]) == (409, "connection_password_unreadable"), saved
    called = api.call(query, secret)
    assert (called.status, called.json["code"]) == (409, "connection_password_unreadable"), called
    assert api.manage("PATCH", f"/connections/{name}", {"password": services.pg.password()}).status == 200
    assert api.call(query, secret).status == 200


@pytest.mark.parametrize("doc, field", [
    ({"db": "mysql"}, "db"), ({"port": "x"}, "port"), ({"port": 70000}, "port"), ({"port": True}, "port"),
    ({"port": "\u00b2"}, "port"),   # str.isdigit() takes it, int() does not
    ({"host": ""}, "host"), ({"password": 5}, "password"), ({"active": "yes"}, "active"),
    ({"options": []}, "options"), ({"colour": "red"}, "colour"), ({"sslmode": True}, "options"),
])
def test_invalid_connection(api, doc, field):
    base = {"name": unique("conn"), "host": "127.0.0.1", "port": 5432, "database": "demo", "user": "postgres"}   # refused unopened
    got = api.manage("POST", "/connections", {**base, **doc})
    assert got.status == 400 and got.json["code"] == ("unknown_field" if field == "colour" else "invalid_body"), got
    assert field in got.json["errors"]


def test_missing_connection_fields_and_bad_names(api):
    got = api.manage("POST", "/connections", {"name": unique("conn")})
    assert got.status == 400 and set(got.json["errors"]) == {"host", "database", "user"}
    for bad in ("", "has space", "-leading", "x" * 65, 5, None):
        got = api.manage("POST", "/connections", {"name": bad, "host": "h", "database": "d", "user": "u"})
        assert got.status == 400 and got.json["errors"] == {"name": "is missing or not a valid name"}, bad


def test_the_whole_flow(api, demo_connection):
    """Create a published query with an int and a str parameter, a key, and call it."""
    name = unique("orders_by_status")
    created = api.manage("POST", "/queries", {
        "name": name, "connection_name": demo_connection, "publish": True,
        "description": "orders of one status", "tags": ["shop", "orders"],
        "sql": "SELECT id, status FROM orders WHERE status = :status AND id <= :max_id ORDER BY id",
        "parameters": {"max_id": {"type": "int", "required": True, "min": 1},
                       "status": {"type": "str", "enum": ["paid", "shipped", "pending"], "default": "paid"}}})
    assert created.status == 201, created
    doc = created.json
    assert (doc["published_version"], doc["latest_version"], doc["has_draft"]) == (1, 1, False)
    assert doc["endpoint"] == f"/q/{name}" and doc["tags"] == ["orders", "shop"]
    assert doc["versions"][0]["status"] == "published" and doc["versions"][0]["kind"] == "read"
    assert api.manage("POST", "/queries", {"name": name, "connection_name": demo_connection,
                                           "sql": "SELECT 1"}).json["code"] == "query_exists"

    key_name = unique("key")
    key = api.manage("POST", "/api-keys", {"name": key_name, "queries": [name], "connections": [demo_connection]})
    assert key.status == 201, key
    assert key.headers["Cache-Control"] == "no-store"
    secret = key.json["secret"]
    assert secret.startswith(key.json["key_prefix"]) and len(secret) > 40
    # The secret is shown once: never by GET or list.
    shown = api.manage("GET", f"/api-keys/{key_name}")
    assert shown.status == 200 and "secret" not in shown.json and secret not in shown.text
    assert shown.json["queries"] == [name] and shown.json["active"] is True
    listed = api.manage("GET", "/api-keys")
    assert key_name in [k["name"] for k in listed.json["items"]] and secret not in listed.text
    duplicate = api.manage("POST", "/api-keys", {"name": key_name})
    assert duplicate.status == 409 and duplicate.json["code"] == "key_exists"

    got = api.call(name, secret, {"max_id": "20"})
    assert got.status == 200, got
    assert got.json == [{"id": i, "status": "paid"} for i in (1, 2, 8, 9, 10, 16, 17, 18)]
    posted = api.post(name, secret, {"params": {"max_id": 20, "status": "shipped"}, "format": "csv"})
    assert posted.status == 200 and posted.text == "id,status\n3,shipped\n4,shipped\n11,shipped\n12,shipped\n19,shipped\n20,shipped\n"
    bad = api.call(name, secret, {"max_id": "20", "status": "lost"})
    assert bad.status == 400 and bad.json["code"] == "param_invalid" and "status" in bad.json["errors"]

    listed_queries = api.manage("GET", "/queries")
    summary = next(q for q in listed_queries.json["items"] if q["name"] == name)
    assert "versions" not in summary and summary["published_version"] == 1


def test_key_grants(api, demo_connection):
    query = api.query("SELECT 1 AS one", connection=demo_connection)
    other = api.query("SELECT 2 AS two", connection=demo_connection)

    # Additive (QueryAPIGate's rule): a query by its name, or every query of a granted connection.
    by_name = api.key([query])
    assert api.call(query, by_name).json == [{"one": 1}]
    got = api.call(other, by_name)
    assert got.status == 403 and got.json["code"] == "connection_forbidden", got

    by_connection = api.key([], [demo_connection])
    assert api.call(query, by_connection).status == 200 and api.call(other, by_connection).status == 200
    elsewhere = api.query("SELECT 3 AS three", connection=api.connection())
    got = api.call(elsewhere, by_connection)
    assert got.status == 403 and got.json["code"] == "connection_forbidden", got
    unknown = api.call(unique("nothing"), by_connection)
    assert unknown.status == 404 and unknown.json["code"] == "query_not_found"

    wildcard = api.key(["*"], ["*"])
    assert api.call(query, wildcard).json == [{"one": 1}]
    assert api.call(other, wildcard).json == [{"two": 2}]

    # Grants changed by PATCH apply to the next call.
    name = unique("key")
    secret = api.key([other], [], name=name)
    assert api.call(query, secret).status == 403
    assert api.manage("PATCH", f"/api-keys/{name}", {"queries": [query, other]}).status == 200
    assert api.call(query, secret).status == 200


def test_rotate_delete_and_deactivate(api, demo_connection):
    query = api.query("SELECT 1 AS one", connection=demo_connection)
    name = unique("key")
    old = api.key([query], [demo_connection], name=name)
    assert api.call(query, old).status == 200

    rotated = api.manage("POST", f"/api-keys/{name}/rotate", {"grace_minutes": 0})   # no grace: a leaked secret
    assert rotated.status == 200 and rotated.headers["Cache-Control"] == "no-store"
    new = rotated.json["secret"]
    assert new != old and rotated.json["rotated_at"]
    assert api.call(query, new).status == 200
    stale = api.call(query, old)
    assert stale.status == 401 and stale.json["code"] == "unauthorized"

    off = api.manage("PATCH", f"/api-keys/{name}", {"active": False})
    assert off.status == 200 and off.json["active"] is False
    assert api.call(query, new).json["code"] == "unauthorized"
    assert api.manage("PATCH", f"/api-keys/{name}", {"active": True}).status == 200
    assert api.call(query, new).status == 200

    assert api.manage("DELETE", f"/api-keys/{name}").status == 204
    after = api.call(query, new)
    assert after.status == 401 and after.json["code"] == "unauthorized"
    for method, path in (("GET", f"/api-keys/{name}"), ("DELETE", f"/api-keys/{name}"),
                         ("POST", f"/api-keys/{name}/rotate"), ("PATCH", f"/api-keys/{name}")):
        got = api.manage(method, path, {"active": True}) if method == "PATCH" else api.manage(method, path)
        assert got.status == 404 and got.json["code"] == "key_not_found", (method, got)


def test_expired_key(api, demo_connection):
    query = api.query("SELECT 1 AS one", connection=demo_connection)
    name = unique("key")
    secret = api.key([query], [demo_connection], name=name, expires_at="2000-01-01")
    got = api.call(query, secret)
    assert got.status == 401 and got.json["code"] == "key_expired", got
    shown = api.manage("GET", f"/api-keys/{name}").json
    assert shown["expired"] is True and shown["expires_at"].startswith("2000-01-01T23:59:59")   # through the day
    renewed = api.manage("PATCH", f"/api-keys/{name}", {"expires_at": "2999-01-01T00:00:00+00:00"})
    assert renewed.status == 200 and renewed.json["expired"] is False
    assert api.call(query, secret).status == 200
    bad = api.manage("PATCH", f"/api-keys/{name}", {"expires_at": "soon"})
    assert bad.status == 400 and bad.json["errors"] == {"expires_at": "must be an ISO 8601 date or datetime"}


def test_unknown_or_wrong_key_secrets(api, demo_connection):
    query = api.query("SELECT 1 AS one", connection=demo_connection)
    secret = api.key([query], [demo_connection])
    forged = secret[:-4] + ("aaaa" if not secret.endswith("aaaa") else "bbbb")
    for given in (None, "", "nonsense", "gw_x", "gw_000000000000_abc", forged, secret.upper()):
        got = api.call(query, given)
        assert got.status == 401 and got.json["code"] == "unauthorized", (given, got)


def test_query_refers_to_an_unknown_connection(api):
    got = api.manage("POST", "/queries", {"name": unique("q"), "connection_name": unique("none"),
                                          "sql": "SELECT 1"})
    assert got.status == 404 and got.json["code"] == "connection_not_found"


@pytest.mark.parametrize("body, field", [
    ({"sql": "SELECT 1", "colour": 1}, "colour"),
    ({"sql": "SELECT 1"}, "connection_name"),
    ({"sql": "SELECT :x", "parameters": {"x": {"type": "money"}}}, "x"),
])
def test_invalid_query_bodies(api, demo_connection, body, field):
    doc = {"name": unique("q"), "connection_name": demo_connection, **body}
    if field == "connection_name":
        del doc["connection_name"]
    got = api.manage("POST", "/queries", doc)
    assert got.status == 400 and got.json["code"] == ("unknown_field" if field == "colour" else "invalid_body"), got
    assert field in got.json["errors"]


def test_passwords_and_secrets_at_rest(api, services, superuser):
    plaintext = services.pg.password()
    name = api.connection(password=plaintext)
    stored = superuser("SELECT password FROM gw_connections WHERE name = %s", (name,))[0][0]
    assert plaintext not in stored and stored.startswith("v1:")
    # An environment reference is kept as written (it holds no secret).
    ref = api.connection()
    assert superuser("SELECT password FROM gw_connections WHERE name = %s", (ref,))[0][0] == "${%s}" % PASSWORD_ENV

    key_name = unique("key")
    secret = api.key(name=key_name)
    row = superuser("SELECT row_to_json(k)::text, secret_hash FROM gw_api_keys k WHERE name = %s", (key_name,))[0]
    assert secret not in row[0]
    assert secret.split("_", 2)[2] not in row[0]  # not even the random part
    assert bytes(row[1]) == hashlib.sha256(secret.encode()).digest()
    # Nothing in the whole store holds the secret or the plaintext password.
    dump = superuser("SELECT string_agg(t::text, ' ') FROM (SELECT row_to_json(c)::text AS t FROM gw_connections c "
                     "UNION ALL SELECT row_to_json(k)::text FROM gw_api_keys k) s")[0][0]
    assert plaintext not in dump and secret not in dump


def test_a_version_is_analysed_outside_the_write_and_again_if_its_connection_moved(api, make_app, demo_connection):
    # Reading the schema and analysing happen before the write transaction (no lock held
    # meanwhile); a connection changed in between makes the save analyse again, so the
    # stored analysis is always against the stored connection.
    import falcon.testing

    from gateway.ports import LocalSync
    app = make_app(sync=LocalSync())
    manage = app.parts.manage
    schemas = manage.queries._schemas
    read_schema, reads = schemas.fresh, []

    def changing_once(connection):
        reads.append(connection.name)
        got = read_schema(connection)
        if len(reads) == 1:
            manage.connections.update(connection.name, {"active": True})
        return got
    schemas.fresh = changing_once
    name = unique("q")
    got = falcon.testing.TestClient(app).simulate_post(
        "/api/v1/queries", headers=api.admin, json={"name": name, "connection_name": demo_connection,
                                                     "sql": "SELECT 1 AS one", "publish": True})
    assert got.status_code == 201, got.text
    assert reads == [demo_connection, demo_connection]
    audit = api.manage("GET", "/audit", params={"kind": "query", "name": name}).json["items"]
    assert [a["action"] for a in audit] == ["create"]     # the abandoned try left no trace


def test_concurrent_management_calls_wait_for_a_store_connection(gunicorn, services):
    """More management calls at once than the worker has store connections (4): each waits for
    one, none answers 503 store_unavailable while the store is up."""
    from concurrent.futures import ThreadPoolExecutor

    from helpers.api import Api
    admin = Api.over_http(gunicorn.base, services)
    try:
        with ThreadPoolExecutor(16) as pool:
            created = list(pool.map(lambda i: admin.manage("POST", "/api-keys", {"name": unique(f"burst{i}")}),
                                    range(48)))
    finally:
        admin.close()
    assert [r.status for r in created] == [201] * 48, [(r.status, r.text[:120]) for r in created if r.status != 201]
