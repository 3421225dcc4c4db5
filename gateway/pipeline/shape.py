"""Stage shape: the key's masks applied, serialised in the asked format, as one page or
as a stream; a stream is capped (``max_rows``, what is left of the rows quota) and each of
its batches charged to the quota as it is sent."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from ..execution.formats import CONTENT_TYPES, render, stream_chunks

if TYPE_CHECKING:
    import falcon

    from ..execution.runner import Batches, Result
    from ..governance import CallPlan
    from .args import CallArgs


class Page(Protocol):
    """Where a page is written: a Falcon response, or what ``cached.view_of`` keeps of it."""

    data: bytes | None
    content_type: str | None

    def set_header(self, name: str, value: str) -> None: ...


def send_page(resp: Page, args: CallArgs, size: int, plan: CallPlan, result: Result, write: bool) -> int:
    """One page of a result, masked, in the asked format, with the paging headers; returns
    the rows sent. (``result.rows`` holds up to size + 1 rows: the extra one only tells
    that there is more.)"""
    rows = result.rows
    has_more = len(rows) > size
    if has_more:
        rows = rows[:size]
    columns, rows = plan.apply(result.columns, rows)
    resp.data = render(args.fmt, columns, rows, args.formula_guard)   # before any header: an error is whole
    resp.content_type = CONTENT_TYPES[args.fmt]
    resp.set_header("X-Page", str(args.page))
    resp.set_header("X-Page-Size", str(size))
    resp.set_header("X-Row-Count", str(len(rows)))
    resp.set_header("X-Has-More", "true" if has_more else "false")
    if write:
        resp.set_header("X-Rows-Affected", str(max(result.rowcount, 0)))
    return len(rows)


def send_stream(resp: falcon.Response, args: CallArgs, plan: CallPlan, columns: Sequence[str], batches: Batches,
                limit: int | None, take: Callable[[int], int]) -> None:
    """``limit``: the key's ``max_rows`` (None: none); ``take(n)``: charges up to n rows to the
    rows quota and says how many may go (``Admission.take_rows``)."""
    if not plan.identity:
        out = plan.columns(columns)
        batches = _masked(plan, columns, batches)
        columns = out
    resp.stream = stream_chunks(args.fmt, columns, _metered(batches, limit, take), args.formula_guard)
    resp.content_type = CONTENT_TYPES[args.fmt]
    resp.set_header("X-Stream", "true")


def _masked(plan: CallPlan, columns: Sequence[str], batches: Batches) -> Batches:
    try:
        for batch in batches:
            yield plan.apply(columns, batch)[1]
    finally:
        batches.close()


def _metered(batches: Batches, limit: int | None, take: Callable[[int], int]) -> Batches:
    """A stream capped at ``limit`` rows (None: no cap) and at the rows quota: each batch is
    charged as it is sent, as far as the quota grants it (checked and charged in one step);
    the cursor is closed early when either runs out."""
    left = limit
    try:
        for batch in batches:
            if left is not None and len(batch) > left:
                batch = batch[:left]
            wanted = len(batch)
            granted = take(wanted) if wanted else 0
            if granted < wanted:
                batch = batch[:granted]
            if left is not None:
                left -= len(batch)
            if batch:
                yield batch
            if granted < wanted or left == 0:
                return
    finally:
        batches.close()
