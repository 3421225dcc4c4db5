"""The walker's state and bookkeeping: what a statement touched (relations, views, catalogs,
functions, referenced and written columns), which nodes it resolved, and the check that a
node carries no clause the walker does not follow.

The walker is one class in layers, each in its own module and each walking one kind of
node: ``expressions`` (column references, function calls, lineage), ``relations`` (FROM
items: tables, joins, subqueries, functions), ``queries`` (SELECT, set operations, VALUES,
WITH) and ``writes`` (INSERT, UPDATE, DELETE, MERGE: the last layer, ``StatementWalker``).
A lower layer reaches a query (a subquery in FROM or in an expression) through ``query``
and ``values``, declared here and walked by ``queries``."""
from __future__ import annotations

from collections.abc import Callable, Container, Sequence

from sqlglot import exp

from ..schema import Schema
from .refusals import failed
from .scope import Col, Ctes, Scope


def truthy(value: object) -> bool:
    return value is not None and value is not False and value != []


def clause_parts(value: object) -> list:
    """A clause's expressions: none, one, or the list sqlglot keeps for it."""
    return value if isinstance(value, list) else [value] if value is not None else []


class Walker:
    def __init__(self, schema: Schema, search_path: Sequence[str], denied: Callable[[str], bool],
                 catalog_allowed: frozenset[tuple[str, str]] = frozenset()) -> None:
        self.schema = schema
        path = tuple(search_path)
        self.path = path if "pg_catalog" in path else ("pg_catalog",) + path
        self.denied = denied
        self.catalog_allowed = catalog_allowed   # (schema, relation) of pg_catalog/information_schema
        self.write_ops: set[str] = set()         # write operations besides the statement's own
        self.catalogs: set = set()               # the server's relations read (allowed ones)
        self.tables: set = set()
        self.views: set = set()
        self.functions: set[str] = set()
        self.referenced: set = set()
        self.whole_any: set = set()
        self.write_sources: set = set()
        self.seen: set[int] = set()
        self.children: dict | None = None        # parent -> descendants, from schema.parents, when needed

    def mark(self, node: object) -> None:
        self.seen.add(id(node))

    @staticmethod
    def check_args(node: exp.Expr, allowed: Container[str]) -> None:
        for key, value in node.args.items():
            if key not in allowed and truthy(value):
                raise failed(f"unsupported {key.rstrip('_')} in {node.key.upper()}")

    # -- walked by queries.QueryWalker ---------------------------------------------------------
    def query(self, node: exp.Expr, parent: Scope | None, ctes: Ctes) -> list[Col]:
        raise NotImplementedError

    def values(self, node: exp.Values, parent: Scope | None, ctes: Ctes) -> list[Col]:
        raise NotImplementedError
