"""The relations a connection's SQL can name: tables, views, their columns, and what the
analysis needs besides (inheritance parents, user-defined function names).

Names are exact, as PostgreSQL stores them (an unquoted identifier in SQL is folded to
lower case before it is looked up; a quoted one is not). A relation is written
``schema.table``, a source column ``schema.table.column``; a part holding a ``.`` or a
``"`` is double-quoted (``public."odd.name".id``) so the text splits back unambiguously.

A view (or materialized view) is a relation of its own: its columns are the view's, and
lineage stops there. Masking a view's underlying table is *not* resolved through the
view, so :func:`gateway.governance.planning.plan` refuses a key with masks that reads a
view no rule names (and ``allowed_tables`` must list the view itself).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psycopg2.extensions

__all__ = ["Schema", "load_schema", "qname", "split_qname", "kinship", "Kin", "Trees"]

# A table of an inheritance or partition tree -> the other tables whose rows it shares.
Trees = dict[tuple[str, str], tuple[tuple[str, str], ...]]


class Kin:
    """What a call's plan needs of its connection's schema as it is now, not as it was when
    the query was saved: the inheritance and partition trees (``kinship``), the views (a
    table dropped and made again as a view reads other tables) and the schema itself, which
    saved queries are analysed against again (``analyses``, by plan id: a column added to an
    inner table can take an unqualified name from an outer one). Compared by value: the
    schema's relations, columns, views, trees, functions and operators."""

    __slots__ = ("trees", "views", "schema", "analyses", "readings", "read_at", "cascades", "triggered", "_key")

    def __init__(self, trees: Trees, views: frozenset[tuple[str, str]] = frozenset(),
                 schema: Schema | None = None) -> None:
        self.trees = trees
        self.views = views
        self.schema = schema
        self.analyses: dict[str, object] = {}   # filled by gateway.pipeline.plans
        self.readings: dict[str, str] = {}      # by plan id: what a cached answer is keyed by (plans.reading)
        self.read_at = 0.0   # wall clock when the latest read that found this schema began (SchemaCache)
        # A referenced table -> the tables a write to it changes through foreign keys' actions.
        self.cascades = {} if schema is None else schema.cascades
        # The tables whose triggers or rules a write fires: they may write any table.
        self.triggered: frozenset[tuple[str, str]] = frozenset() if schema is None else schema.triggered
        self._key = None if schema is None else (
            schema.relations, schema.parents, schema.functions, schema.search_path, schema.operators,
            schema.extension_relations, schema.cascades, schema.triggered)

    def get(self, table: tuple[str, str], default: tuple = ()) -> tuple[tuple[str, str], ...]:
        return self.trees.get(table, default)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Kin) and self.trees == other.trees and self.views == other.views \
            and self._key == other._key

    __hash__ = None  # type: ignore[assignment]  # mutable-looking: compared, never hashed


def _quote(part: str) -> str:
    if "." in part or '"' in part:
        return '"' + part.replace('"', '""') + '"'
    return part


def qname(*parts: str) -> str:
    """``("public", "customers", "id")`` -> ``public.customers.id`` (odd parts quoted)."""
    return ".".join(_quote(p) for p in parts)


def split_qname(text: str) -> tuple[str, ...]:
    """The inverse of :func:`qname`: ``public."a.b".id`` -> ``("public", "a.b", "id")``."""
    parts: list[str] = []
    i, n = 0, len(text)
    while i <= n:
        if i < n and text[i] == '"':
            j, buf = i + 1, []
            while True:
                k = text.find('"', j)
                if k < 0:
                    raise ValueError(f"unterminated quote in {text!r}")
                buf.append(text[j:k])
                if k + 1 < n and text[k + 1] == '"':
                    buf.append('"')
                    j = k + 2
                    continue
                break
            parts.append("".join(buf))
            i = k + 1
            if i < n and text[i] != ".":
                raise ValueError(f"bad name {text!r}")
            i += 1
        else:
            k = text.find(".", i)
            if k < 0:
                parts.append(text[i:])
                break
            parts.append(text[i:k])
            i = k + 1
        if i == n and text.endswith("."):
            raise ValueError(f"bad name {text!r}")
    return tuple(parts)


def kinship(schema: Schema) -> Trees:
    """Each table of an inheritance or partition tree -> its ancestors (its rows are theirs)
    and its descendants (their rows are its own), as the schema is now. The planner matches a
    key's mask rules through it at call time (``gateway.governance.planning.plan``), so a
    partition or child added after a query was saved is masked when the parent is read."""
    kin: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for child, ancestors in schema.parents.items():
        for ancestor in ancestors:
            kin.setdefault(child, set()).add(ancestor)
            kin.setdefault(ancestor, set()).add(child)
    return {table: tuple(sorted(others)) for table, others in sorted(kin.items())}


