"""PostgreSQL's parse trees (their JSON form) walked and compared without recursion (a deep
tree must not exhaust the stack): every node, the calls and relations a tree names, where its
parameters are, and its shape: the tree without source positions, so that two statements that
differ only in layout compare equal."""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any


def nodes(tree: Any) -> Iterator[dict]:
    """Every node (dict) of a parse tree, without recursion: a deep tree must not exhaust
    the stack."""
    stack = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def contains(tree: Any, keys: frozenset) -> bool:
    return any(not keys.isdisjoint(node) for node in nodes(tree))


def param_locations(tree: Any) -> list[int]:
    return [node["ParamRef"].get("location", -1) for node in nodes(tree) if "ParamRef" in node]


def _names(parts: Iterable[dict]) -> list[str]:
    return [p["String"]["sval"] for p in parts if "String" in p]


def calls(tree: Any) -> frozenset[str]:
    calls = set()
    for node in nodes(tree):
        call = node.get("FuncCall")
        if call is not None:
            names = _names(call.get("funcname", ()))
            if names:
                calls.add(names[-1].lower())
                calls.add(".".join(names).lower())
    return frozenset(calls)


def relations(tree: Any) -> frozenset[str]:
    found = set()
    for node in nodes(tree):
        rel = node.get("RangeVar")
        if rel is not None:
            name = rel.get("relname", "")
            found.add(f"{rel['schemaname']}.{name}" if rel.get("schemaname") else name)
    return frozenset(found)


# --- shapes: the tree without source positions ---------------------------------------------
def _position_keys() -> frozenset[str]:
    """The fields of PostgreSQL's parse nodes that hold a position in the text (``ParseLoc``):
    ``location`` and, since PostgreSQL 18, where an IN list or an ARRAY[...] starts and ends
    (``rexpr_list_start``, ``list_end``, ...). They move with every literal bound before them
    and with the paging wrapper, and say nothing about what the statement does. Read from
    pglast's node definitions, so a parser that adds one cannot make every such statement
    "change shape"."""
    import inspect

    from pglast import ast

    keys = {"location", "stmt_location", "stmt_len"}
    for node in vars(ast).values():
        fields = getattr(node, "__slots__", None) if inspect.isclass(node) else None
        if isinstance(fields, dict):
            keys.update(k for k, kind in fields.items() if getattr(kind, "c_type", kind) == "ParseLoc")
    return frozenset(keys)


_POSITION_KEYS = _position_keys()


def _position(key: str, value: Any) -> bool:
    # Positions are integers (CreateTableSpaceStmt's "location" is a path, not a position).
    return key in _POSITION_KEYS and type(value) is int


def shape(tree: Any) -> Any:
    """The tree with every source position removed: two statements with the same shape
    differ only in layout (spaces, comments). Built without recursion: a tree may be as
    deep as the JSON reader allows (1,024 levels), deeper than Python's stack."""
    root: list = [None]
    stack: list[tuple[Any, Any, Any]] = [(tree, root, 0)]
    while stack:
        item, into, at = stack.pop()
        if isinstance(item, dict):
            made: Any = {}
            for k, v in item.items():
                if not _position(k, v):
                    made[k] = None
                    stack.append((v, made, k))
        elif isinstance(item, list):
            made = [None] * len(item)
            stack.extend((v, made, i) for i, v in enumerate(item))
        else:
            made = item
        into[at] = made
    return root[0]


def alike(template: Any, tree: Any, params: Sequence[Any] | None = None) -> bool:
    """Whether ``tree`` is ``template``, source positions aside; with ``params``, each
    parameter ``$n`` of the template must be ``params[n-1]`` (a parse node) in the tree.
    Compared without recursion (``==`` on nested dicts recurses in C and can raise
    RecursionError on a deep tree)."""
    stack: list[tuple[Any, Any]] = [(template, tree)]
    while stack:
        a, b = stack.pop()
        if isinstance(a, dict):
            if not isinstance(b, dict):
                return False
            param = a.get("ParamRef") if params is not None and len(a) == 1 else None
            if isinstance(param, dict):
                number = param.get("number")
                if type(number) is not int or not 1 <= number <= len(params):   # type: ignore[arg-type]
                    return False
                stack.append((params[number - 1], b))   # type: ignore[index]
                continue
            keys = [k for k, v in a.items() if not _position(k, v)]
            if len(keys) != sum(1 for k, v in b.items() if not _position(k, v)):
                return False
            for k in keys:
                if k not in b:
                    return False
                stack.append((a[k], b[k]))
        elif isinstance(a, list):
            if not isinstance(b, list) or len(a) != len(b):
                return False
            stack.extend(zip(a, b, strict=True))
        elif type(a) is not type(b) or a != b:
            return False
    return True
