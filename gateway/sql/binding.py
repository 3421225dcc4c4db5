"""Values into a statement, for the paths that cannot use a prepared statement (a
server-side cursor for ``stream=true``, ad-hoc statements): each value becomes one typed
literal at a position where PostgreSQL's own parser reported a parameter, and the result is
parsed again and must have the statement's shape, with exactly that literal at each of
those positions. A value that could change the statement (close a quote, open a comment)
cannot pass that check, whatever the quoting rules; the check costs one parse per call.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import date, datetime
from typing import Any

from ..errors import GatewayError, bad_request
from .reader import Statement, parse_tree
from .trees import alike, shape

_INT4 = (-(2 ** 31), 2 ** 31 - 1)
_INT8 = (-(2 ** 63), 2 ** 63 - 1)
_CAST_SHAPES: dict[str, dict] = {}


def _cast_shape(cast: str) -> dict:
    """The parse tree's typeName for ``::cast`` (read once per type name)."""
    got = _CAST_SHAPES.get(cast)
    if got is None:
        tree = shape(parse_tree(f"SELECT NULL::{cast}"))
        got = _CAST_SHAPES[cast] = tree["SelectStmt"]["targetList"][0]["ResTarget"]["val"]["TypeCast"]["typeName"]
    return got


def _quote(text: str) -> str:
    # standard_conforming_strings is on in every data session: only the quote is special.
    return "'" + text.replace("'", "''") + "'"


def _constant(text: str) -> dict:
    return {"A_Const": {"sval": {"sval": text}}}


def literal(value: Any, cast: str | None = None) -> tuple[str, dict]:
    """SQL text for ``value`` and the parse node PostgreSQL must read from it. Without a
    declared type, a value keeps the type its JSON form has as a SQL literal (text as an
    untyped string, whole numbers as int4/int8/numeric, fractions as numeric)."""
    if isinstance(value, str) and "\x00" in value:
        raise bad_request("param_invalid", "a value contains a NUL character")
    node: dict
    if value is None:
        text, node = "NULL", {"A_Const": {"isnull": True}}
    elif isinstance(value, bool):
        text = "true" if value else "false"
        node = {"A_Const": {"boolval": {"boolval": True} if value else {}}}
    elif isinstance(value, str):
        text, node = _quote(value), _constant(value)
    elif isinstance(value, int):
        written = str(value)
        if cast is None:
            cast = "int4" if _INT4[0] <= value <= _INT4[1] else "int8" if _INT8[0] <= value <= _INT8[1] else "numeric"
        text, node = _quote(written), _constant(written)
    elif isinstance(value, float):
        written = repr(value) if math.isfinite(value) else ("NaN" if math.isnan(value) else
                                                              "Infinity" if value > 0 else "-Infinity")
        if cast is None:
            cast = "numeric" if math.isfinite(value) else "float8"
        text, node = _quote(written), _constant(written)
    elif isinstance(value, (date, datetime)):
        written = value.isoformat()
        if cast is None:
            cast = "timestamp" if isinstance(value, datetime) else "date"
        text, node = _quote(written), _constant(written)
    else:
        raise bad_request("param_invalid", f"a value of type {type(value).__name__} cannot be bound")
    if cast is None:
        return text, node
    return f"{text}::{cast}", {"TypeCast": {"arg": node, "typeName": _cast_shape(cast)}}


class Template:
    """A statement read by PostgreSQL's parser, ready to take one literal per parameter."""

    __slots__ = ("_pieces", "_numbers", "_tree", "_casts")

    def __init__(self, statement: Statement, casts: Sequence[str | None] | None = None) -> None:
        text, pieces, numbers, last = statement.text, [], [], 0
        for offset in statement.params:
            end = offset + 1
            while end < len(text) and text[end].isdigit():
                end += 1
            pieces.append(text[last:offset])
            numbers.append(int(text[offset + 1:end]) - 1)
            last = end
        pieces.append(text[last:])
        self._pieces = tuple(pieces)
        self._numbers = tuple(numbers)
        self._tree = statement.tree
        self._casts = tuple(casts) if casts is not None else (None,) * (max(numbers, default=-1) + 1)

    def render(self, values: Sequence) -> str:
        """The statement with ``values[n]`` as a literal at each ``$n+1``, checked."""
        made = [literal(v, c) for v, c in zip(values, self._casts, strict=False)]   # short: checked below
        if len(made) != len(self._casts):
            raise bad_request("param_invalid", "a value is missing")
        parts = [self._pieces[0]]
        for number, piece in zip(self._numbers, self._pieces[1:], strict=True):
            parts.append(made[number][0])
            parts.append(piece)
        text = "".join(parts)
        try:
            tree = parse_tree(text)
        except GatewayError:
            tree = None
        if tree is None or not alike(self._tree, tree, [node for _, node in made]):
            raise bad_request("param_invalid", "a value would change the statement; it was not run")
        return text
