"""Typed parameters: specs are checked and compiled when a query is saved; each call only
coerces and checks values against the compiled form.

Values come either from a query string (always text) or from a JSON body (typed). Text is
parsed strictly (``int`` accepts ``-12`` but not ``1_000``, ``0x1f`` or ``" 7"``); JSON
values must already have the right type (``true`` is not an ``int``).
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import date, datetime
from typing import Any

from ..errors import bad_request
from ..settings import FALSE_WORDS, TRUE_WORDS
from . import patterns

TYPES = ("int", "float", "str", "bool", "date", "datetime")
# QueryAPIGate's JSON type names, accepted as written and shown back (a saved rule reads back as
# QueryAPIGate shows it: "int" is shown as "integer").
JSON_NAMES = {"int": "integer", "float": "number", "str": "string", "bool": "boolean"}
ALIASES = {**{v: k for k, v in JSON_NAMES.items()}, **{t: t for t in TYPES}}
SQL_TYPES = {"int": "bigint", "float": "double precision", "str": "text", "bool": "boolean",
             "date": "date", "datetime": "timestamp"}
SPEC_FIELDS = {"type", "required", "default", "enum", "min", "max", "min_length", "max_length",
               "pattern", "description"}
MAX_TEXT = 65_536
_INT_TEXT = re.compile(r"[+-]?[0-9]{1,19}")
_MISSING = object()
INT_MIN, INT_MAX = -(2 ** 63), 2 ** 63 - 1


class ParamError(ValueError):
    pass


def _from_text(kind: str, text: str) -> Any:
    if kind == "str":
        return text
    if kind == "int":
        if not _INT_TEXT.fullmatch(text):
            raise ParamError("must be an integer")
        return int(text)
    if kind == "float":
        try:
            value = float(text)
        except ValueError:
            raise ParamError("must be a number") from None
        if text.strip() != text or "_" in text:
            raise ParamError("must be a number")
        return value
    if kind == "bool":
        low = text.lower()
        if low in TRUE_WORDS:
            return True
        if low in FALSE_WORDS:
            return False
        raise ParamError("must be true or false")
    if kind == "date":
        try:
            return date.fromisoformat(text)
        except ValueError:
            raise ParamError("must be a date (YYYY-MM-DD)") from None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise ParamError("must be an ISO 8601 datetime") from None


def _from_json(kind: str, value: Any) -> Any:
    if isinstance(value, str):
        return _from_text(kind, value) if kind in ("date", "datetime", "str") else _typed_text(kind, value)
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ParamError("must be an integer")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ParamError("must be a number")
        return float(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise ParamError("must be true or false")
        return value
    raise ParamError(f"must be a {'string' if kind == 'str' else kind}")


def _typed_text(kind: str, text: str) -> Any:
    # A JSON body may carry numbers as strings (form-style clients do); parse them strictly.
    return _from_text(kind, text)


class ParamSpec:
    __slots__ = ("name", "kind", "required", "default", "enum", "min", "max", "min_length",
                 "max_length", "pattern", "description", "_regex", "_refused")

    def __init__(self, name: str, doc: Mapping[str, Any], stored: bool = False) -> None:
        """``stored``: read back from the store (a catalog load), not being saved."""
        if not isinstance(doc, Mapping):
            raise ParamError("must be an object")
        unknown = set(doc) - SPEC_FIELDS
        if unknown:
            raise ParamError(f"unknown field(s): {', '.join(sorted(unknown))}")
        raw_type = doc.get("type", "str")
        kind = ALIASES.get(raw_type) if isinstance(raw_type, str) else None
        if kind is None:
            raise ParamError(f"type must be one of {', '.join(TYPES)} (or {', '.join(JSON_NAMES.values())})")
        self.name = name
        self.kind = kind
        self.description = str(doc.get("description") or "")
        self.min = self._number(doc, "min")
        self.max = self._number(doc, "max")
        self.min_length = self._length(doc, "min_length")
        self.max_length = self._length(doc, "max_length")
        pattern = doc.get("pattern")
        if pattern is not None and not isinstance(pattern, str):
            raise ParamError("pattern must be a string")
        self._regex, refused = _compiled(pattern, stored)
        self._refused = None
        self.pattern = pattern
        self.enum = None
        enum = doc.get("enum")
        if enum is not None:
            if not isinstance(enum, list) or not enum:
                raise ParamError("enum must be a non-empty list")
            enum = [self._check(_from_json(kind, v)) for v in enum]
        self.enum = enum
        default = doc.get("default", _MISSING)
        self.default = _MISSING if default is _MISSING or default is None else self.coerce_json(default)
        # As QueryAPIGate: a parameter without a default is required unless it says otherwise.
        required = doc.get("required", self.default is _MISSING)
        if not isinstance(required, bool):
            raise ParamError("required must be true or false")
        self.required = required
        # Stored by a release that ran patterns on Python's re, and not runnable on RE2: the
        # catalog still loads (every other query is served), and a value for this parameter is
        # refused until the query is saved again. Set last: the default and enum were checked.
        self._refused = refused

    @staticmethod
    def _number(doc: Mapping[str, Any], key: str) -> int | float | None:
        value = doc.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ParamError(f"{key} must be a number")
        return value

    @staticmethod
    def _length(doc: Mapping[str, Any], key: str) -> int | None:
        value = doc.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ParamError(f"{key} must be a non-negative integer")
        return value

    def coerce_text(self, text: str) -> Any:
        if len(text) > MAX_TEXT:
            raise ParamError("is too long")
        return self._check(_from_text(self.kind, text))

    def coerce_json(self, value: Any) -> Any:
        if isinstance(value, str) and len(value) > MAX_TEXT:
            raise ParamError("is too long")
        return self._check(_from_json(self.kind, value))

    def _check(self, value: Any) -> Any:
        kind = self.kind
        if kind == "int" and not INT_MIN <= value <= INT_MAX:
            raise ParamError("is out of the 64-bit integer range")
        if kind == "float" and not math.isfinite(value):
            raise ParamError("must be a finite number")
        if kind == "str":
            if "\x00" in value:
                raise ParamError("must not contain NUL characters")
            if self.min_length is not None and len(value) < self.min_length:
                raise ParamError(f"must be at least {self.min_length} characters")
            if self.max_length is not None and len(value) > self.max_length:
                raise ParamError(f"must be at most {self.max_length} characters")
            if self._refused is not None:
                raise ParamError(f"cannot be checked: {self._refused}; the query must be saved again")
            if self._regex is not None:
                if len(value) > patterns.MAX_INPUT:
                    raise ParamError(f"must be at most {patterns.MAX_INPUT} characters to be checked against "
                                     f"its pattern")
                if not self._regex.matches(value):
                    raise ParamError(f"must match {self.pattern}")
        if kind in ("int", "float"):
            if self.min is not None and value < self.min:
                raise ParamError(f"must be >= {self.min}")
            if self.max is not None and value > self.max:
                raise ParamError(f"must be <= {self.max}")
        if self.enum is not None and value not in self.enum:
            raise ParamError(f"must be one of {', '.join(map(str, self.enum))}")
        return value

    def to_doc(self) -> dict:
        doc = {"type": JSON_NAMES.get(self.kind, self.kind), "required": self.required}
        for key in ("enum", "min", "max", "min_length", "max_length", "pattern"):
            if getattr(self, key) is not None:
                doc[key] = getattr(self, key)
        if self.default is not _MISSING:
            doc["default"] = self.default.isoformat() if hasattr(self.default, "isoformat") else self.default
        if self.description:
            doc["description"] = self.description
        return doc


def _compiled(pattern: str | None, stored: bool) -> tuple[patterns.Pattern | None, str | None]:
    """The pattern compiled, and why a stored one cannot be (None when it can)."""
    if not pattern:
        return None, None
    try:
        return patterns.Pattern(pattern), None
    except patterns.PatternError as exc:
        if stored:
            return None, str(exc)
        raise


def compile_specs(doc: Any, stored: bool = False) -> list[ParamSpec]:
    """Check a saved query's ``parameters`` object; raises a 400 naming every bad field:
    ``pattern_unsupported`` when the only problems are patterns RE2 cannot run.
    ``stored``: the parameters of a stored version (see ``ParamSpec``)."""
    if doc is None:
        return []
    if not isinstance(doc, Mapping):
        raise bad_request("invalid_body", "parameters must be an object")
    specs, errors, unsupported = [], {}, set()
    for name, spec_doc in doc.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", name):
            errors[name] = "is not a valid parameter name"
            continue
        if isinstance(spec_doc, str):  # QueryAPIGate's short form: "aid": "int"
            spec_doc = {"type": spec_doc}
        try:
            specs.append(ParamSpec(name, spec_doc, stored))
        except patterns.PatternError as exc:
            errors[name] = str(exc)
            if exc.unsupported:
                unsupported.add(name)
        except ParamError as exc:
            errors[name] = str(exc)
    if errors:
        if set(errors) == unsupported:
            raise bad_request("pattern_unsupported", "a parameter's pattern cannot run on the linear-time "
                              "engine (RE2)", errors=errors)
        raise bad_request("invalid_body", "invalid parameter definitions", errors=errors)
    return specs


class ParamBinder:
    """Turns a call's raw arguments into the ordered tuple the prepared statement takes."""

    __slots__ = ("specs", "names")

    def __init__(self, specs: list[ParamSpec]) -> None:
        self.specs = specs
        self.names = frozenset(s.name for s in specs)

    def bind(self, raw: Mapping[str, Any], from_text: bool) -> tuple:
        values, errors = [], None
        for spec in self.specs:
            value = raw.get(spec.name, _MISSING)
            try:
                if value is _MISSING or value is None or (from_text and value == "" and spec.kind != "str"):
                    if spec.default is not _MISSING:
                        values.append(spec.default)
                        continue
                    if spec.required:
                        raise ParamError("is required")
                    values.append(None)
                    continue
                if from_text:
                    if isinstance(value, list):
                        raise ParamError("was given more than once")
                    values.append(spec.coerce_text(value))
                else:
                    values.append(spec.coerce_json(value))
            except ParamError as exc:
                errors = errors or {}
                errors[spec.name] = str(exc)
        for name in raw:
            if name not in self.names:
                errors = errors or {}
                errors[name] = "is not a parameter of this query"
        if errors:
            only_missing = all(v == "is required" for v in errors.values())
            raise bad_request("param_required" if only_missing else "param_invalid",
                              "invalid parameters", errors=errors)
        return tuple(values)
