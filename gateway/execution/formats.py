"""Output formats: JSON (a list of row objects, QueryAPIGate's shape), NDJSON, CSV and TSV, each
as a whole page or as a stream of chunks; XML and YAML as a whole page (QueryAPIGate's shapes).

Every value is answered exactly (the "Values" table of docs/formats.md): the data sessions hand over
PostgreSQL's own text wherever a Python conversion could lose or fail, marked with what it is
(``gateway.execution.values``), and each format writes that text as it is:

- JSON / NDJSON: a finite number is its exact text as a JSON number token (never a float on
  the way); a json/jsonb value is its document, embedded as PostgreSQL wrote it; ``NaN`` and
  ``Infinity`` (no JSON numbers) and every other typed value are strings; arrays are arrays;
  ``bool``, integers and NULL are JSON's own.
- CSV / TSV: the text itself; a text value that a spreadsheet would run as a formula (it starts
  with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return) is prefixed with ``'`` when the
  formula guard is on (``GATEWAY_CSV_FORMULA_GUARD``, OWASP's rule); numbers, dates and the other
  typed values are never touched (``-5``, ``-infinity``, ``-1 days`` stay as they are).
- XML: the text, escaped (``&``, ``<``, ``>``, and a carriage return as ``&#13;`` so that no parser
  folds it into a line feed); a value holding a character XML 1.0 cannot carry (NUL, most C0
  controls, U+FFFE, U+FFFF) is its UTF-8 in base64, marked ``encoding="base64"``; NULL is an
  empty element marked ``null="true"`` (an empty string is an empty element without it).
- YAML: numbers as number scalars holding the exact text (``!!float`` where YAML 1.1 has no
  plain form for it), json/jsonb as the structure it holds (its numbers as numbers), the rest
  as strings (PyYAML escapes what YAML cannot carry plainly).

A row that cannot be rendered anyway (a value of a kind no rule covers) is an error before
any byte of a page is sent (``value_unrenderable``); in a stream, the stream is cut.
"""
from __future__ import annotations

import base64
import csv
import functools
import json
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

import orjson
import yaml

from ..errors import GatewayError
from .values import Json, Number, Rendered

FORMATS = ("json", "ndjson", "csv", "tsv", "xml", "yaml")
STREAM_FORMATS = ("ndjson", "csv", "tsv")
CONTENT_TYPES = {"json": "application/json", "ndjson": "application/x-ndjson",
                 "csv": "text/csv; charset=utf-8", "tsv": "text/tab-separated-values; charset=utf-8",
                 "xml": "application/xml; charset=utf-8", "yaml": "application/x-yaml; charset=utf-8"}

# Marked values (str subclasses) are handed to ``_json_default``; plain str, int, bool, None,
# lists and dicts are encoded by orjson itself.
_OPTS = orjson.OPT_PASSTHROUGH_SUBCLASS


def unrenderable(fmt: str) -> GatewayError:
    return GatewayError(502, "value_unrenderable", f"the result holds a value this gateway cannot answer in {fmt}; "
                                                   "nothing was sent")


def _fragment(value: str) -> orjson.Fragment:
    return orjson.Fragment(str(value))   # str(): the plain text of the marked value


def _hex(value: bytes | bytearray | memoryview) -> str:
    return "\\x" + bytes(value).hex()


