"""Stages execute and shape for a stream (``stream=true``): the statement runs once on a
pooled session whose cursor is read batch by batch as the body is sent; the batches are masked
and metered as they go (``shape.send_stream``), and charged to the rows quota one by one (the
history records no rows: they are not all known when the call is recorded).

What a stream holds is given back when its body is closed (``Then``): its session, its place
on the connection's bulkhead, and the key's ``max_concurrent`` place."""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import GatewayError
from ..execution import runner
from .shape import send_stream

if TYPE_CHECKING:
    import falcon

    from ..execution.bulkhead import Claim
    from ..execution.pool import SessionPool
    from ..governance import CallPlan
    from .args import CallArgs

log = logging.getLogger("gateway")
MAX_LOGGED = 2000   # as gateway.http.errors bounds a logged detail


def send_streamed(resp: falcon.Response, text: str, args: CallArgs, plan: CallPlan, pool: SessionPool, claim: Claim,
                  fetch_rows: int, take: Callable[[int], int], request_id: str) -> None:
    """Run ``text`` on ``pool`` holding the call's place on its connection (``claim``) until
    the body is closed, as it holds its session; ``take(n)``: charges n rows to the quota and
    says how many may go (``Admission.take_rows``)."""
    claim.enter()
    try:
        columns, source = runner.stream(pool, text, claim.deadline.statement_ms(), fetch_rows)
    except BaseException:
        claim.leave()
        raise
    try:
        send_stream(resp, args, plan, columns, _logged(source, request_id), plan.max_rows, take)
    except BaseException:   # refused once the cursor was open (the result's names): give its session back
        _close_then_leave(source, claim)
        raise
    # The server closes the body whether it was read or not: the session and the place go back then.
    release_after(resp, functools.partial(_close_then_leave, source, claim))


def release_after(resp: falcon.Response, then: Callable[[], object]) -> None:
    """``then`` runs once the body of ``resp`` (a stream) is closed."""
    resp.stream = Then(resp.stream, then)


def _close_then_leave(source: runner.Batches, claim: Claim) -> None:
    try:
        source.close()
    finally:
        claim.leave()


def _logged(batches: runner.Batches, request_id: str) -> runner.Batches:
    """A stream that fails after its first rows were sent cannot answer with an error body:
    the server cuts it. Its cause goes to the log here, under the request id, as an error
    before the rows does (``gateway.http.errors``); what propagates carries no server text."""
    try:
        yield from batches
    except GatewayError as exc:
        if exc.detail:
            log.warning("request %s: %s (the stream was cut after rows were sent): %s", request_id, exc.code,
                        exc.detail[:MAX_LOGGED])
        raise GatewayError(exc.status, exc.code, exc.message, extra=exc.extra) from None
    finally:
        batches.close()


class Then:
    """A stream's chunks, running ``then`` once when they end: the last chunk sent, an error,
    or the server closing the body (a client that went away, or a stream never started: WSGI
    servers call ``close()`` on the body in every case; a generator's ``finally`` would not run
    for one closed before its first chunk)."""

    __slots__ = ("_chunks", "_then")

    def __init__(self, chunks: Any, then: Callable[[], object]) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._then: Callable[[], object] | None = then

    def __iter__(self) -> Then:
        return self

    def __next__(self) -> bytes:
        try:
            return next(self._chunks)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        then, self._then = self._then, None
        if then is None:
            return
        try:
            close = getattr(self._chunks, "close", None)
            if close is not None:
                close()
        finally:
            then()
