"""API keys: the grants checked when saved (so the catalog never holds a bad one); the
secret shown once, stored as its SHA-256 digest."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg2.errors

from .. import crypto
from ..errors import GatewayError, bad_request, conflict, not_found
from ..governance import Grants
from ..model.limits import Quota, Rate
from ..store import statements as store
from .changes import Changes
from .validate import expires_at, iso, require_fields, str_list, valid_name

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


def _reach(body: dict, field: str) -> list[str] | str:
    """``connections`` or ``queries``: ``"*"`` (all), or a list of names (QueryAPIGate's forms)."""
    value = body.get(field)
    if value == ALL:
        return ALL
    if field == "queries" and isinstance(value, list):
        return sorted({entry["name"] if isinstance(entry, dict) else entry for entry in _query_entries(value)})
    return str_list(body, field)


def _query_entries(entries: list) -> list:
    """``queries`` entries: a name, or ``{"name": ..., "allow_writes": bool}`` (a write grant for that query)."""
    seen = set()
    for entry in entries:
        if isinstance(entry, dict):
            name = entry.get("name")
            if not isinstance(name, str) or set(entry) - {"name", "allow_writes"} or \
                    not isinstance(entry.get("allow_writes", False), bool):
                raise bad_request("invalid_body", 'each queries entry is a name or {"name": ..., "allow_writes": '
                                  'true}', errors={"queries": "has an invalid entry"})
        elif isinstance(entry, str):
            name = entry
        else:
            raise bad_request("invalid_body", "queries must be a list of names or objects, or \"*\"",
                              errors={"queries": "must be a list of names or objects, or \"*\""})
        if name in seen:
            raise bad_request("invalid_body", f'queries lists "{name}" more than once',
                              errors={"queries": "lists a name twice"})
        seen.add(name)
    return entries


def _query_writes(body: dict) -> list[str]:
    value = body.get("queries")
    if not isinstance(value, list):
        return []
    return sorted(e["name"] for e in value if isinstance(e, dict) and e.get("allow_writes") is True)


def grants_of(body: dict, base: dict | None = None) -> dict:
    """The key's grants document: ``base`` (the stored one, on an update) changed by ``body``."""
    grants = dict(base or {})
    for field in ("queries", "connections"):
        if field in body or base is None:
            grants[field] = _reach(body, field)
    if "queries" in body or base is None:
        writes = _query_writes(body)
        if writes:
            grants["query_writes"] = writes
        else:
            grants.pop("query_writes", None)
    if "collections" in body and body["collections"] not in (None, []):
        raise bad_request("invalid_body", "collections are not supported: grant queries by name",
                          errors={"collections": "must be empty"})
    if "max_concurrent" in body:
        value = body["max_concurrent"]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10_000):
            raise bad_request("invalid_body", "max_concurrent must be a whole number from 1 to 10000, or null",
                              errors={"max_concurrent": "must be a whole number from 1 to 10000, or null"})
        grants["max_concurrent"] = value
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
            with self._changes.change("create", "key", name, new=True) as cur:
                store.insert_key(cur, name, prefix, crypto.digest(secret), grants, expires)
                row = self._row(cur, name)   # the answer, read in the change's own transaction
        except psycopg2.errors.UniqueViolation:
            raise conflict("key_exists", f"API key '{name}' already exists") from None
        return dict(self._doc(row), secret=secret)

    def update(self, name: str, body: dict) -> dict:
        require_fields(body, FIELDS)
        if body.get("name", name) != name:
            raise bad_request("invalid_body", "a key cannot be renamed", errors={"name": "cannot change"})
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
        if isinstance(grace, bool) or not isinstance(grace, int) or not 0 <= grace <= MAX_GRACE_MINUTES:
            raise bad_request("invalid_body", f"grace_minutes must be a whole number from 0 to {MAX_GRACE_MINUTES}",
                              errors={"grace_minutes": f"must be a whole number from 0 to {MAX_GRACE_MINUTES}"})
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
