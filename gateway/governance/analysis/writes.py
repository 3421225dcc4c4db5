"""The walker over writes, its last layer: INSERT (with ON CONFLICT), UPDATE, DELETE and
MERGE against one target table, every value a write stores recorded (``write_sources``),
and RETURNING, whose columns show what was stored. ``StatementWalker.statement`` walks a
whole statement, read or write."""
from __future__ import annotations

from collections.abc import Iterable

from sqlglot import exp

from ...errors import bad_request
from .names import alias_name_of, ident
from .queries import QueryWalker
from .refusals import failed
from .scope import EMPTY, Col, Ctes, Rel, Scope, Target, Tree
from .walker import clause_parts

_ALL = frozenset({"*"})


def _stored_by(root: exp.Expr) -> frozenset:
    """The target columns a write sets (``_ALL`` for an INSERT or a MERGE, which may set any)."""
    if isinstance(root, exp.Delete):
        return EMPTY
    if not isinstance(root, exp.Update):
        return _ALL
    names = set()
    for item in root.expressions:
        left = item.this
        for column in (left.expressions if isinstance(left, exp.Tuple) else [left]):
            names.add(ident(column.this if isinstance(column, exp.Column) else column))
    return frozenset(names)




class StatementWalker(QueryWalker):
    def statement(self, root: exp.Expr, kind: str) -> list[Col]:
        """The output columns of the whole statement (a write's are its RETURNING's)."""
        return self.write(root) if kind == "write" else self.query(root, None, {})

    def write(self, root: exp.Expr) -> list[Col]:
        ctes = self.with_(root, None, {})
        if isinstance(root, exp.Insert):
            return self.insert(root, ctes)
        if isinstance(root, exp.Update):
            return self.update(root, ctes)
        if isinstance(root, exp.Delete):
            return self.delete(root, ctes)
        return self.merge(root, ctes)

    def target(self, table: exp.Expr) -> Target:
        if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier):
            raise failed("the target of a write must be a table")
        self.mark(table)
        self.check_args(table, {"this", "db", "alias", "only"})
        alias = table.args.get("alias")
        if alias is not None:
            self.mark(alias)
            if alias.args.get("columns"):
                raise failed("column aliases on a write target")
        db = table.args.get("db")
        if db is not None:
            self.mark(db)
        key = self.resolve_relation(ident(db) if db is not None else None, ident(table.this))
        cols = self.relation_columns(key)
        alias_name = alias_name_of(alias)
        return Target([Rel(alias_name or key[1], cols, qualified=key, aliased=alias_name is not None)], cols)

    def target_columns(self, target: Target, nodes: Iterable[exp.Expr]) -> None:
        names = {c.name for c in target.cols}
        for node in nodes:
            for part in node.walk():
                self.mark(part)
            column = node
            if isinstance(column, exp.Column):
                if column.args.get("table") is not None or column.args.get("db") is not None:
                    raise failed("a qualified column name as a write target")
                column = column.this
            if not isinstance(column, exp.Identifier):
                raise failed("unsupported assignment target")
            if ident(column) not in names:
                raise bad_request("unknown_column", f"column {ident(column)!r} is not a column of the target")

    def assignments(self, target: Target, items: Iterable[exp.Expr], scope: Scope) -> None:
        for item in items:
            self.mark(item)
            if not isinstance(item, exp.EQ):
                raise failed("unsupported assignment")
            left = item.this
            self.target_columns(target, left.expressions if isinstance(left, exp.Tuple) else [left])
            if isinstance(left, exp.Tuple):
                self.mark(left)
            src, _ = self.lineage(item.expression, scope)
            self.write_sources.update(src)

    def returning(self, root: exp.Expr, target: Target, scope: Scope) -> list[Col]:
        returning = root.args.get("returning")
        if returning is None:
            return []
        self.mark(returning)
        self.check_args(returning, {"expressions"})
        written = frozenset(self.write_sources)
        chosen = _stored_by(root)
        if written or chosen:
            # RETURNING shows what was stored: a value computed from the written sources, or
            # one the caller chose (a parameter): hashed, that would be a hashing oracle, so a
            # column the statement sets counts as computed.
            augmented = [Col(c.name, c.sources | written, c.whole,
                              c.sources | written if chosen is _ALL or c.name in chosen else c.derived | written)
                         for c in target.cols]
            rel = target.rels[0]
            rel.cols = augmented
            target.cols = augmented
        cols = []
        for projection in returning.expressions:
            cols.extend(self.projection(projection, scope))
        return cols

    def insert(self, root: exp.Insert, ctes: Ctes) -> list[Col]:
        self.check_args(root, {"with_", "this", "expression", "conflict", "returning", "default"})
        self.mark(root)
        target_node = root.this
        columns = None
        if isinstance(target_node, exp.Schema):
            self.mark(target_node)
            columns = target_node.expressions
            target_node = target_node.this
        target = self.target(target_node)
        if columns:
            self.target_columns(target, columns)
        if root.expression is not None:
            for col in self.query(root.expression, None, ctes):
                self.write_sources.update(col.sources)
        conflict = root.args.get("conflict")
        if conflict is not None:
            self.on_conflict(conflict, target, ctes)
        return self.returning(root, target, Scope(None, ctes, [target]))

    def on_conflict(self, conflict: exp.OnConflict, target: Target, ctes: Ctes) -> None:
        """ON CONFLICT: its conflict target sees the target table; its WHERE and DO UPDATE
        also the row proposed for insertion (``excluded``, holding the values written)."""
        self.mark(conflict)
        self.check_args(conflict, {"expressions", "action", "conflict_keys", "index_predicate",
                                   "constraint", "where"})
        written = frozenset(self.write_sources)
        excluded = [Col(c.name, c.sources | written) for c in target.cols]
        scope = Scope(None, ctes, [target, Tree([Rel("excluded", excluded, aliased=True)], excluded)])
        target_only = Scope(None, ctes, [target])
        for part in ("action", "constraint"):
            if conflict.args.get(part) is not None:
                for node in conflict.args[part].walk():
                    self.mark(node)
        action = conflict.args.get("action")
        if not (isinstance(action, exp.Var) and " ".join(str(action.this).upper().split()) == "DO NOTHING"):
            self.write_ops.add("update")     # ON CONFLICT DO UPDATE updates
        for key in ("conflict_keys", "index_predicate", "where"):
            for part in clause_parts(conflict.args.get(key)):
                self.referenced_in(part, scope if key == "where" else target_only)
        self.assignments(target, conflict.args.get("expressions") or [], scope)

    def opened(self, root: exp.Expr, allowed: set[str], ctes: Ctes) -> tuple[Target, Scope]:
        """UPDATE's, DELETE's and MERGE's start: the clauses checked, the target table
        resolved, and a scope that sees it."""
        self.check_args(root, allowed)
        self.mark(root)
        target = self.target(root.this)
        return target, Scope(None, ctes, [target])

    def update(self, root: exp.Update, ctes: Ctes) -> list[Col]:
        target, scope = self.opened(root, {"with_", "this", "expressions", "from_", "where", "returning"}, ctes)
        from_ = root.args.get("from_")
        if from_ is not None:
            self.mark(from_)
            self.from_list(scope, from_.this, [])
        self.assignments(target, root.expressions, scope)
        if root.args.get("where") is not None:
            self.referenced_in(root.args["where"], scope)
        return self.returning(root, target, scope)

    def delete(self, root: exp.Delete, ctes: Ctes) -> list[Col]:
        target, scope = self.opened(root, {"with_", "this", "using", "where", "returning"}, ctes)
        for item in root.args.get("using") or []:
            scope.trees.append(self.from_item(item, scope))
        if root.args.get("where") is not None:
            self.referenced_in(root.args["where"], scope)
        return self.returning(root, target, scope)

    def merge(self, root: exp.Expr, ctes: Ctes) -> list[Col]:
        target, scope = self.opened(root, {"with_", "this", "using", "on", "whens", "returning"}, ctes)
        scope.trees.append(self.from_item(root.args["using"], scope))
        self.referenced_in(root.args["on"], scope)
        whens = root.args.get("whens")
        if whens is not None:
            self.mark(whens)
            for when in whens.expressions:
                self.mark(when)
                self.check_args(when, {"matched", "source", "condition", "then"})
                if when.args.get("condition") is not None:
                    self.referenced_in(when.args["condition"], scope)
                self.merge_action(when.args.get("then"), target, scope)
        return self.returning(root, target, scope)

    def merge_action(self, then: exp.Expr, target: Target, scope: Scope) -> None:
        """What one WHEN of a MERGE does: INSERT (the values it stores), UPDATE (its
        assignments), DELETE, or DO NOTHING."""
        self.mark(then)
        if isinstance(then, exp.Insert):
            self.write_ops.add("insert")
            self.check_args(then, {"this", "expression"})
            if isinstance(then.this, exp.Tuple):
                self.mark(then.this)
                self.target_columns(target, then.this.expressions)
            values = then.expression
            if values is not None:
                self.mark(values)
                for value in (values.expressions if isinstance(values, exp.Tuple) else [values]):
                    src, _ = self.lineage(value, scope)
                    self.write_sources.update(src)
        elif isinstance(then, exp.Update):
            self.write_ops.add("update")
            self.check_args(then, {"expressions"})
            self.assignments(target, then.expressions, scope)
        elif isinstance(then, (exp.Var, exp.Delete)):
            if isinstance(then, exp.Delete) or str(then.this).strip().upper() == "DELETE":
                self.write_ops.add("delete")
            for node in then.walk():
                self.mark(node)
        else:
            raise failed("unsupported MERGE action")


