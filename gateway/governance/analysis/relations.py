"""The walker over FROM: tables resolved through the search path (CTE names first; the
server's catalogs only where allowed; a table's inheritance children and partitions are
sources of its columns), joins with their USING/NATURAL columns, subqueries, VALUES,
LATERAL items and set-returning functions (their columns named as PostgreSQL names them)."""
from __future__ import annotations

from sqlglot import exp

from ...errors import bad_request
from ..schema import qname
from .denied import CATALOG_SCHEMAS
from .expressions import ExpressionWalker
from .names import alias_name_of, ident
from .refusals import failed
from .scope import EMPTY, Col, Rel, Scope, Tree, computed
from .walker import truthy

# Set-returning functions whose output column names are known (single-column ones take the
# alias, or the function's name, as PostgreSQL does).
_SINGLE_SRF = frozenset({"generate_series", "generate_subscripts", "regexp_split_to_table", "string_to_table",
                         "json_object_keys", "jsonb_object_keys", "jsonb_path_query", "regexp_matches"})
# ...and those whose columns are named by their OUT parameters, whatever the alias.
_MULTI_SRF = {"json_each": ("key", "value"), "jsonb_each": ("key", "value"), "json_each_text": ("key", "value"),
              "jsonb_each_text": ("key", "value"), "json_array_elements": ("value",),
              "json_array_elements_text": ("value",), "jsonb_array_elements": ("value",),
              "jsonb_array_elements_text": ("value",)}


