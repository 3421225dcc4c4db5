"""Rate limits and quotas as values: parsed and checked when a key is saved (or the server
starts), so a call only reads numbers.

Rate limits use QueryAPIGate's grammar, ``"N/second|minute|hour|day"``, as a token bucket:
it refills at N per period and holds at most ``burst`` tokens (default N, as QueryAPIGate's
bucket holds "the full quota"). So in any window of length T a caller is admitted at most
``burst + N * T / period`` calls; for T = one period, the limit plus the burst.
"""
from __future__ import annotations

import calendar
import re
import time
from datetime import UTC, datetime
from typing import Any

from ..errors import bad_request

PERIODS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}
QUOTA_PERIODS = ("day", "month")
_RATE = re.compile(r"\s*(\d{1,12})\s*/\s*(second|minute|hour|day)s?\s*")


class Rate:
    __slots__ = ("limit", "period_s", "burst", "per_s", "text")

    def __init__(self, limit: int, period_s: int, burst: int | None = None, text: str = "") -> None:
        self.limit = limit
        self.period_s = period_s
        self.burst = limit if burst is None else burst
        self.per_s = limit / period_s
        self.text = text or f"{limit}/{period_s}s"

    @classmethod
    def parse(cls, text: Any, burst: Any = None, field: str = "rate_limit") -> Rate:
        match = _RATE.fullmatch(text) if isinstance(text, str) else None
        if match is None or int(match.group(1)) < 1:
            raise bad_request("invalid_body", f"{field} must look like '100/minute' "
                              "(N >= 1 per second, minute, hour or day)", errors={field: "is not N/period"})
        if burst is not None and (isinstance(burst, bool) or not isinstance(burst, int) or burst < 1):
            raise bad_request("invalid_body", "rate_limit_burst must be a positive integer",
                              errors={"rate_limit_burst": "must be a positive integer"})
        return cls(int(match.group(1)), PERIODS[match.group(2)], burst, text.strip())


class Quota:
    __slots__ = ("calls", "rows", "per")

    def __init__(self, calls: int | None, rows: int | None, per: str) -> None:
        self.calls = calls
        self.rows = rows
        self.per = per

    @classmethod
    def parse(cls, doc: Any) -> Quota:
        if not isinstance(doc, dict) or set(doc) - {"calls", "rows", "per"} or doc.get("per") not in QUOTA_PERIODS:
            raise bad_request("invalid_body", 'quota must be {"calls": N, "rows": N, "per": "day|month"}',
                              errors={"quota": "is malformed"})
        counts = {}
        for field in ("calls", "rows"):
            value = doc.get(field)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise bad_request("invalid_body", f"quota.{field} must be a non-negative integer",
                                  errors={f"quota.{field}": "must be a non-negative integer"})
            counts[field] = value
        if counts["calls"] is None and counts["rows"] is None:
            raise bad_request("invalid_body", "quota needs calls or rows", errors={"quota": "needs calls or rows"})
        return cls(counts["calls"], counts["rows"], doc["per"])

    def to_doc(self) -> dict:
        return {k: getattr(self, k) for k in ("calls", "rows", "per") if getattr(self, k) is not None}


def quota_window(per: str, now: float | None = None) -> tuple[str, int]:
    """The current period's id and its end (UTC epoch seconds)."""
    period, _, end = quota_period(per, now)
    return period, end


def quota_period(per: str, now: float | None = None) -> tuple[str, int, int]:
    """The current period's id, its start and its end (UTC epoch seconds)."""
    now = time.time() if now is None else now
    day = datetime.fromtimestamp(now, UTC)
    if per == "day":
        start = calendar.timegm((day.year, day.month, day.day, 0, 0, 0))
        return day.strftime("%Y-%m-%d"), start, start + 86400
    year, month = (day.year + 1, 1) if day.month == 12 else (day.year, day.month + 1)
    return (day.strftime("%Y-%m"), calendar.timegm((day.year, day.month, 1, 0, 0, 0)),
            calendar.timegm((year, month, 1, 0, 0, 0)))
