"""A statement analysed under this gateway's settings: its search path, the deny list (the
default one, ``GATEWAY_DENY_FUNCTIONS`` added, ``GATEWAY_ALLOW_FUNCTIONS`` lifted) and the
catalog relations a statement may read (``GATEWAY_ALLOW_CATALOG_RELATIONS``). The one place
the save-time analysis of a saved query (``gateway.control.queries``) and the ad-hoc path
(``gateway.pipeline.adhoc``) take them from, so the two cannot drift apart; and what a
stored analysis must still pass under them when a call is planned (``refused_now``)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import bad_request
from .analysis import DEFAULT_DENIED, Analysis, analyze, denied_matcher
from .schema import split_qname

if TYPE_CHECKING:
    from ..settings import Settings
    from ..sql import Statement
    from .schema import Schema


def analyze_under(statement: str | Statement, schema: Schema, settings: Settings) -> Analysis:
    """:func:`gateway.governance.analyze` with the settings' lists; raises as it does."""
    return analyze(statement, schema, settings.search_path_tuple(), denied_functions=_denied(settings),
                   allowed_functions=settings.allowed_functions(),
                   allowed_catalog_relations=settings.allowed_catalog_relations())


def refused_now(analysis: Analysis, settings: Settings) -> None:
    """Raise what this gateway's settings refuse in ``analysis``, which was made under the
    settings of the gateway that saved the query (400 ``catalog_not_allowed``,
    ``function_not_allowed``, as at save time): a catalog relation the server no longer names,
    a function the deny list names now (a setting changed, or a release denies more). Called
    once per key and statement (the plan is memoised), never per call."""
    allowed = {split_qname(name) for name in settings.allowed_catalog_relations()}
    for relation in analysis.catalogs:
        if split_qname(relation) not in allowed:
            raise bad_request("catalog_not_allowed", f"relation {relation} is the server's; this gateway does "
                              "not allow reading it (GATEWAY_ALLOW_CATALOG_RELATIONS)")
    denied = denied_matcher(_denied(settings), settings.allowed_functions())
    for function in (*analysis.functions, *analysis.user_functions, *analysis.side_effects):
        name = function.rsplit(".", 1)[-1]
        if denied(name):
            raise bad_request("function_not_allowed", f"function {name}() is not allowed")


def _denied(settings: Settings) -> frozenset[str]:
    """The deny list: the default one and what ``GATEWAY_DENY_FUNCTIONS`` adds."""
    return DEFAULT_DENIED | settings.denied_functions()
