"""Mask rules: ``{"column": pattern, "action": action}``, compiled once; and what an action
does to one value (``hash``: an HMAC of its text form; ``mask``: its last 4 characters).

The pattern is ``table.column`` (any schema) or ``schema.table.column`` with fnmatch
wildcards (``*.email``, ``public.customers.*``), matched case-insensitively; the action is
one of ``drop`` > ``null`` > ``hash`` > ``mask`` > ``keep`` (strictest first). A key's grants
carry rules (``mask``), and so may a saved query; they apply to every caller."""
from __future__ import annotations

import fnmatch
import hashlib
import hmac
import json
import re
from collections.abc import Callable, Mapping
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

from ..errors import GatewayError, bad_request
from .schema import split_qname

ACTIONS = ("drop", "null", "hash", "mask", "keep")   # strictest first
RANK = {action: rank for rank, action in enumerate(ACTIONS)}
# A hash maps a value one to one and a partial mask shows part of it: of a value computed from
# a column (substr(email, k, 1)) either gives the column away piece by piece. Only null and
# drop hide whatever they are applied to.
UNDOABLE = frozenset(("hash", "mask"))


def invalid_grant(field: str, message: str) -> GatewayError:
    """A grants field that is not what it must be (``invalid_body``; ``errors`` names it)."""
    return bad_request("invalid_body", f"{field}: {message}", errors={field: message})


class MaskRule:
    __slots__ = ("pattern", "action", "schema", "table", "column", "literal_table", "table_text", "schema_text")

    def __init__(self, pattern: str, action: str) -> None:
        if not isinstance(pattern, str) or not pattern:
            raise invalid_grant("mask", "each rule's column must be a non-empty string")
        if action not in RANK:
            raise invalid_grant("mask", f"action {action!r} must be one of {', '.join(ACTIONS)}")
        try:
            parts = split_qname(pattern)
        except ValueError:
            parts = ()
        if len(parts) not in (2, 3) or not all(parts):
            raise invalid_grant("mask", f"column {pattern!r} must be table.column or schema.table.column "
                                   "(wildcards allowed: *.email, public.customers.*)")
        self.pattern = pattern
        self.action = action
        schema_part = parts[0] if len(parts) == 3 else None
        table_part, column_part = parts[-2], parts[-1]
        self.schema = _compile(schema_part) if schema_part is not None else None
        self.table = _compile(table_part)
        self.column = _compile(column_part)
        self.literal_table = not any(ch in table_part for ch in "*?[")
        self.table_text = table_part.lower()
        self.schema_text = schema_part

    def matches(self, schema: str, table: str, column: str) -> bool:
        return (self.schema is None or bool(self.schema.match(schema))) and bool(self.table.match(table)) \
            and bool(self.column.match(column))

    def names_relation(self, schema: str, table: str) -> bool:
        """Whether this rule names the relation itself (no wildcard in its table part)."""
        return self.literal_table and self.table_text == table.lower() and \
            (self.schema is None or bool(self.schema.match(schema)))

    def to_doc(self) -> dict:
        return {"column": self.pattern, "action": self.action}


def _compile(part: str) -> re.Pattern[str]:
    return re.compile(fnmatch.translate(part), re.IGNORECASE | re.DOTALL)


def compile_masks(rules: Any) -> tuple[MaskRule, ...]:
    """Mask rules as stored (a list of ``{"column", "action"}``), compiled; None is none."""
    if rules is None:
        return ()
    if isinstance(rules, tuple) and all(isinstance(r, MaskRule) for r in rules):
        return rules
    if not isinstance(rules, list):
        raise invalid_grant("mask", 'must be a list of {"column": "table.column", '
                                    '"action": "hash|null|drop|mask|keep"}')
    out = []
    for rule in rules:
        if isinstance(rule, MaskRule):
            out.append(rule)
            continue
        if not isinstance(rule, Mapping) or set(rule) != {"column", "action"}:
            raise invalid_grant("mask", 'each rule is {"column": "table.column", "action": ...} and nothing else')
        out.append(MaskRule(rule["column"], rule["action"]))
    return tuple(out)


# --- what an action does to a value -----------------------------------------------------------
def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float, Decimal)) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, bool):
        return "true" if value else "false"
    return None


def hasher(key: bytes) -> Callable[[Any], str | None]:
    base = hmac.new(key, digestmod=hashlib.sha256)

    def digest(value):
        if value is None:
            return None
        if isinstance(value, (bytes, bytearray, memoryview)):
            data = bytes(value)
        else:
            text = _text(value)
            if text is None:
                text = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
            data = text.encode("utf-8")
        h = base.copy()
        h.update(data)
        return h.hexdigest()
    return digest


def mask_value(value: Any) -> str | None:
    """Text keeps its last 4 characters (``****1234``); 4 characters or fewer are hidden
    entirely; a value with no text form (JSON, bytes, arrays) becomes null."""
    if value is None:
        return None
    text = _text(value)
    if text is None:
        return None
    return "****" + text[-4:] if len(text) > 4 else "****"


