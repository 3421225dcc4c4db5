"""Stage cache: a cached answer sent with the HTTP semantics of a cache.

The entry holds the unmasked rows; they go through ``send_page`` with this call's key's plan
(masks, ``max_rows``) like rows from the database. Then: ``ETag`` (a digest of the body this
key gets, so two keys with different masks never share one), ``If-None-Match`` answered 304
without a body, ``Cache-Control: private, max-age=<seconds left>``, ``Vary: X-API-Key``, ``Age``,
``X-Cache``.

What ``send_page`` makes of the rows (the body, its type, the paging headers, the ETag) depends
only on the entry (its page and page size are in its digest), the format and the plan, so it is
made once and kept on the entry (``View``): a hit sends it. It is kept per format for a key with
nothing to mask (``plan.identity``: the rows go out as they are, whatever the key), else per
format and plan object. A key's plan is memoised per catalog snapshot and a change of the key
makes a new one (``gateway.pipeline.plans``), so a narrowed grant or a new mask is never answered
from the view of the plan it replaced; a masked key never gets a view made without its masks.
"""
from __future__ import annotations

import hashlib
import time
from typing import TYPE_CHECKING

from ..cache.entry import OVERHEAD
from ..errors import GatewayError
from .shape import send_page

if TYPE_CHECKING:
    import falcon

    from ..cache import Entry
    from ..governance import CallPlan
    from .args import CallArgs


class View:
    """One entry's answer for one format and plan: ready to send."""

    __slots__ = ("body", "content_type", "headers", "etag", "rows", "__weakref__")   # as its entry (from_memory.py)

    def __init__(self, body: bytes, content_type: str | None, headers: tuple[tuple[str, str], ...], etag: str,
                 rows: int) -> None:
        self.body = body
        self.content_type = content_type
        self.headers = headers      # the paging headers and the ETag
        self.etag = etag
        self.rows = rows


class _Page:
    """What ``send_page`` writes, caught instead of sent (its one source of a page's shape)."""

    __slots__ = ("data", "content_type", "headers")

    def __init__(self) -> None:
        self.data: bytes | None = None
        self.content_type: str | None = None
        self.headers: list[tuple[str, str]] = []

    def set_header(self, name: str, value: str) -> None:
        self.headers.append((name, value))


def view_of(entry: Entry, args: CallArgs, size: int, plan: CallPlan) -> View:
    key = (args.fmt, None if plan.identity else plan)
    view: View | None = entry.views.get(key)
    if view is None:
        page = _Page()
        rows = send_page(page, args, size, plan, entry.result, False)
        body = page.data or b""
        etag = '"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'
        made = View(body, page.content_type, (*page.headers, ("ETag", etag)), etag, rows)
        view = entry.keep(key, made, len(body) + OVERHEAD)
    return view


def cache_headers(entry: Entry, state: str, now: float) -> tuple[tuple[str, str], ...]:
    """What a cached answer says of its freshness, after its view's headers (the names as Falcon
    sends them: lower case). ``max-age`` lets the caller's own cache (a browser's, a client
    library's) keep the answer; ``Vary`` makes that cache key it by the API key too, so it never
    hands one key's answer to a request sent with another key for the same URL (on a 304 too:
    RFC 9110, 15.4.5)."""
    return (("cache-control", f"private, max-age={max(0, int(entry.expires - now))}"), ("vary", "X-API-Key"),
            ("age", str(max(0, int(now - entry.created)))), ("x-cache", state))


def send_cached(resp: falcon.Response, args: CallArgs, size: int, plan: CallPlan, entry: Entry, state: str,
                if_none_match: str | None, now: float | None = None, safe: bool = True) -> tuple[View, int]:
    """(the view sent, the status). ``safe``: the call's method is GET or HEAD, which a matching
    ``If-None-Match`` answers 304; any other, 412 (RFC 9110, 13.1.2)."""
    view = view_of(entry, args, size, plan)
    resp.set_headers((*view.headers, *cache_headers(entry, state, time.time() if now is None else now)))
    if if_none_match and _matches(if_none_match, view.etag):
        if not safe:
            raise GatewayError(412, "precondition_failed", "If-None-Match names the ETag of this answer",
                               headers={"ETag": view.etag})
        resp.status = 304
        resp.content_type = None   # a 304 carries no content (nor its type)
        return view, 304
    resp.data = view.body
    resp.content_type = view.content_type
    return view, 200


def purge_summary(reply: dict) -> str:
    """``X-Cache-Invalidated`` on a write that dropped cached answers: the workers that
    acknowledged, those still pending when it answered, and the milliseconds it waited."""
    pending = reply.get("pending") or ()
    workers = reply.get("workers")
    acked = "?" if workers is None else str(max(0, workers - len(pending)))
    state = "degraded" if reply.get("degraded") or reply.get("shared") == "unreachable" else f"pending={len(pending)}"
    return f"acked={acked}; {state}; ms={reply.get('waited_ms', 0):.1f}"


def _matches(header: str, etag: str) -> bool:
    if header.strip() == "*":
        return True
    return any(tag.strip().removeprefix("W/") == etag for tag in header.split(","))