class RelationWalker(ExpressionWalker):
    def from_list(self, scope: Scope, first: exp.Expr, joins: list[exp.Join], nested: bool = False) -> None:
        items = [(first, None)] + [(join.this, join) for join in joins]
        for item, join in items:
            if join is not None:
                self.mark(join)
                self.check_args(join, {"this", "on", "side", "kind", "using", "method"})
            if nested and join is None:
                self.mark(item)
                tree = self.table_item(item, scope, nested=True)
            else:
                tree = self.from_item(item, scope)
            if join is None or not any(join.args.get(k) for k in ("on", "side", "kind", "using", "method")):
                scope.trees.append(tree)   # a comma: a tree of its own
            else:
                scope.trees[-1] = self.join(scope.trees[-1], tree, join)
                if join.args.get("on") is not None:
                    self.referenced_in(join.args["on"], scope)

    def join(self, left: Tree, right: Tree, join: exp.Join) -> Tree:
        using = join.args.get("using") or []
        method = str(join.args.get("method") or "").upper()
        if method and method != "NATURAL":
            raise failed(f"unsupported {method} join")
        rels = left.rels + right.rels
        merged = {**left.merged, **right.merged}
        if not using and method != "NATURAL":
            cols = None if left.cols is None or right.cols is None else left.cols + right.cols
            return Tree(rels, cols, merged)
        if left.cols is None or right.cols is None:
            raise failed("a USING/NATURAL join with a function whose columns cannot be named")
        if using:
            names = []
            for item in using:
                self.mark(item)
                names.append(ident(item.this if isinstance(item, exp.Column) else item))
        else:
            right_names = {c.name for c in right.cols}
            names = [c.name for c in left.cols if c.name in right_names]
        joined = []
        for name in names:
            a = [c for c in left.cols if c.name == name]
            b = [c for c in right.cols if c.name == name]
            if len(a) != 1 or len(b) != 1:
                raise failed(f"join column {name!r} is missing or ambiguous")
            col = a[0].union(b[0])
            joined.append(col)
            merged[name] = col
        named = set(names)
        cols = joined + [c for c in left.cols if c.name not in named] + [c for c in right.cols if c.name not in named]
        return Tree(rels, cols, merged)

    def from_item(self, item: exp.Expr, scope: Scope) -> Tree:
        self.mark(item)
        if isinstance(item, exp.Table):
            return self.table_item(item, scope)
        if isinstance(item, exp.Subquery):
            inner = item.this
            if isinstance(inner, exp.Table) and inner.args.get("joins"):
                if item.args.get("alias") is not None:
                    raise failed("an alias on a parenthesised join")
                self.check_args(item, {"this"})
                nested = Scope(scope.parent, scope.ctes)
                self.from_list(nested, inner, inner.args["joins"], nested=True)
                if len(nested.trees) != 1:
                    raise failed("unsupported parenthesised FROM list")
                return nested.trees[0]
            cols = self.query(item, scope.parent, scope.ctes)
            return self.derived(item.args.get("alias"), cols)
        if isinstance(item, exp.Lateral):
            self.check_args(item, {"this", "alias", "ordinality"})
            inner = item.this
            self.mark(inner)
            if isinstance(inner, exp.Subquery):
                alias = item.args.get("alias") or inner.args.get("alias")
                cols = self.query(inner, scope, scope.ctes)
                return self.derived(alias, cols)
            if isinstance(inner, exp.Unnest):
                return self.unnest(inner, item.args.get("alias") or inner.args.get("alias"), scope)
            if isinstance(inner, exp.Func):
                return self.function_rel(inner, item.args.get("alias"), scope, bool(item.args.get("ordinality")))
            raise failed(f"unsupported LATERAL {inner.key.upper()}")
        if isinstance(item, exp.Unnest):
            return self.unnest(item, item.args.get("alias"), scope)
        if isinstance(item, exp.Values):
            alias = item.args.get("alias")
            cols = self.values(item, scope.parent, scope.ctes)
            return self.derived(alias, cols)
        raise failed(f"unsupported FROM item {item.key.upper()}")

    def derived(self, alias: exp.TableAlias | None, cols: list[Col]) -> Tree:
        name = None
        if alias is not None:
            self.mark(alias)
            name = ident(alias.this) if alias.this is not None else None
            cols = self.rename(cols, self.alias_columns(alias))
        rel = Rel(name, list(cols), aliased=True)
        return Tree([rel], list(cols))

    def alias_columns(self, alias: exp.TableAlias | None) -> list[str] | None:
        if alias is None or not alias.args.get("columns"):
            return None
        names = []
        for column in alias.args["columns"]:
            self.mark(column)
            if isinstance(column, exp.ColumnDef):
                names.append(ident(column.this))
                for part in column.walk():
                    self.mark(part)
            else:
                names.append(ident(column))
        return names

    @staticmethod
    def rename(cols: list[Col], names: list[str] | None) -> list[Col]:
        if not names:
            return list(cols)
        if len(names) > len(cols):
            raise failed("more column aliases than columns")
        return [c.renamed(names[i]) if i < len(names) else c for i, c in enumerate(cols)]

    def table_item(self, item: exp.Expr, scope: Scope, nested: bool = False) -> Tree:
        if item.args.get("joins") and not nested:
            raise failed("unsupported nested join")
        allowed = {"this", "db", "alias", "only", "sample", "ordinality", "rows_from"}
        self.check_args(item, allowed | {"joins"} if nested else allowed)
        alias = item.args.get("alias")
        if alias is not None:
            self.mark(alias)
        if item.args.get("sample") is not None:
            self.referenced_in(item.args["sample"], scope)
        if item.args.get("rows_from"):
            return self.rows_from(item, alias, scope)
        this = item.this
        if isinstance(this, exp.Func):
            if item.args.get("db") is not None:
                self.mark(item.args["db"])
                self.functions.add(f"{ident(item.args['db'])}.{self.function_name(this)}")
            return self.function_rel(this, alias, scope, bool(item.args.get("ordinality")))
        if not isinstance(this, exp.Identifier):
            raise failed(f"unsupported FROM item {this.key.upper()}")
        if item.args.get("ordinality"):
            raise failed("WITH ORDINALITY on a table")
        name = ident(this)
        db = item.args.get("db")
        alias_name = alias_name_of(alias)
        if db is None and name in scope.ctes:
            cols = self.rename(scope.ctes[name], self.alias_columns(alias))
            rel = Rel(alias_name or name, cols, aliased=True)
            return Tree([rel], list(cols))
        key = self.resolve_relation(ident(db) if db is not None else None, name)
        cols = self.rename(self.relation_columns(key), self.alias_columns(alias))
        rel = Rel(alias_name or name, cols, qualified=key, aliased=alias_name is not None)
        return Tree([rel], list(cols))

    def resolve_relation(self, schema_name: str | None, name: str) -> tuple[str, str]:
        relations = self.schema.relations
        if schema_name is not None:
            key = (schema_name, name)
            if key not in relations:
                raise bad_request("unknown_table", f"relation {qname(*key)} is not in the connection's schema")
        else:
            for path_schema in self.path:
                if (path_schema, name) in relations:
                    key = (path_schema, name)
                    break
            else:
                raise bad_request("unknown_table", f"relation {name} does not resolve through the search "
                                                   f"path ({', '.join(self.path)})")
        if (key[0] in CATALOG_SCHEMAS or key in self.schema.extension_relations) and key not in self.catalog_allowed:
            what = "a system catalog" if key[0] in CATALOG_SCHEMAS else "an extension's relation"
            raise bad_request("catalog_not_allowed", f"relation {qname(*key)} is {what}; the server does not "
                              "allow reading it (GATEWAY_ALLOW_CATALOG_RELATIONS)")
        if key[0] in CATALOG_SCHEMAS or key in self.schema.extension_relations:
            self.catalogs.add(key)
        self.tables.add(key)
        if key in self.schema.views:
            self.views.add(key)
        return key

    def relation_columns(self, key: tuple[str, str]) -> list[Col]:
        # A child's rows are its ancestors' rows too (a mask on the parent covers the child),
        # and reading a parent reads every descendant's rows (a mask on a child covers them
        # there): both are sources of the column of that name. Inherited columns keep their
        # names (PostgreSQL renames them together). ONLY is not told apart: masking more.
        relations = self.schema.relations
        kin = [p for p in self.schema.parents.get(key, ()) if p in relations] + self.descendants(key)
        cols = []
        for column in relations[key]:
            sources = {(key[0], key[1], column)}
            for other in kin:
                if column in relations[other]:
                    sources.add((other[0], other[1], column))
            cols.append(Col(column, frozenset(sources)))
        return cols

    def descendants(self, key: tuple[str, str]) -> list[tuple[str, str]]:
        """Every table that inherits from ``key`` or is a partition of it, at any depth
        (``schema.parents`` lists all ancestors of each child)."""
        if self.children is None:
            self.children = {}
            for child, ancestors in self.schema.parents.items():
                if child in self.schema.relations:
                    for ancestor in ancestors:
                        self.children.setdefault(ancestor, []).append(child)
        return sorted(self.children.get(key, ()))

    def function_rel(self, fn: exp.Func, alias: exp.TableAlias | None, scope: Scope, ordinality: bool) -> Tree:
        name = self.function_name(fn)
        src, whole = self.lineage(fn, scope)
        alias_name = alias_name_of(alias)
        names = self.alias_columns(alias)
        # Named by an alias or a known set-returning function; otherwise after the function
        # as sqlglot reads it, which may not be PostgreSQL's name.
        exact = names is not None or alias_name is not None or name in _SINGLE_SRF or name in _MULTI_SRF \
            or name == "unnest" or isinstance(fn, exp.Anonymous)
        if names is None:
            if name in _SINGLE_SRF or (not isinstance(fn, exp.Anonymous) and name not in _MULTI_SRF
                                       and name != "unnest"):
                names = [alias_name or name]
            elif name in _MULTI_SRF:
                names = list(_MULTI_SRF[name])
            if names is not None and ordinality:
                names.append("ordinality")
        cols = None if names is None else [computed(n, src, whole, exact) for n in names]
        rel = Rel(alias_name or name, cols, aliased=True, any_sources=src, any_whole=whole)
        return Tree([rel], None if cols is None else list(cols))

    def unnest(self, node: exp.Unnest, alias: exp.TableAlias | None, scope: Scope) -> Tree:
        self.mark(node)
        self.check_args(node, {"expressions", "alias", "offset"})
        self.functions.add("unnest")
        per_arg = [self.lineage(arg, scope) for arg in node.expressions]
        alias_name = alias_name_of(alias)
        if alias is not None:
            self.mark(alias)
        names = self.alias_columns(alias)
        if names is None:
            names = [alias_name or "unnest"] if len(per_arg) == 1 and alias_name else ["unnest"] * len(per_arg)
        if len(names) != len(per_arg):
            raise failed("unnest column aliases do not match its arguments")
        cols = [computed(n, s, w) for n, (s, w) in zip(names, per_arg, strict=True)]
        offset = node.args.get("offset")
        if truthy(offset):
            self.mark(offset)
            cols.append(Col(ident(offset) if isinstance(offset, exp.Identifier) else "ordinality"))
        all_src = frozenset().union(*(s for s, _ in per_arg)) if per_arg else EMPTY
        all_whole = frozenset().union(*(w for _, w in per_arg)) if per_arg else EMPTY
        rel = Rel(alias_name or "unnest", cols, aliased=True, any_sources=all_src, any_whole=all_whole)
        return Tree([rel], list(cols))

    def rows_from(self, item: exp.Expr, alias: exp.TableAlias | None, scope: Scope) -> Tree:
        src: set = set()
        whole: set = set()
        for part in item.args["rows_from"]:
            self.mark(part)
            fn = part.this if isinstance(part, exp.Table) else part
            if not isinstance(fn, exp.Func):
                raise failed("unsupported ROWS FROM item")
            self.mark(fn)
            s, w = self.lineage(fn, scope)
            src |= s
            whole |= w
        names = self.alias_columns(alias)
        alias_name = alias_name_of(alias)
        sources, wholes = frozenset(src), frozenset(whole)
        cols = None if names is None else [computed(n, sources, wholes) for n in names]
        rel = Rel(alias_name, cols, aliased=True, any_sources=sources, any_whole=wholes)
        return Tree([rel], cols)

