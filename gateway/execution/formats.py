"""Output formats: JSON (a list of row objects, QueryAPIGate's shape), NDJSON, CSV and TSV, each
as a whole page or as a stream of chunks; XML and YAML as a whole page (QueryAPIGate's shapes).

NUMERIC arrives as float (a typecaster set on the session, as QueryAPIGate returns it),
timestamps as ISO 8601; bytes are decoded as UTF-8 with replacement.
"""
from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import date, datetime, time
from xml.etree import ElementTree

import orjson
import yaml

FORMATS = ("json", "ndjson", "csv", "tsv", "xml", "yaml")
STREAM_FORMATS = ("ndjson", "csv", "tsv")
CONTENT_TYPES = {"json": "application/json", "ndjson": "application/x-ndjson",
                 "csv": "text/csv; charset=utf-8", "tsv": "text/tab-separated-values; charset=utf-8",
                 "xml": "application/xml; charset=utf-8", "yaml": "application/x-yaml; charset=utf-8"}
_OPTS = orjson.OPT_SERIALIZE_NUMPY


def _default(value: object) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def unique_names(names: Iterable[str]) -> list[str]:
    """``SELECT a.id, b.id`` gives ``id`` and ``id_2``, so no column is lost."""
    seen: dict[str, int] = {}
    result = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        result.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return result


def render_json(columns: Sequence[str], rows: Iterable[Sequence]) -> bytes:
    return orjson.dumps([dict(zip(columns, row, strict=False)) for row in rows], default=_default)


def render_ndjson(columns: Sequence[str], rows: Sequence[Sequence]) -> bytes:
    if not rows:
        return b""
    return b"\n".join(orjson.dumps(dict(zip(columns, row, strict=False)), default=_default) for row in rows) + b"\n"


def _csv_cell(value: object) -> object:
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, (dict, list)):
        return orjson.dumps(value).decode()
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def render_csv(columns: Sequence[str], rows: Iterable[Sequence], header: bool = True, delimiter: str = ",") -> bytes:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n", delimiter=delimiter)
    if header:
        writer.writerow(columns)
    writer.writerows([_csv_cell(v) for v in row] for row in rows)
    return buffer.getvalue().encode()


def render_tsv(columns: Sequence[str], rows: Iterable[Sequence], header: bool = True) -> bytes:
    """Tab-separated, quoted as CSV where a value holds a tab, a quote or a line break (QueryAPIGate's)."""
    return render_csv(columns, rows, header, delimiter="\t")


def _plain(value: object) -> object:
    """A cell as text-friendly data: timestamps as ISO 8601 (as JSON has them), bytes decoded."""
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    return value


def _xml_name(name: str) -> str:
    """A column name as an XML element name (QueryAPIGate's rule)."""
    name = re.sub(r"[^\w.\-]", "_", name)
    return name if re.match(r"[A-Za-z_]", name) else f"_{name}"


def _xml_text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (dict, list)):
        return orjson.dumps(value).decode()
    return str(_plain(value))


def render_xml(columns: Sequence[str], rows: Iterable[Sequence]) -> bytes:
    """``<data><item><column>value</column>...</item>...</data>`` (QueryAPIGate's shape); NULL is empty."""
    root = ElementTree.Element("data")
    tags = [_xml_name(c) for c in columns]
    for row in rows:
        item = ElementTree.SubElement(root, "item")
        for tag, value in zip(tags, row, strict=False):
            ElementTree.SubElement(item, tag).text = _xml_text(value)
    return ElementTree.tostring(root, encoding="utf-8", xml_declaration=False)


def render_yaml(columns: Sequence[str], rows: Iterable[Sequence]) -> bytes:
    """A YAML list of row mappings (QueryAPIGate's: ``yaml.safe_dump``, block style, column order kept)."""
    docs = [{c: _plain(v) for c, v in zip(columns, row, strict=False)} for row in rows]
    return yaml.safe_dump(docs, default_flow_style=False, sort_keys=False, allow_unicode=True).encode()


RENDERERS: dict[str, Callable[[Sequence[str], Sequence[Sequence]], bytes]] = {
    "json": render_json, "ndjson": render_ndjson, "csv": render_csv, "tsv": render_tsv, "xml": render_xml,
    "yaml": render_yaml}


def stream_chunks(fmt: str, columns: Sequence[str], batches: Iterable[Sequence[Sequence]]) -> Iterator[bytes]:
    """Yield encoded chunks, one per batch of rows, for a streamed response."""
    if fmt in ("csv", "tsv"):
        render = RENDERERS[fmt]
        yield render(columns, [], header=True)   # type: ignore[call-arg]
        for rows in batches:
            yield render(columns, rows, header=False)   # type: ignore[call-arg]
    else:
        for rows in batches:
            yield render_ndjson(columns, rows)