class Schema:
    """``Schema({"public.customers": ("id", "name", ...)}, views=("public.v",))``.

    ``parents`` maps a child table (inheritance or partition) to its ancestors: a column
    read from the child is also a source column of the ancestors' column of that name, so
    a mask on ``customers.email`` covers ``customers_2024.email``. ``functions`` is the set
    of user-defined function names (unqualified), or None when unknown. ``operators`` maps
    the symbol of each operator that is not built in (``&&``) to the names of the functions
    behind it: an operator is a call of its function, written another way.
    ``extension_relations`` are the relations an extension owns (``pg_stat_statements``):
    the server's, like the catalogs, whatever schema they were installed in. ``cascades`` maps
    a table that foreign keys reference with an action (``ON DELETE CASCADE``, ``SET NULL``,
    ``SET DEFAULT``, or the same ``ON UPDATE``) to the referencing tables: a write to it may
    change their rows, though the statement does not name them (the response cache's
    invalidation follows it). ``triggered``: the tables with a trigger or a rule of a user's,
    which a write to them fires and which may write any table.
    """

    __slots__ = ("relations", "views", "parents", "functions", "search_path", "operators", "extension_relations",
                 "cascades", "triggered")

    def __init__(self, relations: Mapping[str, Sequence[str]], views: Iterable[str] = (),
                 parents: Mapping[str, Sequence[str]] | None = None,
                 functions: Iterable[str] | None = None, search_path: Sequence[str] | None = None,
                 operators: Mapping[str, Iterable[str]] | None = None,
                 extension_relations: Iterable[str] = (),
                 cascades: Mapping[str, Sequence[str]] | None = None, triggered: Iterable[str] = ()) -> None:
        rel: dict[tuple[str, str], tuple[str, ...]] = {}
        for name, columns in relations.items():
            parts = split_qname(name)
            if len(parts) == 1:
                parts = ("public", parts[0])
            if len(parts) != 2:
                raise ValueError(f"relation {name!r} must be schema.table")
            rel[parts] = tuple(columns)
        self.relations = rel
        self.views = frozenset(self._key(v) for v in views)
        self.parents = {self._key(child): tuple(self._key(p) for p in ps)
                        for child, ps in (parents or {}).items()}
        self.functions = frozenset(functions) if functions is not None else None
        self.search_path = tuple(search_path) if search_path else None
        self.operators = {symbol: tuple(sorted(set(names))) for symbol, names in (operators or {}).items()}
        self.extension_relations = frozenset(self._key(r) for r in extension_relations)
        self.cascades = {self._key(referenced): tuple(sorted({self._key(r) for r in referencing}))
                         for referenced, referencing in (cascades or {}).items()}
        self.triggered = frozenset(self._key(t) for t in triggered)

    def kinship(self) -> Kin:
        """The trees and views as they are now (``Kin``), for the planner."""
        return Kin(kinship(self), self.views, self)

    @staticmethod
    def _key(name: str) -> tuple[str, str]:
        parts = split_qname(name)
        return ("public", parts[0]) if len(parts) == 1 else parts  # type: ignore[return-value]

    def to_doc(self) -> dict:
        return {"relations": {qname(*k): list(v) for k, v in self.relations.items()},
                "views": sorted(qname(*v) for v in self.views),
                "parents": {qname(*k): [qname(*p) for p in v] for k, v in self.parents.items()},
                "functions": sorted(self.functions) if self.functions is not None else None,
                "search_path": list(self.search_path) if self.search_path else None,
                "operators": {symbol: list(names) for symbol, names in sorted(self.operators.items())},
                "extension_relations": sorted(qname(*r) for r in self.extension_relations),
                "cascades": {qname(*k): [qname(*r) for r in v] for k, v in sorted(self.cascades.items())},
                "triggered": sorted(qname(*t) for t in self.triggered)}

    @classmethod
    def from_doc(cls, doc: Mapping) -> Schema:
        return cls(doc["relations"], doc.get("views") or (), doc.get("parents") or None,
                   doc.get("functions"), doc.get("search_path"), doc.get("operators") or None,
                   doc.get("extension_relations") or (), doc.get("cascades") or None, doc.get("triggered") or ())

    @classmethod
    def coerce(cls, value: object) -> Schema:
        if isinstance(value, Schema):
            return value
        if isinstance(value, Mapping):
            if "relations" in value and isinstance(value["relations"], Mapping):
                return cls.from_doc(value)
            return cls(value)
        raise TypeError("schema must be a Schema or a mapping of relation -> columns")


_RELATIONS_SQL = """
SELECT n.nspname, c.relname, c.relkind, a.attname
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
 WHERE c.relkind IN ('r', 'v', 'm', 'f', 'p')
   AND n.nspname NOT LIKE 'pg\\_toast%' AND n.nspname NOT LIKE 'pg\\_temp\\_%'
 ORDER BY n.nspname, c.relname, a.attnum
"""

_PARENTS_SQL = """
WITH RECURSIVE up(child, parent) AS (
    SELECT inhrelid, inhparent FROM pg_catalog.pg_inherits
    UNION
    SELECT up.child, i.inhparent FROM up JOIN pg_catalog.pg_inherits i ON i.inhrelid = up.parent
)
SELECT cn.nspname, c.relname, pn.nspname, p.relname
  FROM up
  JOIN pg_catalog.pg_class c ON c.oid = up.child
  JOIN pg_catalog.pg_namespace cn ON cn.oid = c.relnamespace
  JOIN pg_catalog.pg_class p ON p.oid = up.parent
  JOIN pg_catalog.pg_namespace pn ON pn.oid = p.relnamespace
"""

