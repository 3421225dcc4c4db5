"""``/api/v1`` (gateway/http/management.py): every responder of every management route checks
the admin key before it reads anything (Falcon's ``before`` hook on each resource class)."""
from __future__ import annotations

from gateway.http.management import ROUTES

_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def test_every_management_responder_is_admin_only(api, endpoint):
    ep = endpoint("SELECT 1 AS one")
    seen = 0
    for template, resource in ROUTES:
        path = template.replace("{name}", ep.query).replace("{version}", "1")
        for method in _METHODS:
            if not hasattr(resource, f"on_{method.lower()}"):
                continue
            seen += 1
            body = {} if method in ("POST", "PUT", "PATCH") else None
            anonymous = api.request(method, path, json_body=body) if body is not None else api.request(method, path)
            assert anonymous.status == 401 and anonymous.json["code"] == "unauthorized", (method, path, anonymous)
            data_key = api.request(method, path, headers={"X-API-Key": ep.secret},
                                   **({"json_body": body} if body is not None else {}))
            assert data_key.status == 403 and data_key.json["code"] == "admin_only", (method, path, data_key)
    assert seen >= 20, seen   # every route has at least one responder; most several
    # Nothing was changed by the refused calls: the query is still there and served.
    assert api.call(ep.query, ep.secret).status == 200
