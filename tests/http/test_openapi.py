"""``/openapi.json`` and ``/catalog`` (gateway/http/openapi.py): per calling key, only what it may
run; each document validates as OpenAPI 3.1 with a kept validator; a client that follows the
document gets answers."""
from __future__ import annotations

import falcon.testing
from openapi_spec_validator import validate

from gateway.ports import LocalSync
from helpers.api import Api
from helpers.util import ADMIN_KEY, unique


def own_paths(doc: dict) -> set[str]:
    return {p for p in doc["paths"] if p.startswith("/q/") and p != "/q/{name}"}


def test_a_key_sees_only_what_it_may_run(api, demo_connection):
    visible = api.query("SELECT :aid::int AS aid, :plan::text AS plan",
                        {"aid": {"type": "integer", "min": 1, "max": 60, "description": "An id"},
                         "plan": {"type": "str", "enum": ["free", "pro"], "default": "free"}},
                        connection=demo_connection, description="Echo an id")
    hidden = api.query("SELECT 2 AS two", connection=api.connection())
    refused = api.query("SELECT id FROM orders WHERE id = 1", connection=demo_connection)
    draft = api.query("SELECT 3 AS three", connection=demo_connection, publish=False)
    secret = api.key([visible, hidden, refused, draft], [], allowed_tables=["public.customers"])
    hidden_key = api.key([hidden], [])   # a key that is not granted `visible`: it learns nothing of it
    got = api.request("GET", "/openapi.json", headers={"X-API-Key": secret})
    assert got.status == 200 and got.headers["Cache-Control"] == "no-store", got
    doc = got.json
    validate(doc)                                     # OpenAPI 3.1, by openapi-spec-validator
    assert doc["openapi"] == "3.1.0"
    # `hidden` is on a connection the key may not use, but granted by name (additive): it is there.
    # `refused` reads a table outside allowed_tables; `draft` is not published.
    assert own_paths(doc) == {f"/q/{visible}", f"/q/{hidden}"}
    assert "/execute_sql" not in doc["paths"]         # no connection grant: no ad-hoc SQL
    get = doc["paths"][f"/q/{visible}"]["get"]
    params = {p["name"]: p for p in get["parameters"]}
    assert params["aid"] == {"name": "aid", "in": "query", "required": True, "description": "An id",
                             "schema": {"type": "integer", "format": "int64", "minimum": 1, "maximum": 60,
                                        "description": "An id"}}
    assert params["plan"]["required"] is False
    assert params["plan"]["schema"] == {"type": "string", "enum": ["free", "pro"], "default": "free"}
    assert get["summary"] == "Echo an id" and get["operationId"] == f"run_{visible}"
    body = doc["paths"][f"/q/{visible}"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["params"]["required"] == ["aid"]
    # A client that follows the document: the parameter names and types it lists are the ones that run.
    called = api.call(visible, secret, {"aid": "7"})
    assert called.status == 200 and called.json == [{"aid": 7, "plan": "free"}], called
    assert api.call(refused, secret).json["code"] == "table_not_allowed"
    other = api.request("GET", "/openapi.json", headers={"X-API-Key": hidden_key}).json
    assert own_paths(other) == {f"/q/{hidden}"}


def test_connections_and_the_admin_key(make_app, services):
    # On a store of its own: the admin key's document lists every query of its store, and the
    # session's store holds thousands by the end of the suite (validating them took 200 s).
    store = unique("gateway_store").lower()
    services.pg.ensure_database(store)
    api = Api.in_process(falcon.testing.TestClient(make_app(sync=LocalSync(), database_url=services.pg.url(store))),
                         services)
    connection = api.connection()
    query = api.query("SELECT 1 AS one", connection=connection)
    secret = api.key([], [connection])
    doc = api.request("GET", "/openapi.json", headers={"X-API-Key": secret}).json
    validate(doc)
    assert f"/q/{query}" in doc["paths"] and "/execute_sql" in doc["paths"]
    admin = api.request("GET", "/openapi.json", headers={"X-API-Key": ADMIN_KEY}).json
    validate(admin)
    assert f"/q/{query}" in admin["paths"]


def test_without_a_key_and_with_a_wrong_one(api):
    doc = api.request("GET", "/openapi.json").json
    validate(doc)
    assert own_paths(doc) == set() and {"/q/{name}", "/execute_sql", "/catalog"} <= set(doc["paths"])
    for path in ("/openapi.json", "/catalog"):
        got = api.request("GET", path, headers={"X-API-Key": "gw_nope_nope"})
        assert got.status == 401 and got.json["code"] == "unauthorized", (path, got)
    assert api.request("GET", "/catalog").status == 401


def test_catalog(api, demo_connection):
    query = api.query("SELECT :n::int AS n", {"n": "int"}, connection=demo_connection, description="n",
                      tags=["t"])
    name, secret = api.named_key([query], [], rate_limit="100/minute")
    got = api.request("GET", "/catalog", headers={"X-API-Key": secret})
    assert got.status == 200, got
    doc = got.json
    assert [q["name"] for q in doc["queries"]] == [query]
    entry = doc["queries"][0]
    assert entry["parameters"] == {"n": {"type": "integer", "required": True}}
    assert (entry["version"], entry["description"], entry["tags"], entry["connection_name"], entry["can_write"]) == \
        (1, "n", ["t"], demo_connection, False)
    assert doc["caller"]["name"] == name and doc["caller"]["admin"] is False
    assert doc["caller"]["rate_limit"] == "100/minute"


def test_a_key_describes_its_catalog_only_from_its_allowed_addresses(http, http_endpoint):
    # The key's allowed_ips is part of identifying it (pipeline/identify.py), for every use of
    # the key: /catalog and /openapi.json describe what it may run, so they refuse as /q does.
    # Over a real socket: the peer address is 127.0.0.1.
    ep = http_endpoint("SELECT 1 AS one")
    elsewhere = http.key([ep.query], [ep.connection], allowed_ips=["10.0.0.0/8"])
    assert http.call(ep.query, elsewhere).json["code"] == "ip_not_allowed"
    for path in ("/catalog", "/openapi.json"):
        got = http.request("GET", path, headers={"X-API-Key": elsewhere})
        assert got.status == 403 and got.json["code"] == "ip_not_allowed", (path, got)
        assert ep.query not in got.text
    here = http.key([ep.query], [ep.connection], allowed_ips=["127.0.0.0/8"])
    assert http.call(ep.query, here).status == 200
    for path in ("/catalog", "/openapi.json"):
        got = http.request("GET", path, headers={"X-API-Key": here})
        assert got.status == 200 and ep.query in got.text, (path, got)
