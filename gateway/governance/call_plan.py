"""The per-(key, query version) ``CallPlan``: what one key gets from one query version, as
precomputed index lists (which columns are nulled, hashed, masked or dropped), applied to
every call's rows with no regex, no fnmatch and no parsing; and the check that a result still
has the columns the query was analysed with."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter
from typing import overload

from ..errors import forbidden
from .masks import hasher, mask_value


class CallPlan:
    """What one key gets from one query version: cheap to apply on every call.

    ``names``: the analysed output names (None where the analysis cannot be sure of
    PostgreSQL's name). With them, a result whose columns are not those names is refused, so
    a table that changed shape since the query was saved never moves a mask onto another
    column. ``identity`` is a plan with nothing to mask and nothing to check."""

    __slots__ = ("actions", "width", "identity", "max_rows", "query_timeout", "_convert", "_keep", "_fired",
                 "_names", "_forms", "_good")

    def __init__(self, actions: Sequence[str | None], hash_key: bytes | None, max_rows: int | None = None,
                 query_timeout: float | None = None, fired: Iterable[dict] = (),
                 names: Sequence[str | None] | None = None) -> None:
        self.actions = tuple(actions)
        self.width = len(self.actions)
        self.max_rows = max_rows
        self.query_timeout = query_timeout
        self._fired = tuple(fired)
        masked = any(a not in (None, "keep") for a in self.actions)
        self.identity = not masked and names is None
        keep = [i for i, a in enumerate(self.actions) if a != "drop"]
        self._keep = tuple(keep)
        self._convert = self._build(hash_key) if masked else None
        self._names = None if names is None else tuple(names)
        if self._names is not None and len(self._names) != self.width:
            raise ValueError("one name per output column")
        # All names known: the result's names are these, or these as the runner makes them
        # unique (``id``, ``id_2``); compared as whole tuples.
        self._forms = None if self._names is None or None in self._names else \
            frozenset((self._names, _unique_names(self._names)))
        # The last columns tuple that passed: the same object is not checked again.
        self._good: Sequence[str] | None = None

    def _build(self, hash_key: bytes | None) -> Callable[[Sequence], tuple]:
        nulls = tuple(i for i, a in enumerate(self.actions) if a == "null")
        hashes = tuple(i for i, a in enumerate(self.actions) if a == "hash")
        masks = tuple(i for i, a in enumerate(self.actions) if a == "mask")
        dropped = len(self._keep) != self.width
        if hashes and not hash_key:
            raise ValueError("a hash mask applies but no hash key was given to the planner (GATEWAY_MASK_KEY)")
        digest = hasher(hash_key) if hashes and hash_key else None
        keep = self._keep
        pick: Callable[[list], tuple]
        if not dropped:
            pick = tuple
        elif len(keep) == 0:
            def pick_none(_row: list) -> tuple:
                return ()
            pick = pick_none
        elif len(keep) == 1:
            only = keep[0]

            def pick_one(row: list) -> tuple:
                return (row[only],)
            pick = pick_one
        else:
            getter = itemgetter(*keep)

            def pick_many(row: list) -> tuple:
                return getter(row)
            pick = pick_many
        mask = mask_value

        def convert(row: Sequence) -> tuple:
            values = list(row)
            for i in nulls:
                values[i] = None
            for i in hashes:
                values[i] = digest(values[i])  # type: ignore[misc]  # None only when no column is hashed
            for i in masks:
                values[i] = mask(values[i])
            return pick(values)
        return convert

    def columns(self, columns: Sequence[str]) -> list[str]:
        """The column names that come out for ``columns`` that go in."""
        self._check(columns)
        return list(columns) if self._convert is None else [columns[i] for i in self._keep]

    def _check(self, columns: Sequence[str]) -> None:
        # The runner names a query version's columns once and passes the same tuple on every
        # call: one identity test on the hot path; a new tuple is compared once, by value.
        if columns is self._good:
            return
        if len(columns) != self.width:
            raise forbidden("mask_unresolvable", "the result no longer has the shape the query was analysed "
                                                 "with (has the schema changed?); save the query again")
        names = self._names
        if names is not None and not self._names_match(columns, names):
            raise forbidden("mask_unresolvable", "the result's columns are not the ones the query was analysed "
                            f"with ({_shown(columns)}; analysed: {_shown(n or '?' for n in names)}): the "
                            "schema has changed; save the query again")
        if type(columns) is tuple:   # immutable: safe to remember by identity
            self._good = columns

    def _names_match(self, columns: Sequence[str], names: Sequence[str | None]) -> bool:
        if self._forms is not None:
            return tuple(columns) in self._forms
        # Some names unknown: the known ones must be where they were, as they are or as the
        # runner makes a repeated name unique (its number counts the unknown names too).
        for have, want in zip(columns, names, strict=True):   # as wide: checked first
            if want is not None and have != want and not _renamed_from(have, want):
                return False
        return True

    @overload
    def apply(self, columns: Sequence[str], rows: list) -> tuple[Sequence[str], list]: ...

    @overload
    def apply(self, columns: Sequence[str], rows: Iterable) -> tuple[Sequence[str], Iterable]: ...

    def apply(self, columns: Sequence[str], rows: Iterable) -> tuple[Sequence[str], Iterable]:
        """(columns, rows) with the masks applied: a list for a list, else a lazy iterator."""
        if self.identity:
            return columns, rows
        self._check(columns)
        convert = self._convert
        if convert is None:   # only checked: nothing to mask
            return columns, rows
        out = [columns[i] for i in self._keep]
        if isinstance(rows, list):
            return out, [convert(row) for row in rows]
        return out, map(convert, rows)

    def apply_row(self, row: Sequence) -> Sequence:
        return row if self._convert is None else self._convert(row)

    def describe(self) -> list[dict]:
        """Per masked output column: its position, the action and the source that decided it."""
        return [dict(f) for f in self._fired]


def _unique_names(names: Iterable[str | None]) -> tuple[str | None, ...]:
    """As ``gateway.execution.formats.unique_names`` names a result's columns: the second
    ``id`` is ``id_2``. (Called with known names only; typed as the plan holds them.)"""
    seen: dict[str | None, int] = {}
    out: list[str | None] = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return tuple(out)


def _shown(names: Iterable[object], limit: int = 300) -> str:
    text = ", ".join(map(str, names))
    return text if len(text) <= limit else text[:limit] + " ..."


def _renamed_from(have: str, want: str) -> bool:
    suffix = have[len(want) + 1:] if have.startswith(want + "_") else ""
    return suffix.isascii() and suffix.isdigit()
