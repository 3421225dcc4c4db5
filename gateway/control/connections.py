"""Connections: validated, passwords sealed (or ``${ENV}`` references kept), then one short
transaction."""
from __future__ import annotations

from typing import Any

import psycopg2.errors
import psycopg2.extras

from ..crypto import PasswordBox
from ..errors import bad_request, conflict, not_found
from ..model.drivers import DRIVER_OPTIONS
from ..store import statements as store
from .changes import Changes
from .validate import iso, require_fields, valid_name

FIELDS = {"name", "db", "host", "port", "database", "user", "password", "active", "options"}
class Connections:
    def __init__(self, changes: Changes, password_box: PasswordBox) -> None:
        self._changes = changes
        self._box = password_box

    def _values(self, body: dict, partial: bool) -> dict:
        drivers = {k: body[k] for k in body if k in DRIVER_OPTIONS}
        if drivers:   # QueryAPIGate's form: driver options beside the fields, shown back under "options"
            body = {k: v for k, v in body.items() if k not in DRIVER_OPTIONS}
            if not isinstance(body.get("options", {}), dict):
                raise bad_request("invalid_body", "invalid connection", errors={"options": "must be an object"})
            body["options"] = {**body.get("options", {}), **drivers}
        require_fields(body, FIELDS)
        values: dict[str, Any] = {}
        errors: dict[str, str] = {}
        if "db" in body:
            if body["db"] not in ("postgres", "postgresql"):
                errors["db"] = "only 'postgres' is supported"
            values["db"] = "postgres"
        for field, column in (("host", "host"), ("database", "database"), ("user", "username")):
            if field in body:
                if not isinstance(body[field], str) or not body[field]:
                    errors[field] = "must be a non-empty string"
                values[column] = body[field]
            elif not partial:
                errors[field] = "is required"
        if "port" in body:
            port = body["port"]
            if isinstance(port, str) and port.isascii() and port.isdigit():   # not "²": int() refuses it
                port = int(port)
            if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
                errors["port"] = "must be an integer from 1 to 65535"
            values["port"] = port
        if "password" in body:
            if body["password"] is not None and not isinstance(body["password"], str):
                errors["password"] = "must be a string"
            else:
                values["password"] = self._box.seal(body["password"])
        if "active" in body:
            if not isinstance(body["active"], bool):
                errors["active"] = "must be true or false"
            values["active"] = body["active"]
        if "options" in body:
            if not isinstance(body["options"], dict):
                errors["options"] = "must be an object"
            else:
                bad = [k for k, v in body["options"].items() if k in DRIVER_OPTIONS and
                       (isinstance(v, bool) or not isinstance(v, (str, int)))]
                if bad:
                    errors["options"] = f"{', '.join(sorted(bad))} must be a string or a number"
            values["options"] = psycopg2.extras.Json(body["options"])
        if errors:
            raise bad_request("invalid_body", "invalid connection", errors=errors)
        return values

    def create(self, body: dict) -> dict:
        name = valid_name(body, "connection")
        values = dict(self._values(body, partial=False), name=name)
        try:
            with self._changes.change("create", "connection", name) as cur:
                store.insert_connection(cur, values)
        except psycopg2.errors.UniqueViolation:
            raise conflict("connection_exists", f"connection '{name}' already exists") from None
        return self.get(name)

    def update(self, name: str, body: dict) -> dict:
        body = {k: v for k, v in body.items() if k != "name"} if body.get("name") in (None, name) else body
        values = self._values(body, partial=True)
        if "name" in body:
            raise bad_request("invalid_body", "a connection cannot be renamed", errors={"name": "cannot change"})
        if not values:
            return self.get(name)
        with self._changes.change("update", "connection", name) as cur:
            if not store.update_connection(cur, name, values):
                raise not_found("connection_not_found", f"connection '{name}' not found")
        return self.get(name)

    def delete(self, name: str) -> None:
        try:
            with self._changes.change("delete", "connection", name) as cur:
                if not store.delete_connection(cur, name):
                    raise not_found("connection_not_found", f"connection '{name}' not found")
        except psycopg2.errors.ForeignKeyViolation:
            raise conflict("connection_in_use", f"saved queries use connection '{name}'") from None

    @staticmethod
    def _doc(row: dict) -> dict:
        return {"name": row["name"], "db": row["db"], "active": row["active"], "host": row["host"],
                "port": row["port"], "database": row["database"], "user": row["username"],
                "password": None if row["password"] in (None, "") else "********",
                "options": row["options"], "created_at": iso(row["created_at"]),
                "updated_at": iso(row["updated_at"]), "example": False, "usage": None}

    def get(self, name: str) -> dict:
        with self._changes.cursor() as cur:
            row = store.connection(cur, name)
        if row is None:
            raise not_found("connection_not_found", f"connection '{name}' not found")
        return self._doc(row)

    def list(self) -> dict:
        with self._changes.cursor() as cur:
            return {"items": [self._doc(r) for r in store.connections(cur)]}
