"""QueryAPIGate 0.43.0 and this gateway, side by side on the same data (issue 15): each call of
``compat_calls.calls()`` must answer the same way on both: the status, the error code and the
error envelope, the fields QueryAPIGate's own OpenAPI document marks as required, the rows (JSON,
NDJSON, CSV and TSV alike) and the paging headers. Or, for a call marked with a documented
difference (``compat_differences.py``), exactly that difference.
"""
from __future__ import annotations

import csv
import io
import json
import re
from xml.etree import ElementTree

import pytest
import yaml
from compat_calls import Call, calls
from compat_differences import DIFFERENCES

from helpers.util import ROOT

CALLS = calls(5432, "demo")    # the table's shape (ids, marks); the run uses the session's servers
ENVELOPE = {"error", "code", "request_id"}


def _json(reply):
    try:
        return json.loads(reply.content)
    except ValueError:
        return None


def required_fields(openapi: dict, name: str) -> set[str]:
    """The required properties of a component of QueryAPIGate's document, through ``allOf``."""
    schema = openapi["components"]["schemas"][name]
    fields = set(schema.get("required", ()))
    for part in schema.get("allOf", ()):
        if "$ref" in part:
            fields |= required_fields(openapi, part["$ref"].rsplit("/", 1)[1])
        else:
            fields |= set(part.get("required", ()))
    return fields


def rows_of(reply) -> list | None:
    """The rows of a data-plane answer, whatever its format (None when it has none)."""
    kind = (reply.headers.get("Content-Type") or "").split(";")[0].strip()
    text = reply.content.decode(errors="replace")
    if kind in ("text/csv", "text/tab-separated-values"):
        return [list(r) for r in csv.reader(io.StringIO(text), delimiter="," if kind == "text/csv" else "\t")]
    if kind == "application/x-yaml":
        return yaml.safe_load(text)
    if kind == "application/xml":
        return [{c.tag: c.text or "" for c in item} for item in ElementTree.fromstring(text)]
    if "ndjson" in kind or "jsonl" in kind:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    body = _json(reply)
    return body if isinstance(body, list) else None


def differences(call: Call, peer, ours, openapi: dict) -> list[str]:
    """What a script would trip on: each a line; none when the two answered alike."""
    found = []
    if peer.status != ours.status:
        found.append(f"status {peer.status} != {ours.status}")
    pj, oj = _json(peer), _json(ours)
    if isinstance(pj, dict) and "code" in pj and "error" in pj:
        if not isinstance(oj, dict) or oj.get("code") != pj["code"]:
            found.append(f"code {pj['code']!r} != {oj.get('code') if isinstance(oj, dict) else oj!r}")
        elif ENVELOPE - set(oj):
            found.append(f"error envelope lacks {sorted(ENVELOPE - set(oj))}")
        if "errors" in pj and set(pj["errors"]) != set(oj.get("errors") or ()):
            found.append(f"errors {sorted(pj['errors'])} != {sorted(oj.get('errors') or ())}")
        return found
    if peer.status >= 300:
        return found
    if call.schema:
        need = required_fields(openapi, call.schema)
        if isinstance(pj, dict) and need - set(pj):
            found.append(f"(the peer itself lacks {sorted(need - set(pj))})")
        if not isinstance(oj, dict):
            found.append(f"not an object: {ours.content[:100]!r}")
        else:
            if need - set(oj):
                found.append(f"{call.schema} lacks required {sorted(need - set(oj))}")
            for item_list in ("items",):
                if item_list in need and isinstance(pj.get(item_list), list) and pj[item_list] \
                        and isinstance(oj.get(item_list), list) and oj[item_list]:
                    inner = _item_fields(openapi, call.schema)
                    if inner:
                        missing = inner[1] - set(oj[item_list][0])
                        if missing:
                            found.append(f"{inner[0]} (items) lacks required {sorted(missing)}")
            if call.path == "/api/v1/queries" and call.qs:   # a filtered listing: the same queries
                theirs = sorted(i["name"] for i in pj["items"])
                mine = sorted(i["name"] for i in oj.get("items", ()))
                if theirs != mine:
                    found.append(f"listed {theirs} != {mine}")
        return found
    if call.path == "/catalog":
        def names(doc):
            return sorted((q["name"], q["version"], q["connection_name"], q["can_write"],
                           {n: (r["type"], r["required"]) for n, r in q["parameters"].items()})
                          for q in doc["queries"]), doc["caller"]["name"]
        if names(pj) != names(oj):
            found.append(f"catalog {names(pj)} != {names(oj)}")
        return found
    if call.path.startswith(("/q/", "/execute_sql")):
        theirs, mine = rows_of(peer), rows_of(ours)
        if theirs != mine:
            found.append(f"rows {str(theirs)[:200]} != {str(mine)[:200]}")
    for header in call.headers:
        if peer.headers.get(header) != ours.headers.get(header):
            found.append(f"{header}: {peer.headers.get(header)!r} != {ours.headers.get(header)!r}")
    return found


def _item_fields(openapi: dict, name: str) -> tuple[str, set[str]] | None:
    """The required fields of a listing's items: (what to call them, the fields)."""
    items = openapi["components"]["schemas"][name].get("properties", {}).get("items", {}).get("items", {})
    ref = items.get("$ref")
    if ref:
        inner = ref.rsplit("/", 1)[1]
        return inner, required_fields(openapi, inner)
    return (f"{name} item", set(items["required"])) if items.get("required") else None


@pytest.mark.parametrize("call", CALLS, ids=[c.id for c in CALLS])
def test_same_answer(call: Call, replies, peer_openapi):
    peer, ours = replies[call.id]
    if call.differs:
        difference = DIFFERENCES[call.differs]
        assert difference.check(peer, ours), (
            f"{call.method} {call.path}: documented difference {call.differs!r} does not hold:\n"
            f"  QueryAPIGate: {peer.status} {peer.content[:300]!r}\n  ours:         {ours.status} "
            f"{ours.content[:300]!r}")
        return
    found = differences(call, peer, ours, peer_openapi)
    assert not found, (f"{call.method} {call.path} answered differently:\n  " + "\n  ".join(found) +
                       f"\n  QueryAPIGate: {peer.status} {peer.content[:400]!r}\n  ours:         {ours.status} "
                       f"{ours.content[:400]!r}")


def test_every_difference_is_used_and_documented():
    """Each documented difference is shown by a call, and docs/compatibility.md lists it with the count of calls."""
    used = {c.differs for c in CALLS if c.differs}
    assert used == set(DIFFERENCES), f"unused: {sorted(set(DIFFERENCES) - used)}"
    section = (ROOT / "docs" / "compatibility.md").read_text()
    for name in DIFFERENCES:
        assert f"`{name}`" in section, f"docs/compatibility.md does not list {name}"
    counted = re.search(r"(\d+) calls", section)
    assert counted and int(counted.group(1)) == len(CALLS), "docs/compatibility.md's count of calls compared is stale"
    differing = re.search(r"(\d+) documented differences", section)
    assert differing and int(differing.group(1)) == len(DIFFERENCES)