# Foreign keys with an action: the referenced table, then the referencing one.
_CASCADES_SQL = """
SELECT dn.nspname, d.relname, rn.nspname, r.relname
  FROM pg_catalog.pg_constraint k
  JOIN pg_catalog.pg_class d ON d.oid = k.confrelid
  JOIN pg_catalog.pg_namespace dn ON dn.oid = d.relnamespace
  JOIN pg_catalog.pg_class r ON r.oid = k.conrelid
  JOIN pg_catalog.pg_namespace rn ON rn.oid = r.relnamespace
 WHERE k.contype = 'f' AND (k.confdeltype IN ('c', 'n', 'd') OR k.confupdtype IN ('c', 'n', 'd'))
"""

# Tables with a trigger of a user's (not a foreign key's own) or a rule (not a view's).
_TRIGGERED_SQL = """
SELECT n.nspname, c.relname
  FROM pg_catalog.pg_trigger t
  JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE NOT t.tgisinternal
UNION
SELECT n.nspname, c.relname
  FROM pg_catalog.pg_rewrite r
  JOIN pg_catalog.pg_class c ON c.oid = r.ev_class
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE r.rulename <> '_RETURN'
"""

_FUNCTIONS_SQL = """
SELECT DISTINCT p.proname
  FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
"""

# Operators that are not built in: defined outside pg_catalog/information_schema, or backed
# by a function defined there. An extension's own operators (citext's ``=``, hstore's ``->``)
# are left out, as the extension's code is the server's; an operator someone made over an
# extension's function is not.
_OPERATORS_SQL = """
SELECT o.oprname, p.proname
  FROM pg_catalog.pg_operator o
  JOIN pg_catalog.pg_namespace onsp ON onsp.oid = o.oprnamespace
  JOIN pg_catalog.pg_proc p ON p.oid = o.oprcode
  JOIN pg_catalog.pg_namespace pnsp ON pnsp.oid = p.pronamespace
 WHERE (onsp.nspname NOT IN ('pg_catalog', 'information_schema')
        OR pnsp.nspname NOT IN ('pg_catalog', 'information_schema'))
   AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend d
                    WHERE d.classid = 'pg_catalog.pg_operator'::pg_catalog.regclass
                      AND d.objid = o.oid AND d.deptype = 'e')
"""

_EXTENSION_RELATIONS_SQL = """
SELECT n.nspname, c.relname
  FROM pg_catalog.pg_depend d
  JOIN pg_catalog.pg_class c ON c.oid = d.objid
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.deptype = 'e'
   AND c.relkind IN ('r', 'v', 'm', 'f', 'p')
"""


def load_schema(conn: psycopg2.extensions.connection, search_path: Sequence[str] | None = None) -> Schema:
    """The relations (tables, views, materialized views, foreign and partitioned tables, in
    every schema including ``pg_catalog`` and ``information_schema``), inheritance parents,
    user-defined function names, the operators that are not built in (symbol -> function
    names) and the relations extensions own, visible to the psycopg2 connection ``conn``.

    ``search_path``: recorded on the schema; None reads the session's effective one
    (``current_schemas(false)``). The data sessions that run the queries must use the same
    search path (the gateway pins it in the session options)."""
    relations: dict[str, list[str]] = {}
    views: list[str] = []
    with conn.cursor() as cur:
        cur.execute(_RELATIONS_SQL)
        for nsp, rel, kind, column in cur.fetchall():
            key = qname(nsp, rel)
            if key not in relations:
                relations[key] = []
                if kind in ("v", "m"):
                    views.append(key)
            relations[key].append(column)
        cur.execute(_PARENTS_SQL)
        parents: dict[str, list[str]] = {}
        for cn, c, pn, p in cur.fetchall():
            parents.setdefault(qname(cn, c), []).append(qname(pn, p))
        cur.execute(_FUNCTIONS_SQL)
        functions = [row[0] for row in cur.fetchall()]
        cur.execute(_OPERATORS_SQL)
        operators: dict[str, list[str]] = {}
        for symbol, function in cur.fetchall():
            operators.setdefault(symbol, []).append(function)
        cur.execute(_EXTENSION_RELATIONS_SQL)
        extension_relations = [qname(nsp, rel) for nsp, rel in cur.fetchall()]
        cur.execute(_CASCADES_SQL)
        cascades: dict[str, list[str]] = {}
        for dn, d, rn, r in cur.fetchall():
            cascades.setdefault(qname(dn, d), []).append(qname(rn, r))
        cur.execute(_TRIGGERED_SQL)
        triggered = [qname(nsp, rel) for nsp, rel in cur.fetchall()]
        if search_path is None:
            cur.execute("SELECT current_schemas(false)")
            search_path = tuple(cur.fetchone()[0])
    return Schema(relations, views, parents, functions, search_path, operators, extension_relations, cascades,
                  triggered)
