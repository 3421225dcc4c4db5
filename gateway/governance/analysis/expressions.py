"""The walker over expressions: column references resolved through the scopes (a whole row,
``t.*``, a keyword read as a value), function calls named and checked against the deny
list, subqueries walked as queries; and what an expression's value derives from (its
lineage: every source column referenced anywhere inside it)."""
from __future__ import annotations

from sqlglot import exp

from ...errors import bad_request
from .names import KEYWORD_VALUES, bare_column, ident, typed_name
from .nodes import QUERIES, WRITES
from .refusals import failed
from .scope import Col, Rel, Scope, computed
from .walker import Walker


class ExpressionWalker(Walker):
    def lineage(self, node: exp.Expr, scope: Scope, outputs: bool = False) -> tuple[frozenset, frozenset]:
        src: set = set()
        whole: set = set()
        self.walk(node, scope, src, whole, outputs)
        return frozenset(src), frozenset(whole)

    def output(self, node: exp.Expr, scope: Scope) -> tuple[frozenset, frozenset, frozenset]:
        """(sources, whole rows, derived) of one output expression. Only a bare column
        reference (aliased or parenthesised) passes a column's values through as they are,
        keeping what it derives; any other expression computes new values from every source
        it reads, so all of them are derived."""
        src, whole = self.lineage(node, scope)
        column = bare_column(node)
        if column is None:
            return src, whole, src
        # Resolved a second time (already marked and recorded): to learn what it passes on.
        return src, whole, self.resolve(column, scope).derived

    def referenced_in(self, node: exp.Expr, scope: Scope, outputs: bool = False) -> None:
        self.walk(node, scope, set(), set(), outputs)

    def walk(self, node: exp.Expr, scope: Scope, src: set, whole: set, outputs: bool) -> None:
        self.mark(node)
        if isinstance(node, exp.Column):
            s, w = self.column(node, scope, outputs)
            src.update(s)
            whole.update(w)
            return
        if isinstance(node, QUERIES):
            for col in self.query(node, scope, scope.ctes):
                src.update(col.sources)
                whole.update(col.whole)
            return
        if isinstance(node, exp.Star):
            if isinstance(node.parent, exp.Count):
                return
            raise failed("* inside an expression")
        if isinstance(node, (exp.Table, exp.From, exp.Join) + WRITES):
            raise failed(f"unexpected {node.key.upper()} inside an expression")
        if isinstance(node, exp.Dot) and isinstance(node.this, exp.Identifier) \
                and isinstance(node.expression, exp.Func):
            self.mark(node.this)
            qualifier = ident(node.this)
            self.functions.add(f"{qualifier}.{self.function_name(node.expression)}")
        elif isinstance(node, exp.Func):
            self.function_name(node)
        for child in node.iter_expressions():
            self.walk(child, scope, src, whole, outputs)

    def function_name(self, node: exp.Func) -> str:
        if isinstance(node, exp.Anonymous):
            name = ident(node.this) if isinstance(node.this, (exp.Identifier, str)) else str(node.this)
        else:
            name = typed_name(node)
        if self.denied(name):
            raise bad_request("function_not_allowed", f"function {name}() is not allowed")
        self.functions.add(name)
        return name

    def column(self, node: exp.Column, scope: Scope, outputs: bool = False) -> tuple[frozenset, frozenset]:
        col = self.resolve(node, scope, outputs)
        return col.sources, col.whole

    def resolve(self, node: exp.Column, scope: Scope, outputs: bool = False) -> Col:
        """The column a column reference means. A whole row, or a column of a function whose
        columns cannot be told apart, is a value computed from its sources: all derived."""
        self.mark(node)
        if node.args.get("catalog") is not None:
            raise failed("a column reference qualified with a database name")
        for part in ("table", "db"):
            if node.args.get(part) is not None:
                self.mark(node.args[part])
        if isinstance(node.this, exp.Star):
            self.mark(node.this)
            return computed("*", *self.whole_of(self.find_relation(node, scope)))
        self.mark(node.this)
        name = ident(node.this)
        if node.args.get("table") is None:
            if outputs and scope.outputs and name in scope.outputs:
                return scope.outputs[name]
            level: Scope | None = scope
            while level is not None:
                col = level.column(name)
                if col is not None:
                    self.referenced.update(col.sources)
                    return col
                level = level.parent
            level = scope
            while level is not None:
                rel = level.relation(name)
                if rel is not None:
                    return computed(name, *self.whole_of(rel))
                level = level.parent
            if name in KEYWORD_VALUES and not node.this.quoted:
                return Col(name)
            raise bad_request("unknown_column", f"column {name!r} does not resolve to a relation in scope")
        rel = self.find_relation(node, scope)
        if rel.cols is None:
            self.referenced.update(rel.any_sources)
            return computed(name, rel.any_sources, rel.any_whole)
        hits = [c for c in rel.cols if c.name == name]
        if len(hits) != 1:
            if not hits:
                raise bad_request("unknown_column", f"column {rel.key}.{name} does not exist")
            raise failed(f"column reference {rel.key}.{name} is ambiguous")
        self.referenced.update(hits[0].sources)
        return hits[0]

    def find_relation(self, node: exp.Column, scope: Scope) -> Rel:
        table = node.args.get("table")
        db = node.args.get("db")
        if table is None:
            raise failed("a qualified reference without a relation")
        name = ident(table)
        schema_name = ident(db) if db is not None else None
        level: Scope | None = scope
        while level is not None:
            rel = level.relation(name, schema_name)
            if rel is not None:
                return rel
            level = level.parent
        shown = f"{schema_name}.{name}" if schema_name else name
        raise bad_request("unknown_column", f"relation {shown} is not in scope (missing FROM entry)")

    def whole_of(self, rel: Rel) -> tuple[frozenset, frozenset]:
        if rel.cols is None:
            src, whole = set(rel.any_sources), set(rel.any_whole)
        else:
            src, whole = set(), set()
            for col in rel.cols:
                src.update(col.sources)
                whole.update(col.whole)
        whole.update((s[0], s[1]) for s in src)
        if rel.qualified is not None:
            whole.add(rel.qualified)
        self.referenced.update(src)
        self.whole_any.update(whole)
        return frozenset(src), frozenset(whole)

