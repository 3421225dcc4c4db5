"""API keys: the grants checked when saved (so the catalog never holds a bad one); the
secret shown once, stored as its SHA-256 digest."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg2.errors

from .. import crypto
from ..errors import GatewayError, conflict, not_found
from ..governance import Grants
from ..model.limits import Quota, Rate
from ..store import statements as store
from .changes import Changes
from .validate import (
    STRINGS,
    TRUE_OR_FALSE,
    Fields,
    Problem,
    cannot_rename,
    expires_at,
    iso,
    require_fields,
    rule,
    valid_name,
    whole_number,
)

FIELDS = {"name", "queries", "connections", "expires_at", "active", "rate_limit", "rate_limit_burst",
          "quota", "allow_writes", "allowed_tables", "mask", "allowed_write_ops", "max_rows", "query_timeout",
          "allowed_ips", "max_concurrent", "collections"}
GOVERNANCE_FIELDS = ("allowed_tables", "mask", "allowed_write_ops", "max_rows", "query_timeout", "allowed_ips")
ALL = "*"
# QueryAPIGate's rotation grace: the previous secret keeps working this long unless the call says otherwise.
DEFAULT_GRACE_MINUTES = 60
MAX_GRACE_MINUTES = 7 * 24 * 60
# Where the grants document keeps what is not a grant: the secret before the last rotation (its prefix,
# digest and end), read by the catalog; never shown.
PREVIOUS = "previous"
HIDDEN = {"active", PREVIOUS, "query_writes"}


def _queries(value: Any) -> Problem | None:
    """``queries``: ``"*"`` (all), or names and ``{"name": ..., "allow_writes": bool}`` (a write
    grant for that query) entries, each name once (QueryAPIGate's forms)."""
    if value is None or value == ALL or not isinstance(value, list):
        return _names_or_all(value)
    seen = set()
    for entry in value:
        if isinstance(entry, dict):
            name = entry.get("name")
            if not isinstance(name, str) or set(entry) - {"name", "allow_writes"} or \
                    not isinstance(entry.get("allow_writes", False), bool):
                return _INVALID_ENTRY
        elif isinstance(entry, str):
            name = entry
        else:
            return _NAMES_OR_OBJECTS
        if name in seen:
            return Problem("lists a name twice", f'queries lists "{name}" more than once')
        seen.add(name)
    return None


def _names_or_all(value: Any) -> Problem | None:
    return None if value == ALL else STRINGS(value)


_INVALID_ENTRY = Problem("has an invalid entry", 'each queries entry is a name or {"name": ..., "allow_writes": true}')
_NAMES_OR_OBJECTS = Problem('must be a list of names or objects, or "*"')

# A key's body, as far as the grants document checks it here; rate limits and quotas are
# checked by their parsers (gateway.model.limits), the governance fields by Grants.from_doc.
KEY = Fields({
    "queries": _queries,
    "connections": _names_or_all,
    "collections": rule(lambda v: v in (None, []), "must be empty",
                        "collections are not supported: grant queries by name"),
    "max_concurrent": whole_number(1, 10_000, or_null=True),
    "active": TRUE_OR_FALSE,
    "allow_writes": TRUE_OR_FALSE,
})
ROTATION = Fields({"grace_minutes": whole_number(0, MAX_GRACE_MINUTES)})


def _reach(value: Any) -> list[str] | str:
    """``queries`` or ``connections`` as checked: ``"*"``, or the names, sorted, once each."""
    if value == ALL:
        return ALL
    return sorted({entry["name"] if isinstance(entry, dict) else entry for entry in value or ()})


def _query_writes(body: dict) -> list[str]:
    value = body.get("queries")
    if not isinstance(value, list):
        return []
    return sorted(e["name"] for e in value if isinstance(e, dict) and e.get("allow_writes") is True)


def grants_of(body: dict, base: dict | None = None) -> dict:
    """The key's grants document: ``base`` (the stored one, on an update) changed by ``body``."""
    KEY.check(body)
    grants = dict(base or {})
    for field in ("queries", "connections"):
        if field in body or base is None:
            grants[field] = _reach(body.get(field))
    if "queries" in body or base is None:
        writes = _query_writes(body)
        if writes:
            grants["query_writes"] = writes
        else:
            grants.pop("query_writes", None)
    for field in ("max_concurrent", "active", "allow_writes"):
        if field in body:
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
            with self._changes.change("create", "key", name, new=True) as cur:
                store.insert_key(cur, name, prefix, crypto.digest(secret), grants, expires)
                row = self._row(cur, name)   # the answer, read in the change's own transaction
        except psycopg2.errors.UniqueViolation:
            raise conflict("key_exists", f"API key '{name}' already exists") from None
        return dict(self._doc(row), secret=secret)

    def update(self, name: str, body: dict) -> dict:
        require_fields(body, FIELDS)
        if body.get("name", name) != name:
            raise cannot_rename("key")
        with self._changes.change("update", "key", name) as cur:
            row = self._row(cur, name, lock=True)
            grants = grants_of(body, base=row["grants"])
            expires = expires_at(body) if "expires_at" in body else row["expires_at"]
            store.update_key_grants(cur, row["id"], grants, expires)
            row = self._row(cur, name)
        return self._doc(row)

    def rotate(self, name: str, body: dict | None = None) -> dict:
        """A new secret; the previous one keeps working for ``grace_minutes`` (QueryAPIGate's default, 60;
        0 ends it at once, for a leaked secret)."""
        body = body or {}
        require_fields(body, {"grace_minutes"})
        grace = body.get("grace_minutes", DEFAULT_GRACE_MINUTES)
        if grace is None:
            grace = DEFAULT_GRACE_MINUTES
        ROTATION.check({"grace_minutes": grace})
        secret, prefix = crypto.new_api_secret()
        with self._changes.change("rotate", "key", name) as cur:
            row = self._row(cur, name, lock=True)
            grants = dict(row["grants"] or {})
            until_then = self._previous_until(grants)
            if until_then is not None:
                # As QueryAPIGate: a second rotation must not cut off the secret a caller still uses.
                raise GatewayError(409, "key_rotation_pending", f"the secret this key had before its last rotation "
                                   f"works until {until_then.isoformat()}: end it first (DELETE "
                                   f".../previous), or wait", extra={"previous_expires_at": until_then.isoformat()})
            grants.pop(PREVIOUS, None)
            if grace:
                until = datetime.now(UTC) + timedelta(minutes=grace)
                grants[PREVIOUS] = {"prefix": row["prefix"], "digest": bytes(row["secret_hash"]).hex(),
                                    "until": until.isoformat()}
            store.update_key_grants(cur, row["id"], grants, row["expires_at"])
            store.rotate_key(cur, row["id"], prefix, crypto.digest(secret))
            row = self._row(cur, name)
        return dict(self._doc(row), secret=secret)

    def end_previous(self, name: str) -> dict:
        """``DELETE /api-keys/<name>/previous``: the previous secret stops now, before its grace ends."""
        with self._changes.change("end_previous_secret", "key", name) as cur:
            row = self._row(cur, name, lock=True)
            grants = dict(row["grants"] or {})
            if self._previous_until(grants) is None:
                raise not_found("previous_secret_not_found", f"API key '{name}' has no previous secret still working")
            grants.pop(PREVIOUS)
            store.update_key_grants(cur, row["id"], grants, row["expires_at"])
            row = self._row(cur, name)
        return self._doc(row)

    @staticmethod
    def _previous_until(grants: dict) -> datetime | None:
        """When the previous secret stops working, if it still does."""
        previous = grants.get(PREVIOUS)
        if not previous:
            return None
        until = datetime.fromisoformat(previous["until"])
        return until if until > datetime.now(UTC) else None

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
        """The key as QueryAPIGate shows one (every field its OpenAPI document requires), plus
        ``rotated_at`` and ``key_prefix``."""
        grants = row["grants"] or {}
        expires = row["expires_at"]
        now = datetime.now(UTC)
        previous = grants.get(PREVIOUS)
        previous_until = previous and datetime.fromisoformat(previous["until"])
        writes = set(grants.get("query_writes") or ())
        queries = grants.get("queries") or []
        if writes and isinstance(queries, list):
            queries = [{"name": q, "allow_writes": True} if q in writes else q for q in queries]
        doc = {"name": row["name"], "connections": grants.get("connections") or [], "queries": queries,
               "collections": [], "allow_writes": grants.get("allow_writes", False),
               **{f: grants.get(f) for f in ("allowed_write_ops", "allowed_tables", "rate_limit", "allowed_ips",
                                             "mask", "max_concurrent", "query_timeout", "max_rows", "quota")},
               **{k: v for k, v in grants.items() if k not in HIDDEN and k not in ("queries", "connections")},
               "active": grants.get("active", True) is not False, "expires_at": iso(expires),
               "expired": bool(expires and expires <= now),
               "created_at": iso(row["created_at"]), "created_from_role": None, "last_used_at": None,
               "previous_expires_at": iso(previous_until) if previous_until and previous_until > now else None,
               "previous_last_used_at": None, "example": False, "usage": None,
               "effective_limits": {"max_concurrent": grants.get("max_concurrent"),
                                    "query_timeout": grants.get("query_timeout"),
                                    "max_rows": {"page": grants.get("max_rows"), "stream": grants.get("max_rows"),
                                                 "mcp": None}},
               "usage_this_period": None,
               "rotated_at": iso(row["rotated_at"]), "key_prefix": f"gw_{row['prefix']}_"}
        return doc

    def get(self, name: str) -> dict:
        with self._changes.cursor() as cur:
            return self._doc(self._row(cur, name))

    def list(self) -> dict:
        with self._changes.cursor() as cur:
            return {"items": [self._doc(r) for r in store.keys(cur)]}
