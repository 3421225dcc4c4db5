"""The audit trail and the run history, read back (``/api/v1/audit``, ``/api/v1/history``)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..store import statements as store
from .changes import Changes
from .validate import filters, iso, limit

AUDIT_FILTERS = {"kind": "kind = %s", "name": "name = %s", "action": "action = %s",
                 "since": "at >= %s", "until": "at < %s"}
HISTORY_FILTERS = {"query": "h.query = %s", "key": "k.name = %s", "status": "h.status = %s",
                   "code": "h.code = %s", "since": "h.at >= %s", "until": "h.at < %s"}


class Audit:
    def __init__(self, changes: Changes) -> None:
        self._changes = changes

    def audit(self, args: Mapping[str, Any]) -> dict:
        where, values = filters(args, AUDIT_FILTERS)
        with self._changes.cursor() as cur:
            rows = store.audit_entries(cur, where, values, limit(args))
        return {"items": [dict(r, at=iso(r["at"])) for r in rows]}

    def history(self, args: Mapping[str, Any]) -> dict:
        where, values = filters(args, HISTORY_FILTERS)
        with self._changes.cursor() as cur:
            rows = store.history_entries(cur, where, values, limit(args))
        return {"items": [dict(r, at=iso(r["at"])) for r in rows]}
