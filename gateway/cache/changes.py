"""The cache's listener of a committed management change: what the change may have made stale
is purged on every worker before the management call returns (``ResponseCache.on_change``),
judged against the catalog the change made (a change of a query none of whose versions is
cached purges nothing)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import GatewayError

if TYPE_CHECKING:
    from ..model.catalog import Catalog
    from ..model.state import CatalogHolder
    from .service import ResponseCache


class PurgeOnChange:
    __slots__ = ("_cache", "_holder")

    def __init__(self, cache: ResponseCache, holder: CatalogHolder) -> None:
        self._cache = cache
        self._holder = holder

    def __call__(self, change: dict) -> None:
        try:
            current: Catalog | None = self._holder.current()   # the new catalog: what could have been cached
        except GatewayError:
            current = None                                     # unknown: purge
        self._cache.on_change(change, current)
