"""A call's deadline: its timeout counted from when its request arrived, not from when a
thread took it.

The timeout is the lowest of the caller's ``timeout``, the key's ``query_timeout`` and the
server's statement timeout (``pipeline.args.lower_timeout``). Time spent waiting for a thread
(on the server's loop) or for a place on the connection (``bulkhead.Bulkhead``) is part of
it, so a call that waited past its timeout is refused at once (504 ``deadline_exceeded``)
instead of running and answering late, and the statement timeout sent to PostgreSQL is what
is left.
"""
from __future__ import annotations

import time

from ..errors import GatewayError

# Below this much time left a statement is not started: it could only be cancelled after a
# round trip (and PostgreSQL reads a statement_timeout of 0 as none at all).
MIN_START_MS = 10
# A call on the server's own timeout runs under the session's (no SET LOCAL, the hot path's
# single statement) while at most this share of it has gone by: it may end that much late.
SESSION_SLACK = 0.01


def expired() -> GatewayError:
    return GatewayError(504, "deadline_exceeded", "the call's timeout, counted from when the request arrived, ran "
                        "out before its statement could start; nothing was run")


class Deadline:
    __slots__ = ("at", "start_by", "_session_until")

    def __init__(self, arrived: float, timeout_ms: int | None, server_ms: int) -> None:
        """``arrived``: ``time.monotonic()`` when the request arrived; ``timeout_ms``: the call's
        own (None: the server's ``server_ms``, which every data session has already)."""
        self.at = arrived + (server_ms if timeout_ms is None else timeout_ms) / 1000
        self.start_by = self.at - MIN_START_MS / 1000     # the latest moment a statement may start
        # Until when the session's own statement timeout is close enough (None: the call has its own).
        self._session_until = arrived + server_ms * SESSION_SLACK / 1000 if timeout_ms is None else None

    def check(self) -> None:
        """Raise 504 ``deadline_exceeded`` when the deadline has passed (an answer now would be late)."""
        if time.monotonic() >= self.at:
            raise expired()

    def left_s(self) -> float:
        return self.start_by - time.monotonic()

    def statement_ms(self) -> int | None:
        """The statement timeout to send now: what is left of the deadline; None where the
        session's own is within ``SESSION_SLACK`` of it. Raises ``deadline_exceeded`` when
        too little is left to start."""
        now = time.monotonic()
        if now >= self.start_by:
            raise expired()
        if self._session_until is not None and now <= self._session_until:
            return None
        return int((self.at - now) * 1000)
