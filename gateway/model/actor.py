"""Who makes a management change: the audit trail's subject, a value the control services
set per request and the store writes with the change (a model value, so that the store
does not import the control plane to name it)."""
from __future__ import annotations


class Actor:
    """Who is making a management change (set per request by the management resources)."""

    __slots__ = ("name", "ip", "request_id")

    def __init__(self, name: str = "system", ip: str | None = None, request_id: str | None = None) -> None:
        self.name = name
        self.ip = ip
        self.request_id = request_id
