"""API keys: the grants checked when saved (so the catalog never holds a bad one); the
secret shown once, stored as its SHA-256 digest."""
from __future__ import annotations

from datetime import UTC, datetime

import psycopg2.errors

from .. import crypto
from ..errors import bad_request, conflict, not_found
from ..governance import Grants
from ..model.limits import Quota, Rate
from ..store import statements as store
from .changes import Changes
from .validate import expires_at, iso, require_fields, str_list, valid_name

FIELDS = {"name", "queries", "connections", "expires_at", "active", "rate_limit", "rate_limit_burst",
          "quota", "allow_writes", "allowed_tables", "mask", "allowed_write_ops", "max_rows", "query_timeout",
          "allowed_ips"}
GOVERNANCE_FIELDS = ("allowed_tables", "mask", "allowed_write_ops", "max_rows", "query_timeout", "allowed_ips")


def grants_of(body: dict, base: dict | None = None) -> dict:
    """The key's grants document: ``base`` (the stored one, on an update) changed by ``body``."""
    grants = dict(base or {})
    for field in ("queries", "connections"):
        if field in body or base is None:
            grants[field] = str_list(body, field)
    for field in ("active", "allow_writes"):
        if field in body:
            if not isinstance(body[field], bool):
                raise bad_request("invalid_body", f"{field} must be true or false",
                                  errors={field: "must be true or false"})
            grants[field] = body[field]
    if "rate_limit" in body or "rate_limit_burst" in body:
        rate_text = body.get("rate_limit", grants.get("rate_limit"))
        burst = body.get("rate_limit_burst", grants.get("rate_limit_burst"))
        if rate_text is None:
            grants.pop("rate_limit", None)
            grants.pop("rate_limit_burst", None)
        else:
            Rate.parse(rate_text, burst)
            grants["rate_limit"] = rate_text
            grants["rate_limit_burst"] = burst
    for field in GOVERNANCE_FIELDS:
        if field in body:
            if body[field] is None:
                grants.pop(field, None)
            else:
                grants[field] = body[field]
    Grants.from_doc(grants)
    if "quota" in body:
        if body["quota"] is None:
            grants.pop("quota", None)
        else:
            grants["quota"] = Quota.parse(body["quota"]).to_doc()
    return grants


class Keys:
    def __init__(self, changes: Changes) -> None:
        self._changes = changes

    def create(self, body: dict) -> dict:
        require_fields(body, FIELDS)
        name = valid_name(body, "key")
        grants = grants_of(body)
        expires = expires_at(body)
        secret, prefix = crypto.new_api_secret()
        try:
            with self._changes.change("create", "key", name) as cur:
                store.insert_key(cur, name, prefix, crypto.digest(secret), grants, expires)
        except psycopg2.errors.UniqueViolation:
            raise conflict("key_exists", f"API key '{name}' already exists") from None
        return dict(self.get(name), secret=secret)

    def update(self, name: str, body: dict) -> dict:
        require_fields(body, FIELDS)
        if body.get("name", name) != name:
            raise bad_request("invalid_body", "a key cannot be renamed", errors={"name": "cannot change"})
        with self._changes.change("update", "key", name) as cur:
            row = self._row(cur, name, lock=True)
            grants = grants_of(body, base=row["grants"])
            expires = expires_at(body) if "expires_at" in body else row["expires_at"]
            store.update_key_grants(cur, row["id"], grants, expires)
        return self.get(name)

    def rotate(self, name: str) -> dict:
        secret, prefix = crypto.new_api_secret()
        with self._changes.change("rotate", "key", name) as cur:
            store.rotate_key(cur, self._row(cur, name, lock=True)["id"], prefix, crypto.digest(secret))
        return dict(self.get(name), secret=secret)

    def delete(self, name: str) -> None:
        with self._changes.change("delete", "key", name) as cur:
            if not store.delete_key(cur, name):
                raise not_found("key_not_found", f"API key '{name}' not found")

    @staticmethod
    def _row(cur: store.Cursor, name: str, lock: bool = False) -> dict:
        row = store.key(cur, name, lock)
        if row is None:
            raise not_found("key_not_found", f"API key '{name}' not found")
        return row

    @staticmethod
    def _doc(row: dict) -> dict:
        grants = row["grants"] or {}
        expires = row["expires_at"]
        return {"name": row["name"], **{k: v for k, v in grants.items() if k != "active"},
                "active": grants.get("active", True) is not False, "expires_at": iso(expires),
                "expired": bool(expires and expires <= datetime.now(UTC)),
                "created_at": iso(row["created_at"]), "rotated_at": iso(row["rotated_at"]),
                "key_prefix": f"gw_{row['prefix']}_"}

    def get(self, name: str) -> dict:
        with self._changes.cursor() as cur:
            return self._doc(self._row(cur, name))

    def list(self) -> dict:
        with self._changes.cursor() as cur:
            return {"items": [self._doc(r) for r in store.keys(cur)]}
