"""The audit trail and the run history, read back (``/api/v1/audit``, ``/api/v1/history``)."""
from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from ..errors import bad_request
from ..store import statements as store
from .changes import Changes
from .validate import filters, iso, limit

AUDIT_FILTERS = {"kind": "kind = %s", "name": "name = %s", "action": "action = %s",
                 "since": "at >= %s", "until": "at < %s"}
HISTORY_FILTERS = {"query": "h.query = %s", "key": "k.name = %s", "status": "h.status = %s",
                   "code": "h.code = %s", "since": "h.at >= %s", "until": "h.at < %s", "cursor": "h.id < %s"}
ADHOC = "execute_sql"   # the name the history gives an ad-hoc statement

class Audit:
    def __init__(self, changes: Changes) -> None:
        self._changes = changes

    def audit(self, args: Mapping[str, Any]) -> dict:
        where, values = filters(args, AUDIT_FILTERS)
        with self._changes.cursor() as cur:
            rows = store.audit_entries(cur, where, values, limit(args))
            total = store.audit_count(cur, where, values)
        # QueryAPIGate's fields beside this gateway's: timestamp, target, changes (the state after).
        return {"items": [dict(r, at=iso(r["at"]), timestamp=iso(r["at"]), target=r["name"],
                               changes=r["after"] if r["after"] is not None else {}) for r in rows],
                "total": total, "actions": sorted(ACTIONS), "retention": None}

    def history(self, args: Mapping[str, Any]) -> dict:
        """Newest first, a page of ``limit``; ``next_cursor`` (QueryAPIGate's) continues after it."""
        if "cursor" in args:
            args = dict(args, cursor=_cursor_id(args["cursor"]))
        where, values = filters(args, HISTORY_FILTERS)
        size = limit(args)
        with self._changes.cursor() as cur:
            rows = store.history_entries(cur, where, values, size)
        items = [dict(r, at=iso(r["at"]), executed_at=iso(r["at"]), key_name=r["key"], rows=r["row_count"],
                      kind="adhoc" if r["query"] == ADHOC else "saved") for r in rows]
        more = len(rows) == size
        return {"items": items,
                "next_cursor": base64.urlsafe_b64encode(str(rows[-1]["id"]).encode()).decode() if more else None}


ACTIONS = ("create", "update", "delete", "rotate", "end_previous_secret", "add_version", "publish", "unpublish")


def _cursor_id(raw: object) -> str:
    try:
        text = base64.urlsafe_b64decode(str(raw).encode()).decode()
    except (ValueError, UnicodeDecodeError):
        text = ""
    if not text.isdigit():
        raise bad_request("invalid_filter", "cursor is not one this server returned")
    return text
