"""The stable error codes that governance adds (code -> (HTTP status, meaning)): analysis
codes (400) are raised when a query is saved (or an ad-hoc statement is first seen),
planning codes (403) when a key meets a query version. ``write_not_allowed`` (403) and
``invalid_body`` are the gateway's own. The table lives in ``gateway.errors`` with every
other code, so that the errors module depends on nothing.
"""
from __future__ import annotations

from ..errors import GOVERNANCE_CODES as CODES

__all__ = ["CODES"]