def _legacy(value: Any) -> Any:
    """Values no data session makes any more (rows cached by an earlier release, a driver's
    own type): the same rendering as their marked forms where there is one."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _hex(value)
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return orjson.Fragment(str(value)) if value.is_finite() else str(value)
    if isinstance(value, int):        # an int subclass (the passthrough hands it here)
        return int(value)
    if isinstance(value, str):
        return str(value)
    raise TypeError(f"no rendering for {type(value).__name__}")


def _document(value: str) -> orjson.Fragment:
    """A json value's text embedded as it is, except that a line break in it (a ``json``, not
    ``jsonb``, keeps its input's layout) becomes a space: outside strings, where alone JSON
    allows one, it is insignificant, and NDJSON needs one line per row."""
    if "\n" in value or "\r" in value:
        value = value.replace("\r", " ").replace("\n", " ")
    return orjson.Fragment(str(value))


_JSON_OF: dict[type, Callable[[Any], Any]] = {Number: _fragment, Json: _document, Rendered: str}


def _json_default(value: Any) -> Any:
    convert = _JSON_OF.get(type(value))
    return convert(value) if convert is not None else _legacy(value)


def _json_text(value: Any) -> str:
    return orjson.dumps(value, default=_json_default, option=_OPTS).decode()


def unique_names(names: Iterable[str]) -> list[str]:
    """``SELECT a.id, b.id`` gives ``id`` and ``id_2``, so no column is lost."""
    seen: dict[str, int] = {}
    result = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        result.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return result


def render_json(columns: Sequence[str], rows: Iterable[Sequence], formula_guard: bool = True) -> bytes:
    return orjson.dumps([dict(zip(columns, row, strict=False)) for row in rows], default=_json_default, option=_OPTS)


def render_ndjson(columns: Sequence[str], rows: Sequence[Sequence], formula_guard: bool = True) -> bytes:
    if not rows:
        return b""
    return b"\n".join(orjson.dumps(dict(zip(columns, row, strict=False)), default=_json_default, option=_OPTS)
                      for row in rows) + b"\n"


# --- CSV / TSV ---------------------------------------------------------------------------------
# OWASP's CSV injection list: what makes a spreadsheet read a cell as a formula.
_FORMULA_START = frozenset("=+-@\t\r")


def _guarded(value: str) -> str:
    """A text value a spreadsheet would run as a formula, prefixed with a single quote (shown
    as text, not run); any other text as it is."""
    return "'" + value if value and value[0] in _FORMULA_START else value


def _bool_cell(value: bool) -> str:
    return "true" if value else "false"


# Per cell, one set lookup by exact type: marked values, ints and None go as they are (csv writes
# str subclasses as they are, None as an empty cell); the rest through one dict lookup, and a
# type neither knows is an error (csv would write its repr).
_CSV_PASS = frozenset((Number, Json, Rendered, int, type(None), str))
_CSV_PASS_GUARDED = _CSV_PASS - {str}
_CSV_OF: dict[type, Callable[[Any], Any]] = {
    bool: _bool_cell, list: _json_text, dict: _json_text, bytes: _hex, memoryview: _hex, bytearray: _hex,
    datetime: datetime.isoformat, date: date.isoformat, time: time.isoformat, Decimal: str, float: repr,
    str: _guarded}


class _Lines:
    """The file a CSV writer writes to, one row per ``write``: the writer ends rows with CRLF so
    that it quotes a value holding a carriage return (it quotes only the characters of its line
    terminator: a bare CR left unquoted would split the row for every reader); rows end in LF
    here, as they always did."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, line: str) -> None:
        self.parts.append(line[:-2] + "\n")

    def text(self) -> str:
        return "".join(self.parts)


def render_csv(columns: Sequence[str], rows: Iterable[Sequence], header: bool = True, delimiter: str = ",",
               formula_guard: bool = True) -> bytes:
    buffer = _Lines()
    writer = csv.writer(buffer, lineterminator="\r\n", delimiter=delimiter)
    if header:
        # Column names are text a caller's SQL chose (``AS "=cmd"``): guarded as well.
        writer.writerow([_guarded(c) for c in columns] if formula_guard else columns)
    passed = _CSV_PASS_GUARDED if formula_guard else _CSV_PASS
    convert = _CSV_OF
    writer.writerows([v if type(v) in passed else convert[type(v)](v) for v in row] for row in rows)
    return buffer.text().encode()


def render_tsv(columns: Sequence[str], rows: Iterable[Sequence], header: bool = True,
               formula_guard: bool = True) -> bytes:
    """Tab-separated, quoted as CSV where a value holds a tab, a quote or a line break (QueryAPIGate's)."""
    return render_csv(columns, rows, header, delimiter="\t", formula_guard=formula_guard)


# --- XML ---------------------------------------------------------------------------------------
# Characters XML 1.0 cannot carry, not even as a character reference (section 2.2).
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_XML_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "\r": "&#13;"})


def _xml_name(name: str) -> str:
    """A column name as an XML element name (QueryAPIGate's rule)."""
    name = re.sub(r"[^\w.\-]", "_", name)
    return name if re.match(r"[A-Za-z_]", name) else f"_{name}"


_XML_OF: dict[type, Callable[[Any], str]] = {
    # bool as QueryAPIGate writes it (Python's str); the rest as in CSV.
    bool: str, int: str, list: _json_text, dict: _json_text, bytes: _hex, memoryview: _hex, bytearray: _hex,
    datetime: datetime.isoformat, date: date.isoformat, time: time.isoformat, Decimal: str, float: repr}


def _xml_element(tag: str, value: Any) -> str:
    if value is None:
        return f'<{tag} null="true" />'
    text = value if isinstance(value, str) else _XML_OF[type(value)](value)
    if _NOT_XML.search(text) is not None:
        encoded = base64.b64encode(text.encode("utf-8", "surrogatepass")).decode()
        return f'<{tag} encoding="base64">{encoded}</{tag}>'
    return f"<{tag}>{text.translate(_XML_ESCAPES)}</{tag}>"


