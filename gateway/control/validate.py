"""Checks every management body goes through, before any transaction opens: its fields
against the resource's table of rules (``Fields``; each rule and its message written once,
here or beside the resource), its name, its dates.

A rule is a function from a field's value to its ``Problem`` (None: the value is fine). A
problem's ``text`` is what ``errors`` says of the field; the message is ``"<field> <text>"``
unless the problem has its own (a resource that names every problem at once has one message
for all: ``Fields(..., invalid="invalid connection")``)."""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, date, datetime, time
from typing import Any, NamedTuple

from ..errors import GatewayError, bad_request

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class Problem(NamedTuple):
    text: str                   # what ``errors`` says of the field: "must be true or false"
    message: str | None = None  # the error's message, where it is not "<field> <text>"


Rule = Callable[[Any], Problem | None]


def rule(accepts: Callable[[Any], bool], text: str, message: str | None = None) -> Rule:
    """A rule from a predicate: ``accepts(value)`` or the problem ``text``."""
    problem = Problem(text, message)
    return lambda value: None if accepts(value) else problem


def whole_number(low: int, high: int, *, or_null: bool = False) -> Rule:
    """An int (not a bool) from ``low`` to ``high``; None too with ``or_null``."""
    return rule(lambda v: (or_null and v is None) or (isinstance(v, int) and not isinstance(v, bool)
                                                       and low <= v <= high),
                f"must be a whole number from {low} to {high}" + (", or null" if or_null else ""))


def nullable(check: Rule) -> Rule:
    """``check``, or None."""
    return lambda value: None if value is None else check(value)


TRUE_OR_FALSE = rule(lambda v: isinstance(v, bool), "must be true or false")
A_STRING = rule(lambda v: isinstance(v, str), "must be a string")
NON_EMPTY_STRING = rule(lambda v: isinstance(v, str) and bool(v), "must be a non-empty string")
AN_OBJECT = rule(lambda v: isinstance(v, dict), "must be an object")
STRINGS = rule(lambda v: v is None or (isinstance(v, list) and all(isinstance(x, str) for x in v)),
               "must be a list of strings")
REQUIRED = Problem("is required")


def invalid_field(field: str, problem: Problem) -> GatewayError:
    return bad_request("invalid_body", problem.message or f"{field} {problem.text}", errors={field: problem.text})


class Fields:
    """One resource's body as a table: the fields it checks, in the order they are checked,
    each with its rules (the first problem counts). With ``invalid`` (the message), every
    field's problem is named at once; without, the first field's problem is the error."""

    def __init__(self, rules: Mapping[str, Rule | tuple[Rule, ...]], invalid: str | None = None) -> None:
        self.rules = {field: r if isinstance(r, tuple) else (r,) for field, r in rules.items()}
        self.invalid = invalid

    def problem(self, field: str, value: Any) -> Problem | None:
        for check in self.rules[field]:
            problem = check(value)
            if problem is not None:
                return problem
        return None

    def check(self, body: Mapping[str, Any], required: Iterable[str] = ()) -> None:
        """Every field of ``body`` this table has rules for (and each ``required`` one present)."""
        required = frozenset(required)
        problems: dict[str, Problem] = {}
        for field in self.rules:
            problem = self.problem(field, body[field]) if field in body else REQUIRED if field in required else None
            if problem is not None:
                problems[field] = problem
                if self.invalid is None:
                    break
        if problems:
            raise self.refuse(problems)

    def refuse(self, problems: Mapping[str, Problem]) -> GatewayError:
        if self.invalid is None:
            [(field, problem)] = problems.items()
            return invalid_field(field, problem)
        return bad_request("invalid_body", self.invalid, errors={f: p.text for f, p in problems.items()})


def cannot_rename(what: str) -> GatewayError:
    return bad_request("invalid_body", f"a {what} cannot be renamed", errors={"name": "cannot change"})


def require_fields(body: dict, allowed: set[str]) -> None:
    unknown = set(body) - allowed
    if unknown:
        raise bad_request("unknown_field", f"unknown field(s): {', '.join(sorted(unknown))}",
                          errors={k: "is not a known field" for k in sorted(unknown)})


def valid_name(body: dict, what: str) -> str:
    name = body.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise invalid_field("name", Problem("is missing or not a valid name",
                                            f"{what} name must be 1-64 letters, digits, '_', '-' or '.'"))
    return name


def str_list(body: dict, field: str) -> list[str]:
    value = body.get(field)
    problem = STRINGS(value)
    if problem is not None:
        raise invalid_field(field, problem)
    return sorted(set(value or ()))


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
        raise invalid_field("expires_at", Problem("must be an ISO 8601 date or datetime")) from None


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
