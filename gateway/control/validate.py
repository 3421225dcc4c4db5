"""Checks every management body goes through, before any transaction opens."""
from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, date, datetime, time
from typing import Any

from ..errors import bad_request

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def require_fields(body: dict, allowed: set[str]) -> None:
    unknown = set(body) - allowed
    if unknown:
        raise bad_request("unknown_field", f"unknown field(s): {', '.join(sorted(unknown))}",
                          errors={k: "is not a known field" for k in sorted(unknown)})


def valid_name(body: dict, what: str) -> str:
    name = body.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise bad_request("invalid_body", f"{what} name must be 1-64 letters, digits, '_', '-' or '.'",
                          errors={"name": "is missing or not a valid name"})
    return name


def str_list(body: dict, field: str) -> list[str]:
    value = body.get(field)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad_request("invalid_body", f"{field} must be a list of strings",
                          errors={field: "must be a list of strings"})
    return sorted(set(value))


def expires_at(body: dict) -> datetime | None:
    raw = body.get("expires_at")
    if raw is None:
        return None
    try:
        if isinstance(raw, str) and len(raw) == 10:
            # A date is valid through its last moment (UTC), as QueryAPIGate's: a key that
            # "expires 2026-10-15" works during the 15th.
            return datetime.combine(date.fromisoformat(raw), time.max, UTC)
        value = datetime.fromisoformat(raw)
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    except (TypeError, ValueError):
        raise bad_request("invalid_body", "expires_at must be an ISO 8601 date or datetime",
                          errors={"expires_at": "must be an ISO 8601 date or datetime"}) from None


def iso(value: date | None) -> str | None:
    return value.isoformat() if value is not None else None


def filters(args: Mapping[str, Any], allowed: dict[str, str]) -> tuple[str, list]:
    """A listing's query-string filters as a WHERE clause over fixed column expressions."""
    unknown = set(args) - set(allowed) - {"limit"}
    if unknown:
        raise bad_request("invalid_filter", f"unknown filter(s): {', '.join(sorted(unknown))}")
    clauses, values = [], []
    for name, clause in allowed.items():
        if name in args:
            value = args[name]
            if isinstance(value, list):
                raise bad_request("invalid_filter", f"{name} was given more than once")
            if name in ("since", "until"):
                try:
                    value = datetime.fromisoformat(value)
                except ValueError:
                    raise bad_request("invalid_filter", f"{name} must be an ISO 8601 datetime") from None
            if name == "status" and not (value.isascii() and value.isdigit()):   # not "²": int() refuses it
                raise bad_request("invalid_filter", "status must be an HTTP status code")
            clauses.append(clause)
            values.append(value)
    return ("WHERE " + " AND ".join(clauses)) if clauses else "", values


def limit(args: Mapping[str, Any]) -> int:
    raw = args.get("limit", "100")
    # ASCII digits only: str.isdigit() also takes "²", which int() refuses.
    if not isinstance(raw, str) or not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= 10_000:
        raise bad_request("invalid_filter", "limit must be an integer from 1 to 10000")
    return int(raw)
