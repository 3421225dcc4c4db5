"""Connections: validated, passwords sealed (or ``${ENV}`` references kept), then one short
transaction."""
from __future__ import annotations

from typing import Any

import psycopg2.errors
import psycopg2.extras

from ..crypto import PasswordBox
from ..errors import conflict, not_found
from ..model.drivers import DRIVER_OPTIONS
from ..store import statements as store
from .changes import Changes
from .validate import (
    A_STRING,
    AN_OBJECT,
    NON_EMPTY_STRING,
    TRUE_OR_FALSE,
    Fields,
    Problem,
    cannot_rename,
    iso,
    nullable,
    require_fields,
    rule,
    valid_name,
)

FIELDS = {"name", "db", "host", "port", "database", "user", "password", "active", "options"}
REQUIRED = ("host", "database", "user")
_COLUMNS = {"user": "username"}   # the fields stored under another name


def _port(value: Any) -> Any:
    """A port given as ASCII digits is that number (not "²": int() refuses it)."""
    return int(value) if isinstance(value, str) and value.isascii() and value.isdigit() else value


def _driver_values(options: dict) -> Problem | None:
    bad = [k for k, v in options.items()
           if k in DRIVER_OPTIONS and (isinstance(v, bool) or not isinstance(v, (str, int)))]
    return Problem(f"{', '.join(sorted(bad))} must be a string or a number") if bad else None


# A connection's body: every field's problem named at once.
CONNECTION = Fields({
    "db": rule(lambda v: v in ("postgres", "postgresql"), "only 'postgres' is supported"),
    "host": NON_EMPTY_STRING,
    "database": NON_EMPTY_STRING,
    "user": NON_EMPTY_STRING,
    "port": rule(lambda v: isinstance(port := _port(v), int) and not isinstance(port, bool) and 0 < port < 65536,
                 "must be an integer from 1 to 65535"),
    "password": nullable(A_STRING),
    "active": TRUE_OR_FALSE,
    "options": (AN_OBJECT, _driver_values),
}, invalid="invalid connection")


class Connections:
    def __init__(self, changes: Changes, password_box: PasswordBox) -> None:
        self._changes = changes
        self._box = password_box

    def _values(self, body: dict, partial: bool) -> dict:
        """The stored columns of a connection's body (a new one: with every required field)."""
        drivers = {k: body[k] for k in body if k in DRIVER_OPTIONS}
        if drivers:   # QueryAPIGate's form: driver options beside the fields, shown back under "options"
            body = {k: v for k, v in body.items() if k not in DRIVER_OPTIONS}
            problem = AN_OBJECT(body.get("options", {}))
            if problem is not None:
                raise CONNECTION.refuse({"options": problem})
            body["options"] = {**body.get("options", {}), **drivers}
        require_fields(body, FIELDS)
        CONNECTION.check(body, required=() if partial else REQUIRED)
        return {_COLUMNS.get(field, field): self._stored(field, body[field]) for field in CONNECTION.rules
                if field in body}

    def _stored(self, field: str, value: Any) -> Any:
        """A checked field's value as the store keeps it."""
        if field == "db":
            return "postgres"
        if field == "port":
            return _port(value)
        if field == "password":
            return self._box.seal(value)
        if field == "options":
            return psycopg2.extras.Json(value)
        return value

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
            raise cannot_rename("connection")
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
