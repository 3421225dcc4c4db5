"""How a worker learns of management changes: the interface, and the in-process version.

``fleet.bus.RedisBus`` is the fleet's implementation (pub/sub, acknowledgements and
freshness leases across every worker and host). ``LocalSync`` serves a single process
with no Redis (unit tests, embedded tools): a change reloads the catalog in place.
"""
from __future__ import annotations

from typing import Protocol

from .state import FOREVER, CatalogHolder


class Sync(Protocol):
    def start(self, holder: CatalogHolder) -> None:
        """Begin keeping ``holder`` current (worker side)."""

    def announce(self, generation: int) -> dict:
        """After a change committed at ``generation``: return once no worker serves older."""

    def ready(self) -> bool:
        """Whether the shared state is reachable (for ``/ready``)."""

    def close(self) -> None: ...


class LocalSync:
    __slots__ = ("_holder",)

    def __init__(self):
        self._holder: CatalogHolder | None = None

    def start(self, holder: CatalogHolder) -> None:
        self._holder = holder
        holder.reload()
        holder.renew(FOREVER)

    def announce(self, generation: int) -> dict:
        self._holder.reload(at_least=generation)
        return {"workers": 1, "waited_ms": 0.0}

    def ready(self) -> bool:
        return True

    def close(self) -> None:
        pass
