"""``/api/v1/cache/entries``: what the cache holds, and purges (admin key), in QueryAPIGate's
shapes (its routes, its entry fields, 204 on a delete) with the fleet's additions.

    GET    /api/v1/cache/entries[?query=<name>]   this worker's entries and the shared tier's,
                                                  soonest to expire first
    DELETE /api/v1/cache/entries[?query=<name>]   drop them (or one query's) on every worker and in Redis
    GET    /api/v1/cache/entries/<key>            one entry's rows, unmasked (the admin's view)
    DELETE /api/v1/cache/entries/<key>            drop one entry everywhere

A purge answers 204 once every live worker has dropped the entries (``gateway.cache``);
``X-Cache-Invalidated`` says how many acknowledged and how long it took.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import orjson

from ..control.validate import NAME
from ..errors import bad_request, not_found
from ..execution.formats import render_json
from ..pipeline.cached import purge_summary

if TYPE_CHECKING:
    import falcon

    from ..cache import ResponseCache

_KEY = re.compile(r"[0-9a-f]{32}")


def _query(req: falcon.Request) -> str | None:
    unknown = set(req.params) - {"query", "limit"}
    if unknown:
        raise bad_request("invalid_filter", f"unknown filter(s): {', '.join(sorted(unknown))}")
    name = req.params.get("query")
    if name is not None and (not isinstance(name, str) or not NAME.fullmatch(name)):
        raise bad_request("invalid_filter", "query must be one query name")
    return name


def _limit(req: falcon.Request) -> int:
    raw = req.params.get("limit", "1000")
    # ASCII digits only: str.isdigit() also takes "²", which int() refuses.
    if not isinstance(raw, str) or not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= 10_000:
        raise bad_request("invalid_filter", "limit must be an integer from 1 to 10000")
    return int(raw)


class _Cached:
    def __init__(self, cache: ResponseCache, admin_check: Callable[[falcon.Request], None]) -> None:
        self._cache = cache
        self._check = admin_check

    def _purge(self, resp: falcon.Response, purge: dict) -> None:
        resp.set_header("X-Cache-Invalidated", purge_summary(self._cache.purge(purge)))
        resp.status = 204


class CacheEntriesResource(_Cached):
    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        self._check(req)
        query, limit = _query(req), _limit(req)
        items = self._cache.entries(query, limit)
        memory = self._cache.memory
        resp.data = orjson.dumps({"items": items, "count": len(items), "bytes": memory.bytes,
                                  "max_bytes": memory.max_bytes})
        resp.content_type = "application/json"
        resp.set_header("Cache-Control", "no-store")

    def on_delete(self, req: falcon.Request, resp: falcon.Response) -> None:
        self._check(req)
        query = _query(req)
        self._purge(resp, {"op": "all"} if query is None else {"op": "query", "name": query})


class CacheEntryResource(_Cached):
    def on_get(self, req: falcon.Request, resp: falcon.Response, key: str) -> None:
        self._check(req)
        entry = self._cache.entry(key) if _KEY.fullmatch(key) else None
        if entry is None:
            raise not_found("cache_entry_not_found", "cache entry not found (missing, expired, purged or evicted)")
        resp.data = render_json(entry.columns, entry.rows)
        resp.content_type = "application/json"
        resp.set_header("Cache-Control", "no-store")

    def on_delete(self, req: falcon.Request, resp: falcon.Response, key: str) -> None:
        self._check(req)
        if not _KEY.fullmatch(key):   # no such entry: nothing to drop (QueryAPIGate answers 204 too)
            resp.status = 204
            return
        self._purge(resp, {"op": "key", "key": key})
