"""The statement's nodes as sqlglot types them: what kind a statement is, the nodes refused
wherever they stand, and the nodes the walker must have resolved every one of."""
from __future__ import annotations

from collections.abc import Container

from sqlglot import exp

from .refusals import ROW_LOCKS, SELECT_INTO, failed, not_allowed

WRITE_OPS = {exp.Insert: "insert", exp.Update: "update", exp.Delete: "delete", exp.Merge: "merge"}
WRITES = tuple(WRITE_OPS)
QUERIES = (exp.Select, exp.SetOperation, exp.Values, exp.Subquery)

# Every node of these types must have been resolved by the walker (``every_part_analysed``).
_CHECKED = (exp.Column, exp.Table, exp.Select, exp.SetOperation, exp.Subquery, exp.Values, exp.Star, exp.Func,
            exp.Join, exp.From, exp.With, exp.CTE, exp.Lateral, exp.Unnest, exp.Returning, exp.OnConflict)


def statement_kind(root: exp.Expr) -> tuple[str, str | None]:
    if isinstance(root, WRITES):
        return "write", WRITE_OPS[type(root)]
    if isinstance(root, QUERIES):
        return "read", None
    word = root.key.upper()
    if isinstance(root, exp.Command):
        word = str(root.this).upper()
    raise not_allowed(f"statement kind {word} is not allowed")


def forbidden_nodes(root: exp.Expr) -> None:
    for node in root.walk():
        if node is root:
            continue
        if isinstance(node, exp.Command):
            raise failed(f"a part of the statement could not be parsed ({str(node.this).upper()})")
        if isinstance(node, exp.Into):
            raise not_allowed(SELECT_INTO)
        if isinstance(node, exp.Lock):
            raise not_allowed(ROW_LOCKS)
        if isinstance(node, WRITES) and not isinstance(node.parent, exp.When):
            raise not_allowed("data-modifying statements inside a statement (writable CTEs) are not allowed")
        if isinstance(node, (exp.Placeholder, exp.Hint)):
            raise failed(f"unsupported {node.key.upper()} in the statement")


def every_part_analysed(root: exp.Expr, seen: Container[int]) -> None:
    """A construct the walker does not follow is a refusal, not a silent skip."""
    for node in root.walk():
        if isinstance(node, _CHECKED) and id(node) not in seen:
            raise failed(f"a part of the statement was not analysed ({node.key.upper()})")
