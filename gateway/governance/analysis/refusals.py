"""The two refusals of an analysis: it cannot be sure (``analysis_failed``), or the statement
does what no key may (``sql_not_allowed``). Both 400. Where PostgreSQL's reader
(``gateway.sql``) refuses the same, the words are its own: SELECT ... INTO and row locks
(refused where sqlglot nests them and on the statement itself), a tree too deep."""
from __future__ import annotations

from ...errors import GatewayError, bad_request
from ...sql.reader import ROW_LOCKS, SELECT_INTO, TOO_DEEP

__all__ = ["ROW_LOCKS", "SELECT_INTO", "TOO_DEEP", "failed", "not_allowed"]


def failed(message: str) -> GatewayError:
    return bad_request("analysis_failed", message)


def not_allowed(message: str) -> GatewayError:
    return bad_request("sql_not_allowed", message)


