"""Who imports whom, read with ``ast`` from the source (nothing is imported): the arrows
behind the import rules of ``docs/architecture.md`` (``tests/test_imports.py``) and the
load tests' own house (``tests/loadtests/test_loadtests.py``)."""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple


class Arrow(NamedTuple):
    source: str        # the importing module, dotted (``gateway.http.query``)
    target: str        # what it names: a module, a package, or a name inside one
    type_only: bool    # under ``if TYPE_CHECKING:``: for the type checker, never at run time
    line: int


def modules(package: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, whether it is a package's ``__init__``), for every .py file
    under ``package`` (named from its parent folder: ``gateway/http/query.py`` is
    ``gateway.http.query``)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside.update(id(n) for n in ast.walk(node))
    return inside


def arrows(package: Path) -> Iterator[Arrow]:
    """Every import statement of every module under ``package``, at module level or inside a
    function, relative ones resolved; ``from a import b`` names both ``a`` and ``a.b``."""
    for name, (path, is_package) in modules(package).items():
        here = name.split(".") if is_package else name.split(".")[:-1]
        tree = ast.parse(path.read_text(), str(path))
        typing_only = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
                found = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in found:
                yield Arrow(name, target, id(node) in typing_only, node.lineno)


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (any import statement)."""
    known = modules(package)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for arrow in arrows(package):
        if arrow.target in known and arrow.target != arrow.source:
            graph[arrow.source].add(arrow.target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found
