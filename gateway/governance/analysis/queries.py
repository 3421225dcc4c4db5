"""The walker over queries: SELECT (its FROM list, projections, and the clauses that only
reference columns), set operations (column i from column i of every branch), VALUES,
parenthesised queries with their ORDER BY/LIMIT, and WITH (a recursive CTE's lineage
followed until it stops growing; a forward reference, or a writable CTE, refused)."""
from __future__ import annotations

from sqlglot import exp

from .names import exact_name, ident, output_name
from .nodes import QUERIES, WRITES
from .refusals import ROW_LOCKS, SELECT_INTO, failed, not_allowed
from .relations import RelationWalker
from .scope import Col, Ctes, Rel, Scope, Tree
from .walker import clause_parts

_SELECT_ARGS = {"with_", "expressions", "distinct", "from_", "joins", "where", "group", "having",
                "windows", "order", "limit", "offset", "kind"}
_MODIFIER_ARGS = ("order", "limit", "offset")


class QueryWalker(RelationWalker):
    def query(self, node: exp.Expr, parent: Scope | None, ctes: Ctes) -> list[Col]:
        self.mark(node)
        if isinstance(node, exp.Subquery):
            self.check_args(node, {"this", "alias", "with_", *_MODIFIER_ARGS})
            ctes = self.with_(node, parent, ctes)
            if not isinstance(node.this, QUERIES):
                raise failed(f"unsupported parenthesised {node.this.key.upper()}")
            cols = self.query(node.this, parent, ctes)
            self.modifiers(node, cols, parent, ctes)
            return cols
        if isinstance(node, exp.Select):
            return self.select(node, parent, ctes)
        if isinstance(node, exp.SetOperation):
            self.check_args(node, {"with_", "this", "expression", "distinct", *_MODIFIER_ARGS})
            ctes = self.with_(node, parent, ctes)
            left = self.query(node.this, parent, ctes)
            right = self.query(node.expression, parent, ctes)
            if len(left) != len(right):
                raise failed("the branches of a set operation have different numbers of columns")
            cols = [a.union(b) for a, b in zip(left, right, strict=True)]
            self.modifiers(node, cols, parent, ctes)
            return cols
        if isinstance(node, exp.Values):
            return self.values(node, parent, ctes)
        raise failed(f"unsupported query part {node.key.upper()}")

    def modifiers(self, node: exp.Expr, cols: list[Col], parent: Scope | None, ctes: Ctes) -> None:
        """ORDER BY / LIMIT / OFFSET of a set operation or a parenthesised query: they see
        its output columns by name."""
        if not any(node.args.get(k) for k in _MODIFIER_ARGS):
            return
        scope = Scope(parent, ctes)
        scope.trees.append(Tree([Rel(None, list(cols))], list(cols)))
        for key in _MODIFIER_ARGS:
            if node.args.get(key) is not None:
                self.referenced_in(node.args[key], scope)

    def with_(self, node: exp.Expr, parent: Scope | None, ctes: Ctes) -> Ctes:
        w = node.args.get("with_")
        if not w:
            return ctes
        self.mark(w)
        self.check_args(w, {"expressions", "recursive"})
        ctes = dict(ctes)
        recursive = bool(w.args.get("recursive"))
        entries = []
        for cte in w.expressions:
            self.mark(cte)
            self.check_args(cte, {"this", "alias", "materialized"})
            alias = cte.args.get("alias")
            if not isinstance(alias, exp.TableAlias) or alias.this is None:
                raise failed("a CTE without a name")
            self.mark(alias)
            name = ident(alias.this)
            if isinstance(cte.this, WRITES):
                raise not_allowed("data-modifying statements in WITH (writable CTEs) are not allowed")
            entries.append((name, self.alias_columns(alias), cte.this))
        if recursive:
            names = [name for name, _, _ in entries]
            for position, (_name, _, body) in enumerate(entries):
                later = set(names[position + 1:])
                for table in body.find_all(exp.Table):
                    if isinstance(table.this, exp.Identifier) and not table.args.get("db") \
                            and ident(table.this) in later:
                        raise failed("a forward reference between the CTEs of WITH RECURSIVE")
        for name, columns, body in entries:
            if recursive and isinstance(body, exp.SetOperation):
                cols = self.recursive_cte(name, columns, body, parent, ctes)
            else:
                cols = self.rename(self.query(body, parent, ctes), columns)
            ctes[name] = cols
        return ctes

    def recursive_cte(self, name: str, columns: list[str] | None, body: exp.SetOperation, parent: Scope | None,
                      ctes: Ctes) -> list[Col]:
        # The non-recursive term first, then the whole body with the CTE bound to what is
        # known so far, until the lineage stops growing (it only grows, and is finite).
        seed = dict(ctes)
        seed.pop(name, None)
        current = self.rename(self.query(body.this, parent, seed), columns)
        for _ in range(64):
            bound = dict(ctes)
            bound[name] = current
            cols = self.rename(self.query(body, parent, bound), columns)
            if len(cols) != len(current):
                raise failed("a recursive CTE whose branches have different numbers of columns")
            merged = [a.union(b) for a, b in zip(current, cols, strict=True)]
            if all(a.same(b) for a, b in zip(merged, current, strict=True)):
                return merged
            current = merged
        raise failed("the lineage of a recursive CTE does not settle")

    def values(self, node: exp.Values, parent: Scope | None, ctes: Ctes) -> list[Col]:
        self.check_args(node, {"expressions", "alias"})
        scope = Scope(parent, ctes)
        width = None
        acc: list = []
        for row in node.expressions:
            self.mark(row)
            items = row.expressions if isinstance(row, exp.Tuple) else [row]
            if width is None:
                width = len(items)
                acc = [None] * width
            elif len(items) != width:
                raise failed("VALUES lists must all be the same length")
            for i, item in enumerate(items):
                col = Col(f"column{i + 1}", *self.output(item, scope))
                acc[i] = col if acc[i] is None else acc[i].union(col)
        return acc

    def select(self, node: exp.Select, parent: Scope | None, ctes: Ctes) -> list[Col]:
        if node.args.get("into") is not None:
            raise not_allowed(SELECT_INTO)
        if node.args.get("locks"):
            raise not_allowed(ROW_LOCKS)
        self.check_args(node, _SELECT_ARGS)
        if node.args.get("kind"):
            raise failed(f"unsupported SELECT {node.args['kind']}")
        ctes = self.with_(node, parent, ctes)
        scope = Scope(parent, ctes)
        from_ = node.args.get("from_")
        joins = node.args.get("joins") or []
        if from_ is not None:
            self.mark(from_)
            self.check_args(from_, {"this"})
            self.from_list(scope, from_.this, joins)
        elif joins:
            raise failed("JOIN without FROM")
        cols: list[Col] = []
        for projection in node.expressions:
            cols.extend(self.projection(projection, scope))
        scope.outputs = {}
        for col in cols:
            scope.outputs.setdefault(col.name, col)
        distinct = node.args.get("distinct")
        if distinct is not None:
            self.mark(distinct)
            self.check_args(distinct, {"on"})
            if distinct.args.get("on") is not None:
                self.referenced_in(distinct.args["on"], scope, outputs=True)
        for key in ("where", "having", "windows", "limit", "offset"):
            for part in clause_parts(node.args.get(key)):
                self.referenced_in(part, scope)
        for key in ("group", "order"):
            if node.args.get(key) is not None:
                self.referenced_in(node.args[key], scope, outputs=True)
        return cols

    def projection(self, node: exp.Expr, scope: Scope) -> list[Col]:
        if isinstance(node, exp.Star):
            self.mark(node)
            self.check_args(node, set())
            if not scope.trees:
                raise failed("SELECT * without FROM")
            cols = []
            for tree in scope.trees:
                if tree.cols is None:
                    raise failed("SELECT * over a function whose columns cannot be named; name the columns")
                cols.extend(tree.cols)
            return list(cols)
        if isinstance(node, exp.Column) and isinstance(node.this, exp.Star):
            self.mark(node)
            self.mark(node.this)
            rel = self.find_relation(node, scope)
            if rel.cols is None:
                raise failed(f"{rel.key}.* over a function whose columns cannot be named")
            return list(rel.cols)
        src, whole, derived = self.output(node, scope)
        return [Col(output_name(node), src, whole, derived, exact_name(node))]

