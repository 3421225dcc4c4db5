"""Admission: may this call run now? (rate limits per client IP and per key, quotas).

The interface the data plane calls, and the "off" implementation. The fleet's
implementation (``fleet.leases.LeasedAdmission``) shares every limit through Redis with
pre-debited leases, so a call almost never waits on Redis.

``admit_*`` return the response headers to add (a tuple of name/value pairs) or raise a
429 ``GatewayError``; ``settle`` reports the rows a call returned (row quotas settle after
the call); ``rows_left`` bounds a stream.
"""
from __future__ import annotations

from typing import Protocol

from .errors import GatewayError

NO_HEADERS: tuple = ()


class Admission(Protocol):
    def admit_ip(self, ip: str) -> tuple: ...

    def admit_key(self, key) -> tuple: ...

    def settle(self, key, rows: int) -> None: ...

    def rows_left(self, key) -> int | None:
        """Rows the key may still receive this period as far as this worker knows (None:
        no rows quota). A stream stops there; a page may overshoot by its own size."""
        ...

    def close(self) -> None: ...


class AdmitAll:
    """Admission switched off: nothing is limited or counted."""

    __slots__ = ()

    def admit_ip(self, ip: str) -> tuple:
        return NO_HEADERS

    def admit_key(self, key) -> tuple:
        return NO_HEADERS

    def settle(self, key, rows: int) -> None:
        pass

    def rows_left(self, key) -> int | None:
        return None

    def usage(self, keys) -> list:
        return []

    def close(self) -> None:
        pass


def rate_limited(retry_after_s: float, headers: tuple, what: str) -> GatewayError:
    seconds = max(1, int(retry_after_s + 0.999))
    return GatewayError(429, "rate_limited", f"rate limit of {what} exceeded; retry after {seconds}s",
                        extra={"retry_after": seconds},
                        headers=dict(headers, **{"Retry-After": str(seconds)}))


def quota_exceeded(what: str, reset_s: int, headers: tuple) -> GatewayError:
    return GatewayError(429, "quota_exceeded", f"the key's {what} quota is used up",
                        extra={"retry_after": reset_s},
                        headers=dict(headers, **{"Retry-After": str(reset_s)}))
