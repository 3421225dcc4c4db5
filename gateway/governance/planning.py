"""The call plan of one key for one query version: the analysis checked against the key's
grants (plus the saved query's own mask rules), once, and compiled into a :class:`CallPlan`.

``plan(analysis, grants, query_masks, hash_key=...)`` raises 403 ``table_not_allowed``,
``write_not_allowed``, ``write_op_not_allowed``, ``mask_unresolvable`` or ``function_opaque``,
in the order of its steps: the relations, the statement's kind, the functions, the views,
the values a write stores, then each output column's action.

What masking decides, per output column: the strictest action of every rule matching any of
its source columns (its lineage; reading a parent table reads its children, so a rule naming
a partition or an inheriting child applies there too). A ``hash`` or ``mask`` applies only to
a column that reaches the output as it is (renamed, through subqueries, CTEs and set
operations); of a value computed from it (``substr``, ``||``, a cast, an aggregate, a
constructor ...) it could be undone piece by piece, so that is refused (``mask_unresolvable``),
while ``null`` and ``drop`` apply to it. It is also refused rather than applied
when a masked column reaches the output through a whole-row reference (``row_to_json(t)``,
``to_jsonb(t.*)``, a bare ``t``), when a view is read and no rule names the view (lineage
stops at a view; name it, e.g. ``customer_view.*`` with ``keep``), or when a write would store
masked values. What masking does not hide: a masked column used in WHERE / JOIN / ORDER BY
still filters and orders (an oracle); ``Analysis.referenced`` lists those columns.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import forbidden
from .analysis import Analysis, OutputColumn
from .call_plan import CallPlan
from .grants import Grants
from .masks import RANK, UNDOABLE, MaskRule, compile_masks
from .schema import Kin, qname, split_qname

__all__ = ["plan"]

# The strictest rule for a source column, as (action, the rule's pattern); None when no rule
# names it.
_Decision = tuple[str, str] | None
_Kin = Kin | Mapping[tuple[str, str], Sequence[tuple[str, str]]] | None


def plan(analysis: Analysis, grants: Grants | None, query_masks: Any = None, *, hash_key: bytes | None = None,
         server_allows_writes: bool = True, kin: _Kin = None) -> CallPlan:
    """Check ``analysis`` against ``grants`` (plus the saved query's own ``query_masks``)
    and compile what each call does. Raises 403 ``GatewayError`` on a refusal.

    ``kin``: the connection's inheritance and partition trees (and views) as they are now
    (``gateway.governance.schema.Kin``; a mapping of trees alone is taken too). The analysis
    knows the children a table had when the query was saved; a rule naming a partition
    attached since (or the parent of a table that joined a tree since) matches the column
    read through its kin as well; a table that is a view now is refused like a view."""
    if grants is None:
        grants = Grants()
    _check_tables(analysis, grants)
    _check_kind(analysis, grants, server_allows_writes)
    rules = tuple(grants.masks) + compile_masks(query_masks)
    _check_functions(analysis, grants, rules)
    if not rules:
        return CallPlan([None] * len(analysis.columns), hash_key, grants.max_rows, grants.query_timeout)
    _check_views(analysis, rules, kin)
    decide = _decider(rules, kin)
    _check_write_sources(analysis, decide)
    actions: list[str | None] = []
    fired = []
    for position, column in enumerate(analysis.columns):
        action, best = _column_action(column, decide)
        actions.append(action)
        if action is not None and best is not None:   # an action comes from a best rule
            fired.append({"position": position, "column": column.name, "action": action,
                          "source": best[2], "rule": best[1]})
    # Masks follow names: the result's columns are checked against these on every call.
    names = [c.name if c.exact_name else None for c in analysis.columns]
    return CallPlan(actions, hash_key, grants.max_rows, grants.query_timeout, fired, names)


def _check_tables(analysis: Analysis, grants: Grants) -> None:
    for table in analysis.tables:
        if not grants.table_allowed(table):
            raise forbidden("table_not_allowed", f"this key may not read or write {table}")


def _check_kind(analysis: Analysis, grants: Grants, server_allows_writes: bool) -> None:
    """A write only for a key and a server that allow writes, and only the operations the key
    may do; a read with no side effects."""
    if analysis.kind == "write":
        if not (server_allows_writes and grants.allow_writes):
            raise forbidden("write_not_allowed", "this query writes; the key or the server does not allow writes")
        if grants.allowed_write_ops is not None:
            # ON CONFLICT DO UPDATE also updates; a MERGE also does what its actions do.
            for op in analysis.write_ops or (analysis.write_op,):
                if op not in grants.allowed_write_ops:
                    raise forbidden("write_op_not_allowed", f"this key may not {op}" + (
                        "" if op == analysis.write_op else f" (this {analysis.write_op} also does {op})"))
    elif analysis.kind != "read":
        raise forbidden("write_not_allowed", f"unknown statement kind {analysis.kind!r}")
    elif analysis.side_effects:
        raise forbidden("write_not_allowed", f"this query calls {', '.join(f + '()' for f in analysis.side_effects)}, "
                        "which changes state outside the statement; it runs only as a write, for a key and a "
                        "server that allow writes")


def _check_functions(analysis: Analysis, grants: Grants, rules: tuple[MaskRule, ...]) -> None:
    """What a user-defined function reads cannot be checked: refused under any restriction."""
    restricted = bool(rules) or grants.allowed_tables is not None
    if restricted and analysis.user_functions:
        raise forbidden("function_opaque", "this query calls user-defined function(s) "
                        f"{', '.join(analysis.user_functions)}, whose reads cannot be checked against this "
                        "key's table or mask restrictions")


def _check_views(analysis: Analysis, rules: tuple[MaskRule, ...], kin: _Kin) -> None:
    """Lineage stops at a view: a view read (then, or since) needs a rule naming it."""
    views_now: frozenset = getattr(kin, "views", None) or frozenset()
    for table in analysis.tables if views_now else ():
        relation = _table_parts(table)
        if table not in analysis.views and relation in views_now \
                and not any(rule.names_relation(*relation) for rule in rules):
            raise forbidden("mask_unresolvable", f"{table} was a table when this query was saved and is a view now: "
                            "masks are not traced through views; save the query again (a rule must then name the "
                            "view)")
    for view in analysis.views:
        schema_name, table = _table_parts(view)
        if not any(rule.names_relation(schema_name, table) for rule in rules):
            raise forbidden("mask_unresolvable", f"this query reads view {view}; masks are not traced through "
                            f"views, so a mask rule must name the view itself (e.g. {table}.* with 'keep', "
                            f"or {table}.<column> with an action)")


def _decider(rules: tuple[MaskRule, ...], kin: _Kin) -> Callable[[str], _Decision]:
    """The strictest rule matching a source column, or the same column read through its kin
    (a partition, an inheriting child, a parent), memoised per source."""
    cache: dict[str, _Decision] = {}

    def decide(source: str) -> _Decision:
        if source not in cache:
            parts = split_qname(source)
            tables = [(parts[0], parts[1])]
            if kin:
                tables.extend(kin.get(tables[0], ()))
            best = None
            for rule in rules:
                if any(rule.matches(s, t, parts[-1]) for s, t in tables) \
                        and (best is None or RANK[rule.action] < RANK[best[0]]):
                    best = (rule.action, rule.pattern)
            cache[source] = best
        return cache[source]
    return decide


def _check_write_sources(analysis: Analysis, decide: Callable[[str], _Decision]) -> None:
    for source in analysis.write_sources:
        got = decide(source)
        if got is not None and got[0] != "keep":
            raise forbidden("mask_unresolvable", f"this write would store values of masked column {source}")


def _column_action(column: OutputColumn, decide: Callable[[str], _Decision]
                   ) -> tuple[str | None, tuple[str, str, str] | None]:
    """The action on one output column (None: shown as it is) and the (action, rule, source)
    that decided it. Refused: a masked column's whole rows, or a hash or partial mask of a
    value computed from a masked column."""
    best = None
    computed = None   # a masked source this column is computed from, not the value itself
    for source in sorted(column.sources):
        got = decide(source)
        if got is not None and (best is None or RANK[got[0]] < RANK[best[0]]):
            best = (got[0], got[1], source)
        if got is not None and got[0] != "keep" and column.whole_row:
            parts = split_qname(source)
            if qname(parts[0], parts[1]) in column.whole_row:
                raise forbidden("mask_unresolvable", f"output column {column.name!r} holds whole rows of a "
                                f"table with masked column {source}; name the columns instead")
        if got is not None and got[0] != "keep" and computed is None and source in column.derived:
            computed = source
    action = None if best is None or best[0] == "keep" else best[0]
    if computed is not None and action in UNDOABLE:
        raise forbidden("mask_unresolvable", f"output column {column.name!r} is computed from masked column "
                        f"{computed}, and a {action} of a computed value (substr, ||, a cast, an aggregate ...) "
                        f"can be undone piece by piece: select {split_qname(computed)[-1]} as it is (it is "
                        f"then masked), or mask it with null or drop")
    return action, best


def _table_parts(qualified: str) -> tuple[str, str]:
    parts = split_qname(qualified)
    return parts[0], parts[1]
