"""What a data session's values are in Python: PostgreSQL's own text wherever a Python
conversion could lose or fail, marked with what that text is.

psycopg2's default conversions lose values or fail on ordinary ones: ``numeric`` through
float (9007199254740993 became 9007199254740992.0), ``infinity`` as 9999-12-31, ``24:00`` as
midnight, BC years and years past 9999 raise, ``bytea`` as bytes that were then decoded as
UTF-8 with replacement, ``timetz`` a value no encoder takes, json numbers past 64 bits or
past a double's range, an array with bounds other than 1 raises. So each type whose
conversion can lose or fail is cast here, once per session (``configure``), to the text the
server sent, in one of three marked forms the formats know (``gateway.execution.formats``):

- :class:`Number`: the exact text of a finite ``numeric``, ``float4`` or ``float8``
  (``9007199254740993``, ``1.50``, ``1e+308``, ``-0``): a JSON number token as it is, never
  a float on the way;
- :class:`Json`: the text of a ``json`` or ``jsonb`` value, embedded as it is in JSON;
- :class:`Rendered`: the text of any other value with a typed rendering (dates and times in
  ISO 8601 as PostgreSQL's ``to_json`` writes them, intervals, ``bytea`` as ``\\x`` hex, money,
  ranges, ``NaN`` and ``Infinity``, an array with its bounds): a string in every format, and
  never taken for a spreadsheet formula (``-infinity`` and ``-1 days`` are values, not formulas).

Plain ``str`` is text the database holds as text (``text``, ``varchar``, enums, domains over
text, ``xml``, composites and every type this module does not name): the only values the
CSV/TSV formula guard looks at. ``bool``, ``int`` (``int2``/``int4``/``int8``/``oid``), ``None`` and
lists (arrays, elements cast the same way) stay what psycopg2 makes of them: exact already.

The session options that make the texts stable are pinned in ``pool.session_options``
(``bytea_output=hex``, ``extra_float_digits=3``: the shortest exact float text, ``IntervalStyle=postgres``;
psycopg2 itself sets ``DateStyle`` to ISO when it is not).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg2.extensions as ext


class Number(str):
    """The exact text of a finite number, as PostgreSQL wrote it."""

    __slots__ = ()

    def __reduce__(self) -> tuple:   # pickled by class and text only (gateway.cache.entry's allow list)
        return (Number, (str(self),))


class Json(str):
    """The text of a json or jsonb value, as PostgreSQL wrote it (valid JSON)."""

    __slots__ = ()

    def __reduce__(self) -> tuple:
        return (Json, (str(self),))


class Rendered(str):
    """PostgreSQL's text of a value of a non-text type: a string everywhere, never guarded."""

    __slots__ = ()

    def __reduce__(self) -> tuple:
        return (Rendered, (str(self),))


MARKED = (Number, Json, Rendered)

Cast = Callable[[str | None, Any], object]


def _number(text: str | None, _cur: Any) -> object:
    if text is None:
        return None
    # NaN, Infinity and -Infinity are no JSON numbers: strings, as PostgreSQL's to_json has them.
    return Number(text) if text[-1].isdigit() else Rendered(text)


def _json(text: str | None, _cur: Any) -> object:
    return None if text is None else Json(text)


def _text(text: str | None, _cur: Any) -> object:
    return None if text is None else Rendered(text)


def _timestamp(text: str | None, _cur: Any) -> object:
    """``2023-06-01 02:17:00.5`` -> ``2023-06-01T02:17:00.5`` (``to_json``'s ISO 8601 form;
    ``0044-03-15T12:00:00 BC``, ``10000-01-01T00:00:00``, ``infinity`` as PostgreSQL has them)."""
    return None if text is None else Rendered(text.replace(" ", "T", 1))


def _timestamptz(text: str | None, _cur: Any) -> object:
    """As ``_timestamp``, the offset with its minutes (``+00`` -> ``+00:00``, ``+05:30`` and
    ``+00:09:21`` kept), before a ``BC``: exactly ``to_json``'s text."""
    if text is None:
        return None
    bc = text.endswith(" BC")
    core = text[:-3] if bc else text
    if len(core) > 3 and core[-3] in "+-":
        core += ":00"
    core = core.replace(" ", "T", 1)
    return Rendered(core + " BC" if bc else core)


# Built-in type OIDs (fixed by PostgreSQL: pg_type.dat) -> their cast; each array type's
# elements are cast by its element type's cast.
_SCALARS: dict[str, tuple[Cast, tuple[int, ...], tuple[int, ...]]] = {
    # name: (cast, OIDs, their array types' OIDs)
    "NUMBER": (_number, (1700, 700, 701), (1231, 1021, 1022)),        # numeric, float4, float8
    "JSON": (_json, (114, 3802), (199, 3807)),                        # json, jsonb
    "TIMESTAMP": (_timestamp, (1114,), (1115,)),
    "TIMESTAMPTZ": (_timestamptz, (1184,), (1185,)),
    # date, time, timetz, interval, bytea, money; the ranges (psycopg2.extras makes Range objects)
    "RENDERED": (_text, (1082, 1083, 1266, 1186, 17, 790, 3904, 3906, 3908, 3910, 3912, 3926),
                 (1182, 1183, 1270, 1187, 1001, 791, 3905, 3907, 3909, 3911, 3913, 3927)),
}


def _bounded(array: Any) -> Cast:
    """An array cast that keeps an array with bounds other than 1 (``[2:3]={1,2}``, which
    psycopg2 refuses to read) as PostgreSQL's text, bounds included."""
    def cast(text: str | None, cur: Any) -> object:
        if text is None:
            return None
        if text[:1] == "[":
            return Rendered(text)
        return array(text, cur)
    return cast


def _build() -> tuple[Any, ...]:
    casters: list[Any] = []
    array_oids: set[int] = set()
    for name, (cast, oids, arrays) in _SCALARS.items():
        scalar = ext.new_type(oids, f"GW_{name}", cast)
        casters.append(scalar)
        array = ext.new_array_type(arrays, f"GW_{name}_ARRAY", scalar)
        casters.append(ext.new_type(arrays, f"GW_{name}_ARRAY_BOUNDED", _bounded(array)))
        array_oids.update(arrays)
    # psycopg2's own array casts (int[], text[], bool[], inet[], ...): the same bounds rule.
    for oid, caster in list(ext.string_types.items()):
        if oid not in array_oids and caster.name.endswith("ARRAY"):
            casters.append(ext.new_type((oid,), f"GW_{caster.name}_BOUNDED", _bounded(caster)))
    return tuple(casters)


CASTERS = _build()   # prepared once, registered on each data session as it opens


def configure(conn: ext.connection) -> None:
    """Register the casts on a data session (the store's sessions keep psycopg2's own)."""
    for caster in CASTERS:
        ext.register_type(caster, conn)
