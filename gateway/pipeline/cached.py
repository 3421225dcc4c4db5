"""Stage 4, cache: a cached answer sent with the HTTP semantics of a cache.

The entry holds the unmasked rows; they go through ``send_page`` with this call's key's plan
(masks, ``max_rows``) like rows from the database. Then: ``ETag`` (a digest of the body this
key gets, so two keys with different masks never share one), ``If-None-Match`` answered 304
without a body, ``Cache-Control: private, max-age=<seconds left>``, ``Age``, ``X-Cache``.
"""
from __future__ import annotations

import hashlib
import time
from typing import TYPE_CHECKING

from .shape import send_page

if TYPE_CHECKING:
    import falcon

    from ..cache import Entry
    from ..governance import CallPlan
    from .args import CallArgs


def send_cached(resp: falcon.Response, args: CallArgs, size: int, plan: CallPlan, entry: Entry, state: str,
                if_none_match: str | None, now: float | None = None) -> tuple[int, int]:
    """(rows sent, status)."""
    rows = send_page(resp, args, size, plan, entry.result, False)
    now = time.time() if now is None else now
    etag = '"' + hashlib.blake2b(resp.data or b"", digest_size=12).hexdigest() + '"'
    resp.set_header("ETag", etag)
    resp.set_header("Cache-Control", f"private, max-age={max(0, int(entry.expires - now))}")
    resp.set_header("Age", str(max(0, int(now - entry.created))))
    resp.set_header("X-Cache", state)
    if if_none_match and _matches(if_none_match, etag):
        resp.status = 304
        resp.data = None
        resp.content_type = None   # a 304 carries no content (nor its type)
        return 0, 304
    return rows, 200


def purge_summary(reply: dict) -> str:
    """``X-Cache-Invalidated`` on a write that dropped cached answers: the workers that
    acknowledged, those still pending when it answered, and the milliseconds it waited."""
    pending = reply.get("pending") or ()
    workers = reply.get("workers")
    acked = "?" if workers is None else str(max(0, workers - len(pending)))
    state = "degraded" if reply.get("degraded") else f"pending={len(pending)}"
    return f"acked={acked}; {state}; ms={reply.get('waited_ms', 0):.1f}"


def _matches(header: str, etag: str) -> bool:
    if header.strip() == "*":
        return True
    return any(tag.strip().removeprefix("W/") == etag for tag in header.split(","))
