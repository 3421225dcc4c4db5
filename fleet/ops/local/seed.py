"""The demo: two connections, two published queries and a key, created through the
Management API exactly as a QueryAPIGate user's script would. Safe to re-run: what exists
is left alone, and the demo key's secret is kept in a file (rotated if it was lost).

The connection ``demo`` logs in as ``demo_reader`` (fleet/ops/local/demo.py), a role that may only
SELECT the demo tables; both queries only read. A second connection, ``demo_writer``, logs in
as ``demo_writer``, a role that may only run the load tests' deposit (``UPDATE
pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid``,
loadtests/scenarios/provision.py); the demo key is not granted it."""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

CONNECTION = "demo"
WRITER_CONNECTION = "demo_writer"

DEMO_QUERIES = [
    {"name": "account", "connection_name": CONNECTION,
     "sql": "SELECT aid, bid, abalance FROM pgbench_accounts WHERE aid = :aid",
     "parameters": {"aid": {"type": "int", "required": True, "min": 1,
                            "description": "account id, 1 to 1,000,000"}},
     "description": "One pgbench account by primary key", "publish": True},
    {"name": "customers", "connection_name": CONNECTION,
     "sql": "SELECT id, name, email, country, plan FROM customers "
            "WHERE country = :country AND plan = :plan ORDER BY id",
     "parameters": {"country": {"type": "str", "enum": ["DE", "FR", "GB", "JP", "US"], "default": "DE"},
                    "plan": {"type": "str", "enum": ["free", "pro", "team", "enterprise"], "default": "pro"}},
     "description": "Customers by country and plan", "tags": ["demo"], "publish": True},
]


class Api:
    """A minimal JSON client for the Management API (stdlib only)."""

    def __init__(self, base_url: str, admin_key: str) -> None:
        self.base = base_url.rstrip("/")
        self.key = admin_key

    def call(self, method: str, path: str, body: object = None, key: str | None = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"X-API-Key": key or self.key, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                raw = resp.read()
                return resp.status, (json.loads(raw) if raw and raw[:1] in b"[{" else raw)
        except urllib.error.HTTPError as err:
            raw = err.read()
            return err.code, (json.loads(raw) if raw[:1] == b"{" else raw)


def update_login(api: Api, pg: dict, force: bool = False, name: str = CONNECTION) -> None:
    """Give the saved demo connection ``name`` ``pg``'s login when it logs in as another user
    (an older `fleet up` saved the superuser) or, with ``force``, anyway (its password was
    regenerated). Only for a demo connection the caller owns: `fleet up`'s, on the embedded
    PostgreSQL."""
    status, body = api.call("GET", f"/api/v1/connections/{name}")
    if status == 404 or (status == 200 and body.get("user") == pg["user"] and not force):
        return
    if status == 200:
        status, body = api.call("PATCH", f"/api/v1/connections/{name}", pg)
    if status != 200:
        raise RuntimeError(f"updating the {name} connection's login answered {status}: {body}")


def seed(api: Api, pg: dict, key_file: Path, writer: dict | None = None) -> str:
    """Create the demo objects that are missing (the demo_writer connection too, with the
    login ``writer``, when given); returns the demo key's secret."""
    logins = {CONNECTION: pg, **({WRITER_CONNECTION: writer} if writer else {})}
    for name, login in logins.items():
        status, body = api.call("POST", "/api/v1/connections",
                                {"name": name, "db": "postgres", **login, "active": True})
        if status not in (201, 409):
            raise RuntimeError(f"creating the {name} connection answered {status}: {body}")
    for query in DEMO_QUERIES:
        status, body = api.call("POST", "/api/v1/queries", query)
        if status not in (201, 409):
            raise RuntimeError(f"creating query {query['name']} answered {status}: {body}")
    grants = {"name": "demo", "queries": [q["name"] for q in DEMO_QUERIES], "connections": [CONNECTION]}
    status, body = api.call("POST", "/api/v1/api-keys", grants)
    if status == 201:
        secret = body["secret"]
    elif status == 409:
        secret = key_file.read_text().strip() if key_file.exists() else ""
        if not secret or api.call("GET", "/q/account?aid=1", key=secret)[0] != 200:
            # The old secret is lost: no grace period for it (and none pending to refuse a later rotation).
            status, body = api.call("POST", "/api/v1/api-keys/demo/rotate", {"grace_minutes": 0})
            if status != 200:
                raise RuntimeError(f"rotating the demo key answered {status}: {body}")
            secret = body["secret"]
    else:
        raise RuntimeError(f"creating the demo key answered {status}: {body}")
    key_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secret + "\n")
    return secret
