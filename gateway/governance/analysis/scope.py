"""Name scoping, the walker's model of what is in scope: a column and the sources its values
come from (``Col``), a FROM item (``Rel``), a FROM list entry of joined relations (``Tree``),
a write's target (``Target``), and one level of a query (``Scope``) with the CTEs it sees.
An unqualified name resolves at the innermost level that has it; two hits there are
ambiguous."""
from __future__ import annotations

from collections.abc import Iterator

from .refusals import failed

EMPTY: frozenset = frozenset()


class Col:
    """A column of a relation in scope: its name, the source columns (schema, table, column)
    its values derive from, the relations it holds whole rows of, the sources that reach it
    through an expression rather than as themselves (``derived`` is a subset of
    ``sources``), and whether ``name`` is certainly PostgreSQL's (``exact``)."""

    __slots__ = ("name", "sources", "whole", "derived", "exact")

    def __init__(self, name: str, sources: frozenset = EMPTY, whole: frozenset = EMPTY,
                 derived: frozenset = EMPTY, exact: bool = True) -> None:
        self.name = name
        self.sources = sources
        self.whole = whole
        self.derived = derived
        self.exact = exact

    def renamed(self, name: str) -> Col:
        return Col(name, self.sources, self.whole, self.derived)   # an alias is an exact name

    def same(self, other: Col) -> bool:
        return self.sources == other.sources and self.whole == other.whole and self.derived == other.derived

    def bare(self) -> bool:
        """Whether every value is a source column's value as it is (no literal, parameter or
        expression among them)."""
        return bool(self.sources) and not self.derived

    def union(self, other: Col) -> Col:
        """This column and ``other`` in one (set operation branches, VALUES rows, a USING join
        column), named as this one. Direct only when both are: a branch that is a literal, a
        parameter or an expression would have its values hashed with the column's (a hashing
        oracle for chosen values), so then every source is derived."""
        sources = self.sources | other.sources
        derived = EMPTY if self.bare() and other.bare() else sources
        return Col(self.name, sources, self.whole | other.whole, derived, self.exact)


def computed(name: str, sources: frozenset, whole: frozenset = EMPTY, exact: bool = True) -> Col:
    """A column whose values are computed from ``sources``: every one of them derived."""
    return Col(name, sources, whole, sources, exact)


Ctes = dict[str, list[Col]]   # the CTEs in scope, by name: their columns


class Rel:
    """A FROM item: ``key`` is the name it is referred to by (alias or relation name; None
    for an unaliased subquery); ``qualified`` the (schema, table) of a schema relation;
    ``cols`` None when its columns cannot be named (a function returning a record)."""

    __slots__ = ("key", "qualified", "aliased", "cols", "any_sources", "any_whole")

    def __init__(self, key: str | None, cols: list[Col] | None, qualified: tuple[str, str] | None = None,
                 aliased: bool = False, any_sources: frozenset = EMPTY, any_whole: frozenset = EMPTY) -> None:
        self.key = key
        self.cols = cols
        self.qualified = qualified
        self.aliased = aliased
        self.any_sources = any_sources
        self.any_whole = any_whole


class Tree:
    """One entry of a FROM list: a relation, or relations joined; ``cols`` in ``SELECT *``
    order, ``merged`` the USING/NATURAL join columns (found first by an unqualified name)."""

    __slots__ = ("rels", "cols", "merged")

    def __init__(self, rels: list[Rel], cols: list[Col] | None, merged: dict[str, Col] | None = None) -> None:
        self.rels = rels
        self.cols = cols
        self.merged = merged or {}


class Target(Tree):
    """A write's target: one table, so its columns are always known."""

    __slots__ = ()
    cols: list[Col]


class Scope:
    __slots__ = ("parent", "ctes", "trees", "outputs")

    def __init__(self, parent: Scope | None, ctes: Ctes, trees: list[Tree] | None = None) -> None:
        self.parent = parent
        self.ctes = ctes
        self.trees: list[Tree] = trees if trees is not None else []
        self.outputs: dict | None = None

    def rels(self) -> Iterator[Rel]:
        for tree in self.trees:
            yield from tree.rels

    def column(self, name: str) -> Col | None:
        """The column an unqualified ``name`` means at this level, or None."""
        hits, unknown = [], False
        for tree in self.trees:
            if name in tree.merged:
                hits.append(tree.merged[name])
                continue
            for rel in tree.rels:
                if rel.cols is None:
                    unknown = True
                else:
                    hits.extend(c for c in rel.cols if c.name == name)
        if len(hits) > 1:
            raise failed(f"column reference {name!r} is ambiguous")
        if unknown:
            raise failed(f"cannot tell which relation column {name!r} comes from (a function "
                          "in FROM without a column definition list)")
        return hits[0] if hits else None

    def relation(self, name: str, schema: str | None = None) -> Rel | None:
        for rel in self.rels():
            if schema is None:
                if rel.key == name:
                    return rel
            elif not rel.aliased and rel.qualified == (schema, name):
                return rel
        return None

