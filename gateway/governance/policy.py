"""A statement analysed under this gateway's settings: its search path, the deny list (the
default one, ``GATEWAY_DENY_FUNCTIONS`` added, ``GATEWAY_ALLOW_FUNCTIONS`` lifted) and the
catalog relations a statement may read (``GATEWAY_ALLOW_CATALOG_RELATIONS``). The one place
the save-time analysis of a saved query (``gateway.control.queries``) and the ad-hoc path
(``gateway.pipeline.adhoc``) take them from, so the two cannot drift apart."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .analysis import DEFAULT_DENIED, Analysis, analyze

if TYPE_CHECKING:
    from ..settings import Settings
    from ..sql import Statement
    from .schema import Schema


def analyze_under(statement: Statement, schema: Schema, settings: Settings) -> Analysis:
    """:func:`gateway.governance.analyze` with the settings' lists; raises as it does."""
    return analyze(statement, schema, settings.search_path_tuple(),
                   denied_functions=DEFAULT_DENIED | settings.denied_functions(),
                   allowed_functions=settings.allowed_functions(),
                   allowed_catalog_relations=settings.allowed_catalog_relations())
