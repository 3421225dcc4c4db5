"""What PostgreSQL's own parse tree says beyond what the walker reads from sqlglot's: every
operator the statement applies (an operator that is not built in calls a function, which the
deny list and the side-effect list must see), and the write operations a statement does
besides its own (an upsert updates; a MERGE does what its actions do)."""
from __future__ import annotations

from collections.abc import Iterable

from ...sql.trees import nodes

_BETWEEN_OPERATORS = ("<", "<=", ">", ">=")


def _operator_name(parts: Iterable[object] | None) -> str | None:
    names = [p["String"]["sval"] for p in parts or () if isinstance(p, dict) and "String" in p]
    return names[-1] if names else None


def operator_symbols(tree: dict) -> set[str]:
    """Every operator the statement applies, as PostgreSQL's parser reads it: written ones
    (``a && b``, ``OPERATOR(public.&&)``, ``ORDER BY a USING <``) and the ones a construct
    stands for (``LIKE`` is ``~~``, ``IN``/``NULLIF``/``IS DISTINCT FROM``/``CASE x WHEN``/
    ``JOIN ... USING``/``NATURAL JOIN`` are ``=``, ``BETWEEN`` is ``<=``/``>=``...). A type's
    default comparison (GROUP BY, DISTINCT, ORDER BY, UNION) is not followed."""
    symbols: set[str] = set()
    for node in nodes(tree):
        expr = node.get("A_Expr")
        if isinstance(expr, dict):
            if "BETWEEN" in str(expr.get("kind", "")):
                symbols.update(_BETWEEN_OPERATORS)
            else:
                symbols.add(_operator_name(expr.get("name")) or "=")
        link = node.get("SubLink")
        if isinstance(link, dict) and link.get("subLinkType") in ("ANY_SUBLINK", "ALL_SUBLINK", "ROWCOMPARE_SUBLINK"):
            symbols.add(_operator_name(link.get("operName")) or "=")
        sort = node.get("SortBy")
        if isinstance(sort, dict) and sort.get("useOp"):
            symbols.add(_operator_name(sort["useOp"]) or "")
        case = node.get("CaseExpr")
        if isinstance(case, dict) and case.get("arg") is not None:
            symbols.add("=")
        join = node.get("JoinExpr")   # USING and NATURAL joins compare with "=", looked up by name
        if isinstance(join, dict) and (join.get("usingClause") or join.get("isNatural")):
            symbols.add("=")
    symbols.discard("")
    return symbols


def tree_write_ops(tree: dict) -> set[str]:
    """The write operations besides the statement's own: ``INSERT ... ON CONFLICT DO
    UPDATE`` updates; a ``MERGE`` does what its actions do."""
    ops: set[str] = set()
    insert = tree.get("InsertStmt") if isinstance(tree, dict) else None
    if isinstance(insert, dict):
        conflict = insert.get("onConflictClause") or {}
        if conflict.get("action") == "ONCONFLICT_UPDATE":
            ops.add("update")
    merge = tree.get("MergeStmt") if isinstance(tree, dict) else None
    if isinstance(merge, dict):
        commands = {"CMD_INSERT": "insert", "CMD_UPDATE": "update", "CMD_DELETE": "delete"}
        for clause in merge.get("mergeWhenClauses") or ():
            when = clause.get("MergeWhenClause", {}) if isinstance(clause, dict) else {}
            if when.get("commandType") in commands:
                ops.add(commands[when["commandType"]])
    return ops


