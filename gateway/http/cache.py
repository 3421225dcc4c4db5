"""``/api/v1/cache/entries``: what the cache holds, and purges (admin key).

    GET    /api/v1/cache/entries[?query=<name>]   this worker's entries (and the shared tier's)
    DELETE /api/v1/cache/entries[?query=<name>]   drop them on every worker and in Redis
    DELETE /api/v1/cache/entries/<query>          the same for one query

A purge returns once every live worker has dropped the entries (``gateway.cache``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import orjson

from ..control.validate import NAME
from ..errors import bad_request

if TYPE_CHECKING:
    import falcon

    from ..cache import ResponseCache


def _send(resp: falcon.Response, doc: object) -> None:
    resp.data = orjson.dumps(doc)
    resp.content_type = "application/json"
    resp.set_header("Cache-Control", "no-store")


def _query(req: falcon.Request) -> str | None:
    unknown = set(req.params) - {"query", "limit"}
    if unknown:
        raise bad_request("invalid_filter", f"unknown filter(s): {', '.join(sorted(unknown))}")
    name = req.params.get("query")
    if name is not None and (not isinstance(name, str) or not NAME.fullmatch(name)):
        raise bad_request("invalid_filter", "query must be one query name")
    return name


class CacheEntriesResource:
    def __init__(self, cache: ResponseCache, admin_check: Callable[[falcon.Request], None]) -> None:
        self._cache = cache
        self._check = admin_check

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        self._check(req)
        query = _query(req)
        raw = req.params.get("limit", "1000")
        if not isinstance(raw, str) or not raw.isdigit() or not 1 <= int(raw) <= 10_000:
            raise bad_request("invalid_filter", "limit must be an integer from 1 to 10000")
        items = self._cache.entries(query, int(raw))
        memory = self._cache.memory
        _send(resp, {"items": items, "count": len(items), "bytes": memory.bytes, "max_bytes": memory.max_bytes})

    def on_delete(self, req: falcon.Request, resp: falcon.Response) -> None:
        self._check(req)
        self._purge(resp, _query(req))

    def _purge(self, resp: falcon.Response, query: str | None) -> None:
        purge = {"op": "all"} if query is None else {"op": "query", "name": query}
        _send(resp, {"purged": query or "*", "sync": self._cache.purge(purge)})


class CacheQueryEntriesResource(CacheEntriesResource):
    def on_get(self, req: falcon.Request, resp: falcon.Response, query: str) -> None:  # type: ignore[override]
        self._check(req)
        items = self._cache.entries(query)
        _send(resp, {"items": items, "count": len(items)})

    def on_delete(self, req: falcon.Request, resp: falcon.Response, query: str) -> None:  # type: ignore[override]
        self._check(req)
        if not NAME.fullmatch(query):
            raise bad_request("invalid_filter", "not a query name")
        self._purge(resp, query)