def render_xml(columns: Sequence[str], rows: Iterable[Sequence], formula_guard: bool = True) -> bytes:
    """``<data><item><column>value</column>...</item>...</data>`` (QueryAPIGate's shape)."""
    tags = [_xml_name(c) for c in columns]
    parts = ["<data>"]
    for row in rows:
        parts.append("<item>")
        parts.extend(_xml_element(tag, value) for tag, value in zip(tags, row, strict=False))
        parts.append("</item>")
    if len(parts) == 1:
        return b"<data />"
    parts.append("</data>")
    return "".join(parts).encode("utf-8", "surrogatepass")


# --- YAML --------------------------------------------------------------------------------------
_INTEGER = re.compile(r"-?[0-9]+")


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """``yaml.safe_dump``'s dumper, knowing the marked values."""


class _DuplicateKey(ValueError):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict:
    mapping = dict(pairs)
    if len(mapping) != len(pairs):   # json (not jsonb) keeps duplicate keys; a YAML mapping cannot
        raise _DuplicateKey
    return mapping


def _represent_number(dumper: yaml.SafeDumper, value: Number) -> yaml.Node:
    tag = "tag:yaml.org,2002:int" if _INTEGER.fullmatch(value) else "tag:yaml.org,2002:float"
    return dumper.represent_scalar(tag, str(value))


def _represent_json(dumper: yaml.SafeDumper, value: Json) -> yaml.Node:
    try:
        data = json.loads(value, parse_float=Number, parse_int=Number, object_pairs_hook=_pairs)
        return dumper.represent_data(data)
    except (ValueError, RecursionError):
        # Duplicate keys, or nested too deep to walk: the document as a string, exact.
        return dumper.represent_str(str(value))


def _represent_text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    return dumper.represent_str(str(value))


def _represent_bytes(dumper: yaml.SafeDumper, value: bytes | memoryview) -> yaml.Node:
    return dumper.represent_str(_hex(value))


_Dumper.add_representer(Number, _represent_number)
_Dumper.add_representer(Json, _represent_json)
_Dumper.add_representer(Rendered, _represent_text)
_Dumper.add_representer(bytes, _represent_bytes)
_Dumper.add_representer(memoryview, _represent_bytes)


def _yaml_plain(value: Any) -> Any:
    if isinstance(value, (datetime, date, time)):   # cached by an earlier release
        return value.isoformat()
    return value


def render_yaml(columns: Sequence[str], rows: Iterable[Sequence], formula_guard: bool = True) -> bytes:
    """A YAML list of row mappings (QueryAPIGate's: ``yaml.safe_dump``, block style, column order kept)."""
    docs = [{c: _yaml_plain(v) for c, v in zip(columns, row, strict=False)} for row in rows]
    return yaml.dump(docs, Dumper=_Dumper, default_flow_style=False, sort_keys=False, allow_unicode=True).encode()


RENDERERS: dict[str, Callable[..., bytes]] = {
    "json": render_json, "ndjson": render_ndjson, "csv": render_csv, "tsv": render_tsv, "xml": render_xml,
    "yaml": render_yaml}


def render(fmt: str, columns: Sequence[str], rows: Sequence[Sequence], formula_guard: bool = True) -> bytes:
    """A whole page in ``fmt``; a value no rule renders is ``value_unrenderable`` (nothing sent)."""
    try:
        return RENDERERS[fmt](columns, rows, formula_guard=formula_guard)
    except Exception as exc:
        raise unrenderable(fmt).with_detail(f"{type(exc).__name__}: {exc}") from None


def stream_chunks(fmt: str, columns: Sequence[str], batches: Iterable[Sequence[Sequence]],
                  formula_guard: bool = True) -> Iterator[bytes]:
    """Yield encoded chunks, one per batch of rows, for a streamed response. A batch that cannot
    be rendered raises ``value_unrenderable``: the server cuts the stream (no clean end)."""
    if fmt in ("csv", "tsv"):
        delimiter = "," if fmt == "csv" else "\t"
        yield render_csv(columns, [], header=True, delimiter=delimiter, formula_guard=formula_guard)
        page = functools.partial(render_csv, columns, header=False, delimiter=delimiter, formula_guard=formula_guard)
    else:
        page = functools.partial(render_ndjson, columns)
    for rows in batches:
        try:
            yield page(rows)
        except Exception as exc:
            raise unrenderable(fmt).with_detail(f"{type(exc).__name__}: {exc}") from None
