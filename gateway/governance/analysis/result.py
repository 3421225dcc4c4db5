"""What an analysis says (``Analysis``, one ``OutputColumn`` per output column): immutable,
JSON-serialisable, stored with the query version and read back at every catalog load."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..schema import split_qname
from .denied import CATALOG_SCHEMAS

# 2: output columns record which sources reach them through an expression (``derived``) and
# whether their names are PostgreSQL's (``exact_name``); a parent's columns name its children's.
ANALYSIS_VERSION = 2

@dataclass(frozen=True, slots=True)
class OutputColumn:
    name: str
    sources: frozenset[str]          # schema.table.column
    whole_row: frozenset[str]        # schema.table referenced as a whole row
    # The sources that reach this column through an expression (substr, ||, a cast, an
    # aggregate, ...), not as the value itself: a hash or partial mask of such a column could
    # be undone piece by piece, so the planner refuses it. ``sources - derived`` arrive as is.
    derived: frozenset[str] = frozenset()
    # Whether ``name`` is certainly the name PostgreSQL gives the column (an alias, a column
    # reference, a ``*`` expansion): only those are checked against a result's names.
    exact_name: bool = True

    def to_doc(self) -> dict:
        return {"name": self.name, "sources": sorted(self.sources), "whole_row": sorted(self.whole_row),
                "derived": sorted(self.derived), "exact_name": self.exact_name}

    @classmethod
    def from_doc(cls, doc: Mapping) -> OutputColumn:
        sources = frozenset(doc["sources"])
        # Missing fields read the cautious way: every source derived, the name unchecked.
        derived = frozenset(doc["derived"]) if "derived" in doc else sources
        return cls(doc["name"], sources, frozenset(doc.get("whole_row") or ()), derived,
                   bool(doc.get("exact_name", False)))


@dataclass(frozen=True, slots=True)
class Analysis:
    """What a statement does, as far as governance is concerned. Immutable and
    JSON-serialisable (``to_doc`` / ``from_doc``), stored with the query version."""

    kind: str                             # "read" | "write"
    write_op: str | None                  # insert | update | delete | merge
    tables: tuple[str, ...]               # every relation touched, schema-qualified, sorted
    columns: tuple[OutputColumn, ...]     # output columns, in order
    whole_row: tuple[str, ...]            # relations referenced as a whole row anywhere
    functions: tuple[str, ...]            # function names called (schema-qualified as written)
    views: tuple[str, ...] = ()           # the relations among ``tables`` that are views
    user_functions: tuple[str, ...] = ()  # called functions that are user-defined
    referenced: tuple[str, ...] = ()      # every source column referenced anywhere
    write_sources: tuple[str, ...] = ()   # source columns whose values a write stores
    side_effects: tuple[str, ...] = ()    # called functions with side effects (nextval, ...)
    write_ops: tuple[str, ...] = ()       # every write operation it does (ON CONFLICT DO UPDATE: insert, update)
    # The relations among ``tables`` that are the server's (pg_catalog, information_schema, an
    # extension's): allowed when analysed, checked again against the settings of each gateway
    # that plans a call (``governance.policy.refused_now``).
    catalogs: tuple[str, ...] = ()

    def to_doc(self) -> dict:
        return {"version": ANALYSIS_VERSION, "kind": self.kind, "write_op": self.write_op,
                "tables": list(self.tables), "columns": [c.to_doc() for c in self.columns],
                "whole_row": list(self.whole_row), "functions": list(self.functions),
                "views": list(self.views), "user_functions": list(self.user_functions),
                "referenced": list(self.referenced), "write_sources": list(self.write_sources),
                "side_effects": list(self.side_effects), "write_ops": list(self.write_ops),
                "catalogs": list(self.catalogs)}

    @classmethod
    def from_doc(cls, doc: Mapping) -> Analysis:
        if doc.get("version") != ANALYSIS_VERSION:
            raise ValueError(f"analysis version {doc.get('version')!r} is not {ANALYSIS_VERSION}; analyse again")
        return cls(doc["kind"], doc.get("write_op"), tuple(doc["tables"]),
                   tuple(OutputColumn.from_doc(c) for c in doc["columns"]), tuple(doc.get("whole_row") or ()),
                   tuple(doc.get("functions") or ()), tuple(doc.get("views") or ()),
                   tuple(doc.get("user_functions") or ()), tuple(doc.get("referenced") or ()),
                   tuple(doc.get("write_sources") or ()), tuple(doc.get("side_effects") or ()),
                   tuple(doc.get("write_ops") or ((doc["write_op"],) if doc.get("write_op") else ())),
                   tuple(doc["catalogs"]) if "catalogs" in doc else
                   tuple(t for t in doc["tables"] if split_qname(t)[0] in CATALOG_SCHEMAS))

