"""The two refusals of an analysis: it cannot be sure (``analysis_failed``), or the statement
does what no key may (``sql_not_allowed``). Both 400."""
from __future__ import annotations

from ...errors import GatewayError, bad_request


def failed(message: str) -> GatewayError:
    return bad_request("analysis_failed", message)


def not_allowed(message: str) -> GatewayError:
    return bad_request("sql_not_allowed", message)



# Refused both where sqlglot nests them and on the statement itself.
SELECT_INTO = "SELECT ... INTO creates a table and is not allowed"
ROW_LOCKS = "row locks (FOR UPDATE / FOR SHARE) are not allowed"
TOO_DEEP = "the statement is nested too deeply to analyse"
