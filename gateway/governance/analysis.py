"""Save-time analysis of one statement: its kind, every relation it touches, and for each
output column the source columns it is computed from (lineage). Everything governance
enforces per call is derived from this, once, so the hot path never parses SQL.

``analyze(statement, schema)`` takes a statement read by ``gateway.sql`` (PostgreSQL's own
parser; or its positional ``$n`` text) and reads it again with sqlglot's PostgreSQL dialect. It fails
closed: whatever it cannot resolve with certainty raises a ``GatewayError`` (400) with a
stable code (``gateway.governance.codes``), it never guesses.

How it stays honest:

* **Two readers agree.** sqlglot's tokens are checked against PostgreSQL's own lexer and
  parser (``gateway.sql``): identifiers, keywords and quoted identifiers must be the same
  sequence, parameters at the same places, the kind the same, so nothing PostgreSQL runs can
  hide from the parse tree inside a string or comment that sqlglot reads differently.
  ``U&`` escapes are refused outright.
* **Denied functions** are refused by name wherever they appear as a call: in the parse
  tree and in PostgreSQL's parse tree (every ``FuncCall``), quoted or schema-qualified.
* **Every part is resolved.** The analysis walks each clause itself (not sqlglot's
  optimizer) and at the end checks that every table, column, subquery and function node of
  the tree was resolved; a construct it does not follow is a refusal, not a silent skip.
* **Lineage is conservative.** An output column derives from every column referenced
  anywhere inside its expression (CASE conditions, window partitions, FILTER clauses,
  scalar subqueries' outputs); a set operation's column i from column i of every branch;
  a whole-row reference (``t``, ``t.*`` in a function, ``row_to_json(t)``) from every
  column of ``t`` and is flagged (``whole_row``). Predicates (WHERE, JOIN ... ON) are not
  output lineage: they are recorded in ``referenced``. A source that reaches a column through
  anything but a bare column reference (renamed through aliases, subqueries, CTEs and set
  operations) is ``derived``: the planner will not hash or partially mask such a value.
  Reading a table reads its inheritance children and partitions: their columns are sources.
* **Names resolve like PostgreSQL.** Unquoted identifiers fold to lower case; relations
  resolve through ``search_path`` with ``pg_catalog`` implicitly first (unless listed), so
  ``pg_authid`` is ``pg_catalog.pg_authid`` even when ``public.pg_authid`` exists; CTE names
  shadow tables only where SQL scoping says so; an unknown relation or column, an
  ambiguous column, or a forward reference inside ``WITH RECURSIVE`` is refused.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from sqlglot import exp
from sqlglot.dialects.postgres import Postgres
from sqlglot.tokens import Token

from ..errors import GatewayError, bad_request
from ..sql import MAX_SQL, Statement, read_positional
from ..sql.reader import fold, nodes
from .schema import Schema, load_schema, qname, split_qname

__all__ = ["analyze", "Analysis", "OutputColumn", "Schema", "load_schema", "DEFAULT_DENIED",
           "SIDE_EFFECTS", "CATALOG_SCHEMAS", "denied_matcher"]

# 2: output columns record which sources reach them through an expression (``derived``) and
# whether their names are PostgreSQL's (``exact_name``); a parent's columns name its children's.
ANALYSIS_VERSION = 2

# Functions refused wherever they are called. An entry ending in "*" is a prefix.
DEFAULT_DENIED: frozenset[str] = frozenset({
    # server files and programs
    "pg_read_file", "pg_read_binary_file", "pg_ls_*", "pg_stat_file", "pg_file_*", "pg_current_logfile",
    # large objects (server-side file import/export, arbitrary blobs)
    "lo_*", "loread", "lowrite",
    # session state, configuration and sleeping
    "set_config", "pg_sleep*", "pg_reload_conf", "pg_rotate_logfile", "pg_log_backend_memory_contexts",
    "pg_stat_reset*", "pg_stat_statements_reset",
    # other sessions, their query texts, locks and prepared statements (a pooled session holds
    # other callers'), and the statistics of every table (behind pg_stat_activity & co.)
    "pg_terminate_backend", "pg_cancel_backend", "pg_stat_get_*", "pg_lock_status", "pg_blocking_pids",
    "pg_safe_snapshot_blocking_pids", "pg_prepared_statement", "pg_cursor", "pg_prepared_xact",
    "pg_get_backend_memory_contexts", "pg_get_shmem_allocations", "pg_stat_statements", "pg_stat_statements_info",
    "pg_get_replication_slots", "pg_show_replication_origin_status",
    # server configuration, its files and its build; current_setting(name) is a row of
    # pg_settings (refused as a relation), custom ones included (``app.jwt_secret``, set per
    # database or role, is readable by every role)
    "pg_hba_file_rules", "pg_ident_file_mappings", "pg_show_all_file_settings", "pg_show_all_settings",
    "current_setting", "pg_settings_get_flags", "pg_config", "pg_control_*", "binary_upgrade_*",
    # what the catalogs hold, through functions rather than relations: the source of functions,
    # views, rules and triggers (pg_proc, pg_rewrite ... may hold literals: keys, addresses),
    # comments (pg_description), and the counters of sequences (unknown_table as relations)
    "pg_get_functiondef", "pg_get_viewdef", "pg_get_ruledef", "pg_get_triggerdef", "pg_get_indexdef",
    "pg_get_constraintdef", "pg_get_expr", "pg_get_statisticsobjdef*", "pg_get_partkeydef",
    "pg_get_partition_constraintdef", "obj_description", "col_description", "shobj_description",
    "pg_sequence_last_value", "pg_sequence_parameters",
    # locks and notifications
    "pg_advisory*", "pg_try_advisory*", "pg_notify",
    # replication, WAL, backups: these read or move every row
    "pg_logical_*", "pg_replication_*", "pg_create_*", "pg_drop_replication_slot", "pg_copy_*",
    "pg_switch_wal", "pg_promote", "pg_backup_*", "pg_start_backup", "pg_stop_backup", "pg_wal_replay_*",
    "pg_get_wal_*", "pg_import_system_collations", "pg_prewarm",
    # dynamic SQL or tables read by name, past the allow-list and the masks
    "query_to_xml*", "cursor_to_xml*", "table_to_xml*", "schema_to_xml*", "database_to_xml*",
    "ts_stat", "ts_rewrite", "crosstab*", "connectby", "xpath_table", "dblink*",
    # raw pages and buffers (pageinspect, pg_buffercache, pgstattuple, pg_visibility)
    "get_raw_page", "heap_page_items", "heap_page_item_attrs", "bt_page_items", "brin_page_items",
    "gin_leafpage_items", "pg_buffercache_pages", "pgstattuple*", "pg_visibility*",
    # sequences: moving another table's counter
    "setval",
    # newer servers' (17, 18): replication slots, and writing any table's planner statistics
    "pg_sync_replication_slots", "pg_restore_relation_stats", "pg_restore_attribute_stats",
    "pg_clear_relation_stats", "pg_clear_attribute_stats",
})

# Functions with side effects (or that read another caller's session state): allowed only in
# a statement that writes, for a key (and a server) that allows writes. The deny list wins
# where both name a function (``pg_advisory_lock`` stays refused unless lifted).
SIDE_EFFECTS: frozenset[str] = frozenset({
    "nextval", "setval", "currval", "lastval", "setseed",
    "pg_advisory*", "pg_try_advisory*", "pg_notify", "set_config",
    "brin_summarize_*", "brin_desummarize_range", "gin_clean_pending_list",
    "lo_*", "loread", "lowrite", "txid_*", "pg_current_xact_id*", "pg_export_snapshot",
    "pg_terminate_backend", "pg_cancel_backend", "pg_stat_reset*", "pg_stat_statements_reset",
    "pg_stat_force_next_flush", "pg_replication_origin_*", "pg_log_standby_snapshot",
    "pg_restore_relation_stats", "pg_restore_attribute_stats", "pg_clear_relation_stats", "pg_clear_attribute_stats",
})

# The schemas of the system catalogs: their relations (and those an extension owns, wherever
# it was installed) are refused for every key unless the server names them
# (``GATEWAY_ALLOW_CATALOG_RELATIONS``).
CATALOG_SCHEMAS = frozenset({"pg_catalog", "information_schema"})


def denied_matcher(denied: Iterable[str], allowed: Iterable[str] = ()) -> Callable[[str], bool]:
    """A predicate ``name -> bool`` for a deny list (case-insensitive; ``x*`` is a prefix),
    minus the exact names an operator lifted (``GATEWAY_ALLOW_FUNCTIONS``)."""
    exact = {d.lower() for d in denied if not d.endswith("*")}
    prefixes = tuple(d[:-1].lower() for d in denied if d.endswith("*"))
    lifted = frozenset(a.lower() for a in allowed)

    def match(name: str) -> bool:
        low = name.lower()
        return low not in lifted and (low in exact or (bool(prefixes) and low.startswith(prefixes)))
    return match


# --- the result -----------------------------------------------------------------------------
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


# --- errors ---------------------------------------------------------------------------------
def _failed(message: str) -> GatewayError:
    return bad_request("analysis_failed", message)


def _not_allowed(message: str) -> GatewayError:
    return bad_request("sql_not_allowed", message)


# --- internal model ---------------------------------------------------------------------------
_EMPTY: frozenset = frozenset()


class _Col:
    """A column of a relation in scope: its name, the source columns (schema, table, column)
    its values derive from, the relations it holds whole rows of, the sources that reach it
    through an expression rather than as themselves (``derived`` is a subset of
    ``sources``), and whether ``name`` is certainly PostgreSQL's (``exact``)."""

    __slots__ = ("name", "sources", "whole", "derived", "exact")

    def __init__(self, name: str, sources: frozenset = _EMPTY, whole: frozenset = _EMPTY,
                 derived: frozenset = _EMPTY, exact: bool = True) -> None:
        self.name = name
        self.sources = sources
        self.whole = whole
        self.derived = derived
        self.exact = exact

    def renamed(self, name: str) -> _Col:
        return _Col(name, self.sources, self.whole, self.derived)   # an alias is an exact name

    def same(self, other: _Col) -> bool:
        return self.sources == other.sources and self.whole == other.whole and self.derived == other.derived

    def bare(self) -> bool:
        """Whether every value is a source column's value as it is (no literal, parameter or
        expression among them)."""
        return bool(self.sources) and not self.derived

    def union(self, other: _Col) -> _Col:
        """This column and ``other`` in one (set operation branches, VALUES rows, a USING join
        column), named as this one. Direct only when both are: a branch that is a literal, a
        parameter or an expression would have its values hashed with the column's (a hashing
        oracle for chosen values), so then every source is derived."""
        sources = self.sources | other.sources
        derived = _EMPTY if self.bare() and other.bare() else sources
        return _Col(self.name, sources, self.whole | other.whole, derived, self.exact)


def _computed(name: str, sources: frozenset, whole: frozenset = _EMPTY, exact: bool = True) -> _Col:
    """A column whose values are computed from ``sources``: every one of them derived."""
    return _Col(name, sources, whole, sources, exact)


_Ctes = dict[str, list[_Col]]   # the CTEs in scope, by name: their columns


class _Rel:
    """A FROM item: ``key`` is the name it is referred to by (alias or relation name; None
    for an unaliased subquery); ``qualified`` the (schema, table) of a schema relation;
    ``cols`` None when its columns cannot be named (a function returning a record)."""

    __slots__ = ("key", "qualified", "aliased", "cols", "any_sources", "any_whole")

    def __init__(self, key: str | None, cols: list[_Col] | None, qualified: tuple[str, str] | None = None,
                 aliased: bool = False, any_sources: frozenset = _EMPTY, any_whole: frozenset = _EMPTY) -> None:
        self.key = key
        self.cols = cols
        self.qualified = qualified
        self.aliased = aliased
        self.any_sources = any_sources
        self.any_whole = any_whole


class _Tree:
    """One entry of a FROM list: a relation, or relations joined; ``cols`` in ``SELECT *``
    order, ``merged`` the USING/NATURAL join columns (found first by an unqualified name)."""

    __slots__ = ("rels", "cols", "merged")

    def __init__(self, rels: list[_Rel], cols: list[_Col] | None, merged: dict[str, _Col] | None = None) -> None:
        self.rels = rels
        self.cols = cols
        self.merged = merged or {}


class _Target(_Tree):
    """A write's target: one table, so its columns are always known."""

    __slots__ = ()
    cols: list[_Col]


class _Scope:
    __slots__ = ("parent", "ctes", "trees", "outputs")

    def __init__(self, parent: _Scope | None, ctes: _Ctes) -> None:
        self.parent = parent
        self.ctes = ctes
        self.trees: list[_Tree] = []
        self.outputs: dict | None = None

    def rels(self) -> Iterator[_Rel]:
        for tree in self.trees:
            yield from tree.rels

    def column(self, name: str) -> _Col | None:
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
            raise _failed(f"column reference {name!r} is ambiguous")
        if unknown:
            raise _failed(f"cannot tell which relation column {name!r} comes from (a function "
                          "in FROM without a column definition list)")
        return hits[0] if hits else None

    def relation(self, name: str, schema: str | None = None) -> _Rel | None:
        for rel in self.rels():
            if schema is None:
                if rel.key == name:
                    return rel
            elif not rel.aliased and rel.qualified == (schema, name):
                return rel
        return None


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
NAMEDATALEN = 64


def _pg_name(text: str, quoted: bool) -> str:
    """An identifier as PostgreSQL stores it: unquoted ones folded to lower case (ASCII
    letters only, as ``downcase_identifier`` does in UTF-8), truncated to 63 bytes."""
    name = text if quoted else text.translate(_ASCII_LOWER)
    data = name.encode("utf-8")
    if len(data) >= NAMEDATALEN:
        name = data[:NAMEDATALEN - 1].decode("utf-8", "ignore")
    return name


def _ident(node: object) -> str:
    if isinstance(node, exp.Identifier):
        return _pg_name(node.this, bool(node.quoted))
    if isinstance(node, str):
        return _pg_name(node, False)
    raise _failed(f"expected a name, found {type(node).__name__}")


def _truthy(value: object) -> bool:
    return value is not None and value is not False and value != []


_WRITE_OPS = {exp.Insert: "insert", exp.Update: "update", exp.Delete: "delete", exp.Merge: "merge"}
_WRITES = tuple(_WRITE_OPS)
_QUERIES = (exp.Select, exp.SetOperation, exp.Values, exp.Subquery)

# Set-returning functions whose output column names are known (single-column ones take the
# alias, or the function's name, as PostgreSQL does).
_SINGLE_SRF = frozenset({"generate_series", "generate_subscripts", "regexp_split_to_table", "string_to_table",
                         "json_object_keys", "jsonb_object_keys", "jsonb_path_query", "regexp_matches"})
# ...and those whose columns are named by their OUT parameters, whatever the alias.
_MULTI_SRF = {"json_each": ("key", "value"), "jsonb_each": ("key", "value"), "json_each_text": ("key", "value"),
              "jsonb_each_text": ("key", "value"), "json_array_elements": ("value",),
              "json_array_elements_text": ("value",), "jsonb_array_elements": ("value",),
              "jsonb_array_elements_text": ("value",)}
_TYPED_NAMES = {"explodinggenerateseries": "generate_series", "generateseries": "generate_series",
                "unnest": "unnest", "groupconcat": "string_agg", "arrayagg": "array_agg"}
# Words PostgreSQL reads as values where a column name could stand.
_KEYWORD_VALUES = frozenset({"current_user", "session_user", "user", "current_role", "current_catalog",
                             "current_schema", "current_date", "current_time", "current_timestamp",
                             "localtime", "localtimestamp"})
_SELECT_ARGS = {"with_", "expressions", "distinct", "from_", "joins", "where", "group", "having",
                "windows", "order", "limit", "offset", "kind"}
_MODIFIER_ARGS = ("order", "limit", "offset")
# The words a served statement can start with (a parenthesised query starts with "(").
_LEADING = frozenset({"select", "with", "values", "table", "insert", "update", "delete", "merge", "("})


class _Analyzer:
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

    # -- bookkeeping ---------------------------------------------------------------------------
    def mark(self, node: object) -> None:
        self.seen.add(id(node))

    @staticmethod
    def check_args(node: exp.Expr, allowed: Container[str]) -> None:
        for key, value in node.args.items():
            if key not in allowed and _truthy(value):
                raise _failed(f"unsupported {key.rstrip('_')} in {node.key.upper()}")

    # -- queries -------------------------------------------------------------------------------
    def query(self, node: exp.Expr, parent: _Scope | None, ctes: _Ctes) -> list[_Col]:
        self.mark(node)
        if isinstance(node, exp.Subquery):
            self.check_args(node, {"this", "alias", "with_", *_MODIFIER_ARGS})
            ctes = self.with_(node, parent, ctes)
            if not isinstance(node.this, _QUERIES):
                raise _failed(f"unsupported parenthesised {node.this.key.upper()}")
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
                raise _failed("the branches of a set operation have different numbers of columns")
            cols = [a.union(b) for a, b in zip(left, right, strict=True)]
            self.modifiers(node, cols, parent, ctes)
            return cols
        if isinstance(node, exp.Values):
            return self.values(node, parent, ctes)
        raise _failed(f"unsupported query part {node.key.upper()}")

    def modifiers(self, node: exp.Expr, cols: list[_Col], parent: _Scope | None, ctes: _Ctes) -> None:
        """ORDER BY / LIMIT / OFFSET of a set operation or a parenthesised query: they see
        its output columns by name."""
        if not any(node.args.get(k) for k in _MODIFIER_ARGS):
            return
        scope = _Scope(parent, ctes)
        scope.trees.append(_Tree([_Rel(None, list(cols))], list(cols)))
        for key in _MODIFIER_ARGS:
            if node.args.get(key) is not None:
                self.referenced_in(node.args[key], scope)

    def with_(self, node: exp.Expr, parent: _Scope | None, ctes: _Ctes) -> _Ctes:
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
                raise _failed("a CTE without a name")
            self.mark(alias)
            name = _ident(alias.this)
            if isinstance(cte.this, _WRITES):
                raise _not_allowed("data-modifying statements in WITH (writable CTEs) are not allowed")
            entries.append((name, self.alias_columns(alias), cte.this))
        if recursive:
            names = [name for name, _, _ in entries]
            for position, (_name, _, body) in enumerate(entries):
                later = set(names[position + 1:])
                for table in body.find_all(exp.Table):
                    if isinstance(table.this, exp.Identifier) and not table.args.get("db") \
                            and _ident(table.this) in later:
                        raise _failed("a forward reference between the CTEs of WITH RECURSIVE")
        for name, columns, body in entries:
            if recursive and isinstance(body, exp.SetOperation):
                cols = self.recursive_cte(name, columns, body, parent, ctes)
            else:
                cols = self.rename(self.query(body, parent, ctes), columns)
            ctes[name] = cols
        return ctes

    def recursive_cte(self, name: str, columns: list[str] | None, body: exp.SetOperation, parent: _Scope | None,
                      ctes: _Ctes) -> list[_Col]:
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
                raise _failed("a recursive CTE whose branches have different numbers of columns")
            merged = [a.union(b) for a, b in zip(current, cols, strict=True)]
            if all(a.same(b) for a, b in zip(merged, current, strict=True)):
                return merged
            current = merged
        raise _failed("the lineage of a recursive CTE does not settle")

    def values(self, node: exp.Values, parent: _Scope | None, ctes: _Ctes) -> list[_Col]:
        self.check_args(node, {"expressions", "alias"})
        scope = _Scope(parent, ctes)
        width = None
        acc: list = []
        for row in node.expressions:
            self.mark(row)
            items = row.expressions if isinstance(row, exp.Tuple) else [row]
            if width is None:
                width = len(items)
                acc = [None] * width
            elif len(items) != width:
                raise _failed("VALUES lists must all be the same length")
            for i, item in enumerate(items):
                col = _Col(f"column{i + 1}", *self.output(item, scope))
                acc[i] = col if acc[i] is None else acc[i].union(col)
        return acc

    def select(self, node: exp.Select, parent: _Scope | None, ctes: _Ctes) -> list[_Col]:
        if node.args.get("into") is not None:
            raise _not_allowed("SELECT ... INTO creates a table and is not allowed")
        if node.args.get("locks"):
            raise _not_allowed("row locks (FOR UPDATE / FOR SHARE) are not allowed")
        self.check_args(node, _SELECT_ARGS)
        if node.args.get("kind"):
            raise _failed(f"unsupported SELECT {node.args['kind']}")
        ctes = self.with_(node, parent, ctes)
        scope = _Scope(parent, ctes)
        from_ = node.args.get("from_")
        joins = node.args.get("joins") or []
        if from_ is not None:
            self.mark(from_)
            self.check_args(from_, {"this"})
            self.from_list(scope, from_.this, joins)
        elif joins:
            raise _failed("JOIN without FROM")
        cols: list[_Col] = []
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
            value = node.args.get(key)
            for part in (value if isinstance(value, list) else [value] if value is not None else []):
                self.referenced_in(part, scope)
        for key in ("group", "order"):
            if node.args.get(key) is not None:
                self.referenced_in(node.args[key], scope, outputs=True)
        return cols

    def projection(self, node: exp.Expr, scope: _Scope) -> list[_Col]:
        if isinstance(node, exp.Star):
            self.mark(node)
            self.check_args(node, set())
            if not scope.trees:
                raise _failed("SELECT * without FROM")
            cols = []
            for tree in scope.trees:
                if tree.cols is None:
                    raise _failed("SELECT * over a function whose columns cannot be named; name the columns")
                cols.extend(tree.cols)
            return list(cols)
        if isinstance(node, exp.Column) and isinstance(node.this, exp.Star):
            self.mark(node)
            self.mark(node.this)
            rel = self.find_relation(node, scope)
            if rel.cols is None:
                raise _failed(f"{rel.key}.* over a function whose columns cannot be named")
            return list(rel.cols)
        src, whole, derived = self.output(node, scope)
        return [_Col(_output_name(node), src, whole, derived, _exact_name(node))]

    # -- FROM ------------------------------------------------------------------------------------
    def from_list(self, scope: _Scope, first: exp.Expr, joins: list[exp.Join], nested: bool = False) -> None:
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

    def join(self, left: _Tree, right: _Tree, join: exp.Join) -> _Tree:
        using = join.args.get("using") or []
        method = str(join.args.get("method") or "").upper()
        if method and method != "NATURAL":
            raise _failed(f"unsupported {method} join")
        rels = left.rels + right.rels
        merged = {**left.merged, **right.merged}
        if not using and method != "NATURAL":
            cols = None if left.cols is None or right.cols is None else left.cols + right.cols
            return _Tree(rels, cols, merged)
        if left.cols is None or right.cols is None:
            raise _failed("a USING/NATURAL join with a function whose columns cannot be named")
        if using:
            names = []
            for item in using:
                self.mark(item)
                names.append(_ident(item.this if isinstance(item, exp.Column) else item))
        else:
            right_names = {c.name for c in right.cols}
            names = [c.name for c in left.cols if c.name in right_names]
        joined = []
        for name in names:
            a = [c for c in left.cols if c.name == name]
            b = [c for c in right.cols if c.name == name]
            if len(a) != 1 or len(b) != 1:
                raise _failed(f"join column {name!r} is missing or ambiguous")
            col = a[0].union(b[0])
            joined.append(col)
            merged[name] = col
        named = set(names)
        cols = joined + [c for c in left.cols if c.name not in named] + [c for c in right.cols if c.name not in named]
        return _Tree(rels, cols, merged)

    def from_item(self, item: exp.Expr, scope: _Scope) -> _Tree:
        self.mark(item)
        if isinstance(item, exp.Table):
            return self.table_item(item, scope)
        if isinstance(item, exp.Subquery):
            inner = item.this
            if isinstance(inner, exp.Table) and inner.args.get("joins"):
                if item.args.get("alias") is not None:
                    raise _failed("an alias on a parenthesised join")
                self.check_args(item, {"this"})
                nested = _Scope(scope.parent, scope.ctes)
                self.from_list(nested, inner, inner.args["joins"], nested=True)
                if len(nested.trees) != 1:
                    raise _failed("unsupported parenthesised FROM list")
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
            raise _failed(f"unsupported LATERAL {inner.key.upper()}")
        if isinstance(item, exp.Unnest):
            return self.unnest(item, item.args.get("alias"), scope)
        if isinstance(item, exp.Values):
            alias = item.args.get("alias")
            cols = self.values(item, scope.parent, scope.ctes)
            return self.derived(alias, cols)
        raise _failed(f"unsupported FROM item {item.key.upper()}")

    def derived(self, alias: exp.TableAlias | None, cols: list[_Col]) -> _Tree:
        name = None
        if alias is not None:
            self.mark(alias)
            name = _ident(alias.this) if alias.this is not None else None
            cols = self.rename(cols, self.alias_columns(alias))
        rel = _Rel(name, list(cols), aliased=True)
        return _Tree([rel], list(cols))

    def alias_columns(self, alias: exp.TableAlias | None) -> list[str] | None:
        if alias is None or not alias.args.get("columns"):
            return None
        names = []
        for column in alias.args["columns"]:
            self.mark(column)
            if isinstance(column, exp.ColumnDef):
                names.append(_ident(column.this))
                for part in column.walk():
                    self.mark(part)
            else:
                names.append(_ident(column))
        return names

    @staticmethod
    def rename(cols: list[_Col], names: list[str] | None) -> list[_Col]:
        if not names:
            return list(cols)
        if len(names) > len(cols):
            raise _failed("more column aliases than columns")
        return [c.renamed(names[i]) if i < len(names) else c for i, c in enumerate(cols)]

    def table_item(self, item: exp.Expr, scope: _Scope, nested: bool = False) -> _Tree:
        if item.args.get("joins") and not nested:
            raise _failed("unsupported nested join")
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
                self.functions.add(f"{_ident(item.args['db'])}.{self.function_name(this)}")
            return self.function_rel(this, alias, scope, bool(item.args.get("ordinality")))
        if not isinstance(this, exp.Identifier):
            raise _failed(f"unsupported FROM item {this.key.upper()}")
        if item.args.get("ordinality"):
            raise _failed("WITH ORDINALITY on a table")
        name = _ident(this)
        db = item.args.get("db")
        alias_name = _ident(alias.this) if alias is not None and alias.this is not None else None
        if db is None and name in scope.ctes:
            cols = self.rename(scope.ctes[name], self.alias_columns(alias))
            rel = _Rel(alias_name or name, cols, aliased=True)
            return _Tree([rel], list(cols))
        key = self.resolve_relation(_ident(db) if db is not None else None, name)
        cols = self.rename(self.relation_columns(key), self.alias_columns(alias))
        rel = _Rel(alias_name or name, cols, qualified=key, aliased=alias_name is not None)
        return _Tree([rel], list(cols))

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

    def relation_columns(self, key: tuple[str, str]) -> list[_Col]:
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
            cols.append(_Col(column, frozenset(sources)))
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

    def function_rel(self, fn: exp.Func, alias: exp.TableAlias | None, scope: _Scope, ordinality: bool) -> _Tree:
        name = self.function_name(fn)
        src, whole = self.lineage(fn, scope)
        alias_name = _ident(alias.this) if alias is not None and alias.this is not None else None
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
        cols = None if names is None else [_computed(n, src, whole, exact) for n in names]
        rel = _Rel(alias_name or name, cols, aliased=True, any_sources=src, any_whole=whole)
        return _Tree([rel], None if cols is None else list(cols))

    def unnest(self, node: exp.Unnest, alias: exp.TableAlias | None, scope: _Scope) -> _Tree:
        self.mark(node)
        self.check_args(node, {"expressions", "alias", "offset"})
        self.functions.add("unnest")
        per_arg = [self.lineage(arg, scope) for arg in node.expressions]
        alias_name = _ident(alias.this) if alias is not None and alias.this is not None else None
        if alias is not None:
            self.mark(alias)
        names = self.alias_columns(alias)
        if names is None:
            names = [alias_name or "unnest"] if len(per_arg) == 1 and alias_name else ["unnest"] * len(per_arg)
        if len(names) != len(per_arg):
            raise _failed("unnest column aliases do not match its arguments")
        cols = [_computed(n, s, w) for n, (s, w) in zip(names, per_arg, strict=True)]
        offset = node.args.get("offset")
        if _truthy(offset):
            self.mark(offset)
            cols.append(_Col(_ident(offset) if isinstance(offset, exp.Identifier) else "ordinality"))
        all_src = frozenset().union(*(s for s, _ in per_arg)) if per_arg else _EMPTY
        all_whole = frozenset().union(*(w for _, w in per_arg)) if per_arg else _EMPTY
        rel = _Rel(alias_name or "unnest", cols, aliased=True, any_sources=all_src, any_whole=all_whole)
        return _Tree([rel], list(cols))

    def rows_from(self, item: exp.Expr, alias: exp.TableAlias | None, scope: _Scope) -> _Tree:
        src: set = set()
        whole: set = set()
        for part in item.args["rows_from"]:
            self.mark(part)
            fn = part.this if isinstance(part, exp.Table) else part
            if not isinstance(fn, exp.Func):
                raise _failed("unsupported ROWS FROM item")
            self.mark(fn)
            s, w = self.lineage(fn, scope)
            src |= s
            whole |= w
        names = self.alias_columns(alias)
        alias_name = _ident(alias.this) if alias is not None and alias.this is not None else None
        sources, wholes = frozenset(src), frozenset(whole)
        cols = None if names is None else [_computed(n, sources, wholes) for n in names]
        rel = _Rel(alias_name, cols, aliased=True, any_sources=sources, any_whole=wholes)
        return _Tree([rel], cols)

    # -- expressions ---------------------------------------------------------------------------
    def lineage(self, node: exp.Expr, scope: _Scope, outputs: bool = False) -> tuple[frozenset, frozenset]:
        src: set = set()
        whole: set = set()
        self.walk(node, scope, src, whole, outputs)
        return frozenset(src), frozenset(whole)

    def output(self, node: exp.Expr, scope: _Scope) -> tuple[frozenset, frozenset, frozenset]:
        """(sources, whole rows, derived) of one output expression. Only a bare column
        reference (aliased or parenthesised) passes a column's values through as they are,
        keeping what it derives; any other expression computes new values from every source
        it reads, so all of them are derived."""
        src, whole = self.lineage(node, scope)
        column = _bare_column(node)
        if column is None:
            return src, whole, src
        # Resolved a second time (already marked and recorded): to learn what it passes on.
        return src, whole, self.resolve(column, scope).derived

    def referenced_in(self, node: exp.Expr, scope: _Scope, outputs: bool = False) -> None:
        self.walk(node, scope, set(), set(), outputs)

    def walk(self, node: exp.Expr, scope: _Scope, src: set, whole: set, outputs: bool) -> None:
        self.mark(node)
        if isinstance(node, exp.Column):
            s, w = self.column(node, scope, outputs)
            src.update(s)
            whole.update(w)
            return
        if isinstance(node, _QUERIES):
            for col in self.query(node, scope, scope.ctes):
                src.update(col.sources)
                whole.update(col.whole)
            return
        if isinstance(node, exp.Star):
            if isinstance(node.parent, exp.Count):
                return
            raise _failed("* inside an expression")
        if isinstance(node, (exp.Table, exp.From, exp.Join) + _WRITES):
            raise _failed(f"unexpected {node.key.upper()} inside an expression")
        if isinstance(node, exp.Dot) and isinstance(node.this, exp.Identifier) \
                and isinstance(node.expression, exp.Func):
            self.mark(node.this)
            qualifier = _ident(node.this)
            self.functions.add(f"{qualifier}.{self.function_name(node.expression)}")
        elif isinstance(node, exp.Func):
            self.function_name(node)
        for child in node.iter_expressions():
            self.walk(child, scope, src, whole, outputs)

    def function_name(self, node: exp.Func) -> str:
        if isinstance(node, exp.Anonymous):
            name = _ident(node.this) if isinstance(node.this, (exp.Identifier, str)) else str(node.this)
        else:
            raw = type(node).__name__.lower()
            name = _TYPED_NAMES.get(raw) or node.sql_name().lower()
        if self.denied(name):
            raise bad_request("function_not_allowed", f"function {name}() is not allowed")
        self.functions.add(name)
        return name

    def column(self, node: exp.Column, scope: _Scope, outputs: bool = False) -> tuple[frozenset, frozenset]:
        col = self.resolve(node, scope, outputs)
        return col.sources, col.whole

    def resolve(self, node: exp.Column, scope: _Scope, outputs: bool = False) -> _Col:
        """The column a column reference means. A whole row, or a column of a function whose
        columns cannot be told apart, is a value computed from its sources: all derived."""
        self.mark(node)
        if node.args.get("catalog") is not None:
            raise _failed("a column reference qualified with a database name")
        for part in ("table", "db"):
            if node.args.get(part) is not None:
                self.mark(node.args[part])
        if isinstance(node.this, exp.Star):
            self.mark(node.this)
            return _computed("*", *self.whole_of(self.find_relation(node, scope)))
        self.mark(node.this)
        name = _ident(node.this)
        if node.args.get("table") is None:
            if outputs and scope.outputs and name in scope.outputs:
                return scope.outputs[name]
            level: _Scope | None = scope
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
                    return _computed(name, *self.whole_of(rel))
                level = level.parent
            if name in _KEYWORD_VALUES and not node.this.quoted:
                return _Col(name)
            raise bad_request("unknown_column", f"column {name!r} does not resolve to a relation in scope")
        rel = self.find_relation(node, scope)
        if rel.cols is None:
            self.referenced.update(rel.any_sources)
            return _computed(name, rel.any_sources, rel.any_whole)
        hits = [c for c in rel.cols if c.name == name]
        if len(hits) != 1:
            if not hits:
                raise bad_request("unknown_column", f"column {rel.key}.{name} does not exist")
            raise _failed(f"column reference {rel.key}.{name} is ambiguous")
        self.referenced.update(hits[0].sources)
        return hits[0]

    def find_relation(self, node: exp.Column, scope: _Scope) -> _Rel:
        table = node.args.get("table")
        db = node.args.get("db")
        if table is None:
            raise _failed("a qualified reference without a relation")
        name = _ident(table)
        schema_name = _ident(db) if db is not None else None
        level: _Scope | None = scope
        while level is not None:
            rel = level.relation(name, schema_name)
            if rel is not None:
                return rel
            level = level.parent
        shown = f"{schema_name}.{name}" if schema_name else name
        raise bad_request("unknown_column", f"relation {shown} is not in scope (missing FROM entry)")

    def whole_of(self, rel: _Rel) -> tuple[frozenset, frozenset]:
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

    # -- writes ----------------------------------------------------------------------------------
    def write(self, root: exp.Expr) -> list[_Col]:
        ctes = self.with_(root, None, {})
        if isinstance(root, exp.Insert):
            return self.insert(root, ctes)
        if isinstance(root, exp.Update):
            return self.update(root, ctes)
        if isinstance(root, exp.Delete):
            return self.delete(root, ctes)
        return self.merge(root, ctes)

    def target(self, table: exp.Expr) -> _Target:
        if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier):
            raise _failed("the target of a write must be a table")
        self.mark(table)
        self.check_args(table, {"this", "db", "alias", "only"})
        alias = table.args.get("alias")
        if alias is not None:
            self.mark(alias)
            if alias.args.get("columns"):
                raise _failed("column aliases on a write target")
        db = table.args.get("db")
        if db is not None:
            self.mark(db)
        key = self.resolve_relation(_ident(db) if db is not None else None, _ident(table.this))
        cols = self.relation_columns(key)
        alias_name = _ident(alias.this) if alias is not None and alias.this is not None else None
        return _Target([_Rel(alias_name or key[1], cols, qualified=key, aliased=alias_name is not None)], cols)

    def target_columns(self, target: _Target, nodes: Iterable[exp.Expr]) -> None:
        names = {c.name for c in target.cols}
        for node in nodes:
            for part in node.walk():
                self.mark(part)
            column = node
            if isinstance(column, exp.Column):
                if column.args.get("table") is not None or column.args.get("db") is not None:
                    raise _failed("a qualified column name as a write target")
                column = column.this
            if not isinstance(column, exp.Identifier):
                raise _failed("unsupported assignment target")
            if _ident(column) not in names:
                raise bad_request("unknown_column", f"column {_ident(column)!r} is not a column of the target")

    def assignments(self, target: _Target, items: Iterable[exp.Expr], scope: _Scope) -> None:
        for item in items:
            self.mark(item)
            if not isinstance(item, exp.EQ):
                raise _failed("unsupported assignment")
            left = item.this
            self.target_columns(target, left.expressions if isinstance(left, exp.Tuple) else [left])
            if isinstance(left, exp.Tuple):
                self.mark(left)
            src, _ = self.lineage(item.expression, scope)
            self.write_sources.update(src)

    def returning(self, root: exp.Expr, target: _Target, scope: _Scope) -> list[_Col]:
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
            augmented = [_Col(c.name, c.sources | written, c.whole,
                              c.sources | written if chosen is _ALL or c.name in chosen else c.derived | written)
                         for c in target.cols]
            rel = target.rels[0]
            rel.cols = augmented
            target.cols = augmented
        cols = []
        for projection in returning.expressions:
            cols.extend(self.projection(projection, scope))
        return cols

    def insert(self, root: exp.Insert, ctes: _Ctes) -> list[_Col]:
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
            self.mark(conflict)
            self.check_args(conflict, {"expressions", "action", "conflict_keys", "index_predicate",
                                       "constraint", "where"})
            written = frozenset(self.write_sources)
            excluded = [_Col(c.name, c.sources | written) for c in target.cols]
            scope = _Scope(None, ctes)
            scope.trees = [target, _Tree([_Rel("excluded", excluded, aliased=True)], excluded)]
            target_only = _Scope(None, ctes)
            target_only.trees = [target]
            for part in ("action", "constraint"):
                if conflict.args.get(part) is not None:
                    for node in conflict.args[part].walk():
                        self.mark(node)
            action = conflict.args.get("action")
            if not (isinstance(action, exp.Var) and " ".join(str(action.this).upper().split()) == "DO NOTHING"):
                self.write_ops.add("update")     # ON CONFLICT DO UPDATE updates
            for key in ("conflict_keys", "index_predicate", "where"):
                value = conflict.args.get(key)
                for part in (value if isinstance(value, list) else [value] if value is not None else []):
                    self.referenced_in(part, scope if key == "where" else target_only)
            self.assignments(target, conflict.args.get("expressions") or [], scope)
        scope = _Scope(None, ctes)
        scope.trees = [target]
        return self.returning(root, target, scope)

    def update(self, root: exp.Update, ctes: _Ctes) -> list[_Col]:
        self.check_args(root, {"with_", "this", "expressions", "from_", "where", "returning"})
        self.mark(root)
        target = self.target(root.this)
        scope = _Scope(None, ctes)
        scope.trees = [target]
        from_ = root.args.get("from_")
        if from_ is not None:
            self.mark(from_)
            self.from_list(scope, from_.this, [])
        self.assignments(target, root.expressions, scope)
        if root.args.get("where") is not None:
            self.referenced_in(root.args["where"], scope)
        return self.returning(root, target, scope)

    def delete(self, root: exp.Delete, ctes: _Ctes) -> list[_Col]:
        self.check_args(root, {"with_", "this", "using", "where", "returning"})
        self.mark(root)
        target = self.target(root.this)
        scope = _Scope(None, ctes)
        scope.trees = [target]
        for item in root.args.get("using") or []:
            scope.trees.append(self.from_item(item, scope))
        if root.args.get("where") is not None:
            self.referenced_in(root.args["where"], scope)
        return self.returning(root, target, scope)

    def merge(self, root: exp.Expr, ctes: _Ctes) -> list[_Col]:
        self.check_args(root, {"with_", "this", "using", "on", "whens", "returning"})
        self.mark(root)
        target = self.target(root.this)
        scope = _Scope(None, ctes)
        scope.trees = [target]
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
                then = when.args.get("then")
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
                    raise _failed("unsupported MERGE action")
        return self.returning(root, target, scope)


_ALL = frozenset({"*"})


def _stored_by(root: exp.Expr) -> frozenset:
    """The target columns a write sets (``_ALL`` for an INSERT or a MERGE, which may set any)."""
    if isinstance(root, exp.Delete):
        return _EMPTY
    if not isinstance(root, exp.Update):
        return _ALL
    names = set()
    for item in root.expressions:
        left = item.this
        for column in (left.expressions if isinstance(left, exp.Tuple) else [left]):
            names.add(_ident(column.this if isinstance(column, exp.Column) else column))
    return frozenset(names)


def _output_column(col: _Col) -> OutputColumn:
    return OutputColumn(col.name, frozenset(qname(*s) for s in col.sources), frozenset(qname(*w) for w in col.whole),
                        frozenset(qname(*s) for s in col.derived), col.exact)


def _bare_column(node: exp.Expr) -> exp.Column | None:
    """The column reference ``node`` is, through an alias and parentheses, or None."""
    if isinstance(node, exp.Alias):
        node = node.this
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Column) and isinstance(node.this, exp.Identifier):
        return node
    return None


def _exact_name(node: exp.Expr) -> bool:
    """Whether :func:`_output_name` is certainly PostgreSQL's name for the projection: an
    alias, or a column reference (PostgreSQL names a cast of a column after the column).
    Other expressions are named after functions as sqlglot reads them (``substr`` becomes
    ``substring``), so their names are not checked against a result's."""
    if isinstance(node, exp.Alias):
        return True
    while isinstance(node, (exp.Cast, exp.Paren)):
        node = node.this
    return isinstance(node, exp.Column) and isinstance(node.this, exp.Identifier) \
        and not (_ident(node.this) in _KEYWORD_VALUES and not node.this.quoted)


def _output_name(node: exp.Expr) -> str:
    if isinstance(node, exp.Alias):
        return _ident(node.args["alias"])
    inner = node
    while isinstance(inner, (exp.Cast, exp.Paren)):
        inner = inner.this
    if isinstance(inner, exp.Column) and isinstance(inner.this, exp.Identifier):
        return _ident(inner.this)
    if isinstance(inner, exp.Anonymous):
        return _ident(inner.this) if isinstance(inner.this, (exp.Identifier, str)) else "?column?"
    if isinstance(inner, exp.Case):
        return "case"
    if isinstance(inner, exp.Func):
        return _TYPED_NAMES.get(type(inner).__name__.lower()) or inner.sql_name().lower()
    return "?column?"


_CHECKED = (exp.Column, exp.Table, exp.Select, exp.SetOperation, exp.Subquery, exp.Values, exp.Star, exp.Func,
            exp.Join, exp.From, exp.With, exp.CTE, exp.Lateral, exp.Unnest, exp.Returning, exp.OnConflict)


def _statement_kind(root: exp.Expr) -> tuple[str, str | None]:
    if isinstance(root, _WRITES):
        return "write", _WRITE_OPS[type(root)]
    if isinstance(root, _QUERIES):
        return "read", None
    word = root.key.upper()
    if isinstance(root, exp.Command):
        word = str(root.this).upper()
    raise _not_allowed(f"statement kind {word} is not allowed")


# Keywords sqlglot tokenizes as plain words but keeps as structure, not as names.
_STRUCTURAL_WORDS = frozenset({"within", "nulls", "first", "last", "at", "time", "zone", "local", "conflict",
                               "nothing", "matched", "both", "leading", "trailing", "placing", "ties",
                               "ordinality", "escape", "symmetric", "asymmetric", "do", "no", "key", "of",
                               "unbounded", "preceding", "following", "current", "row", "rows", "range",
                               "groups", "exclude", "others"})


def _names_survive(tokens: Sequence[Token], root: exp.Expr) -> None:
    """Every name sqlglot's tokenizer saw (other than a function name) must be in the parse
    tree: a clause the parser dropped cannot take a table or column out of the analysis."""
    names: set[str] = set()
    for node in root.walk():
        if isinstance(node, exp.Identifier):
            names.add(str(node.this).lower())
        elif isinstance(node, exp.Var):
            names.add(str(node.this).lower())
        elif isinstance(node, exp.Anonymous) and isinstance(node.this, str):
            names.add(node.this.lower())
    for position, token in enumerate(tokens):
        if token.token_type.name not in ("VAR", "IDENTIFIER"):
            continue
        following = tokens[position + 1] if position + 1 < len(tokens) else None
        if following is not None and following.token_type.name == "L_PAREN":
            continue
        if token.text.lower() not in names and token.text.lower() not in _STRUCTURAL_WORDS:
            raise _failed(f"the parser dropped {token.text!r} from the statement")


def _forbidden_nodes(root: exp.Expr) -> None:
    for node in root.walk():
        if node is root:
            continue
        if isinstance(node, exp.Command):
            raise _failed(f"a part of the statement could not be parsed ({str(node.this).upper()})")
        if isinstance(node, exp.Into):
            raise _not_allowed("SELECT ... INTO creates a table and is not allowed")
        if isinstance(node, exp.Lock):
            raise _not_allowed("row locks (FOR UPDATE / FOR SHARE) are not allowed")
        if isinstance(node, _WRITES) and not isinstance(node.parent, exp.When):
            raise _not_allowed("data-modifying statements inside a statement (writable CTEs) are not allowed")
        if isinstance(node, (exp.Placeholder, exp.Hint)):
            raise _failed(f"unsupported {node.key.upper()} in the statement")


_STRING_TOKENS = frozenset(("STRING", "BYTE_STRING", "HEREDOC_STRING", "NATIONAL_STRING", "BIT_STRING",
                            "HEX_STRING", "RAW_STRING", "UNICODE_STRING"))
# Any character past ASCII counts as a letter (as PostgreSQL's lexer has it). Spelled as a negated
# ASCII class: the range \u0080-\U0010ffff is the same set, but compiling it cost every worker's
# boot 4.8 ms of CPU (0.2 ms this way).
_WORD_FULL = re.compile(r"(?:[A-Za-z_]|[^\x00-\x7f])(?:[A-Za-z0-9_$]|[^\x00-\x7f])*\Z")


def _sqlglot_words(tokens: Iterable[Token]) -> list[tuple[str, str]]:
    """The words (identifiers and keywords) of sqlglot's tokens, in the reader's form."""
    words = []
    for token in tokens:
        kind = token.token_type.name
        if kind in _STRING_TOKENS:
            continue
        if kind == "IDENTIFIER":
            words.append(("q", token.text))
            continue
        for part in token.text.split():
            if _WORD_FULL.match(part):
                words.append(("w", fold(part)))
    return words


def _read(sql: object) -> Statement:
    """PostgreSQL's reading of the statement (its parser, through ``gateway.sql``)."""
    if isinstance(sql, Statement):
        return sql
    if not isinstance(sql, str) or not sql.strip():
        raise bad_request("analysis_failed", "the statement is empty")
    if len(sql) > MAX_SQL:
        raise bad_request("analysis_failed", f"the statement is longer than {MAX_SQL} characters")
    if "\x00" in sql:
        raise bad_request("analysis_failed", "the statement contains a NUL character")
    try:
        return read_positional(sql.strip())
    except GatewayError as error:
        if error.code == "invalid_sql":   # analysed directly: every unreadable text is analysis_failed
            raise _failed(error.message) from None
        raise


def _readers_agree(statement: Statement, tokens: Sequence[Token]) -> None:
    """sqlglot's tokens must name the same words, in the same order, and put parameters at
    the same places as PostgreSQL's parser: nothing PostgreSQL runs can hide from the parse
    tree inside what sqlglot took for a string or a comment (or the other way round)."""
    if _sqlglot_words(tokens) != list(statement.words):
        raise _failed("the statement reads differently to the SQL analyser and to PostgreSQL "
                      "(quoting or comments it cannot follow)")
    params = tuple(t.start for t in tokens if t.token_type.name == "PARAMETER")
    if params != statement.params:
        raise _failed("the statement's parameters read differently to the SQL analyser and to PostgreSQL")


# --- operators, side effects and write operations, from PostgreSQL's parse tree ------------------
_BETWEEN_OPERATORS = ("<", "<=", ">", ">=")


def _operator_name(parts: Iterable[object] | None) -> str | None:
    names = [p["String"]["sval"] for p in parts or () if isinstance(p, dict) and "String" in p]
    return names[-1] if names else None


def _operator_symbols(tree: dict) -> set[str]:
    """Every operator the statement applies, as PostgreSQL's parser reads it: written ones
    (``a && b``, ``OPERATOR(public.&&)``, ``ORDER BY a USING <``) and the ones a construct
    stands for (``LIKE`` is ``~~``, ``IN``/``NULLIF``/``IS DISTINCT FROM``/``CASE x WHEN``/
    ``JOIN ... USING``/``NATURAL JOIN`` are ``=``, ``BETWEEN`` is ``<=``/``>=``...). A type's
    default comparison (GROUP BY, DISTINCT, ORDER BY, UNION) is not followed."""
    symbols: set[str] = set()
    for node in nodes(tree):
        expr = node.get("A_Expr")
        if isinstance(expr, dict):
            if "BETWEEN" in str(expr.get("kind", "")):
                symbols.update(_BETWEEN_OPERATORS)
            else:
                symbols.add(_operator_name(expr.get("name")) or "=")
        link = node.get("SubLink")
        if isinstance(link, dict) and link.get("subLinkType") in ("ANY_SUBLINK", "ALL_SUBLINK", "ROWCOMPARE_SUBLINK"):
            symbols.add(_operator_name(link.get("operName")) or "=")
        sort = node.get("SortBy")
        if isinstance(sort, dict) and sort.get("useOp"):
            symbols.add(_operator_name(sort["useOp"]) or "")
        case = node.get("CaseExpr")
        if isinstance(case, dict) and case.get("arg") is not None:
            symbols.add("=")
        join = node.get("JoinExpr")   # USING and NATURAL joins compare with "=", looked up by name
        if isinstance(join, dict) and (join.get("usingClause") or join.get("isNatural")):
            symbols.add("=")
    symbols.discard("")
    return symbols


def _relations_agree(tree: dict, tables: Iterable[tuple[str, str]]) -> None:
    """Every relation PostgreSQL's parse tree names (a ``RangeVar``) is one the analysis
    resolved and checked (or a CTE): a construct sqlglot reads otherwise can never take a
    relation, a catalog's above all, past the allow-lists."""
    resolved = set(tables)
    names = {name for _, name in resolved}
    ctes = {node["CommonTableExpr"].get("ctename") for node in nodes(tree) if "CommonTableExpr" in node}
    for node in nodes(tree):
        rel = node.get("RangeVar")
        if not isinstance(rel, dict):
            continue
        name, schema_name = rel.get("relname"), rel.get("schemaname")
        if rel.get("catalogname") is not None:
            raise _failed("a relation qualified with a database name")
        if schema_name is not None:
            if (schema_name, name) not in resolved:
                raise _failed(f"relation {schema_name}.{name} reads differently to the SQL analyser and to PostgreSQL")
        elif name not in names and name not in ctes:
            raise _failed(f"relation {name} reads differently to the SQL analyser and to PostgreSQL")


def _tree_write_ops(tree: dict) -> set[str]:
    """The write operations besides the statement's own: ``INSERT ... ON CONFLICT DO
    UPDATE`` updates; a ``MERGE`` does what its actions do."""
    ops: set[str] = set()
    insert = tree.get("InsertStmt") if isinstance(tree, dict) else None
    if isinstance(insert, dict):
        conflict = insert.get("onConflictClause") or {}
        if conflict.get("action") == "ONCONFLICT_UPDATE":
            ops.add("update")
    merge = tree.get("MergeStmt") if isinstance(tree, dict) else None
    if isinstance(merge, dict):
        commands = {"CMD_INSERT": "insert", "CMD_UPDATE": "update", "CMD_DELETE": "delete"}
        for clause in merge.get("mergeWhenClauses") or ():
            when = clause.get("MergeWhenClause", {}) if isinstance(clause, dict) else {}
            if when.get("commandType") in commands:
                ops.add(commands[when["commandType"]])
    return ops


def analyze(sql: str | Statement, schema: Schema | Mapping[str, Sequence[str]],
            search_path: Sequence[str] = ("public",),
            denied_functions: Iterable[str] = DEFAULT_DENIED, allowed_functions: Iterable[str] = (),
            allowed_catalog_relations: Iterable[str] = ()) -> Analysis:
    """Analyse one statement against ``schema`` (a :class:`Schema` or a mapping
    ``{"schema.table": (column, ...)}``): a :class:`gateway.sql.Statement` as the reader
    made it, or its positional text (``$1``). Raises ``GatewayError`` (400) when the
    statement is refused or cannot be analysed with certainty.

    ``allowed_catalog_relations``: the relations of ``pg_catalog``/``information_schema``,
    and those extensions own (``public.pg_stat_statements``), that the statement may read
    (``GATEWAY_ALLOW_CATALOG_RELATIONS``, schema-qualified); any other is refused
    (``catalog_not_allowed``), whatever the key."""
    statement = _read(sql)
    sql = statement.text
    schema = Schema.coerce(schema)
    denied = denied_matcher(denied_functions, allowed_functions)
    catalog_allowed = set()
    for name in allowed_catalog_relations:
        parts = split_qname(name.strip())
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"{name!r} is not a schema-qualified relation name")
        catalog_allowed.add(parts)
    dialect = Postgres()
    for word in sorted(statement.calls):
        if denied(word.rsplit(".", 1)[-1]):
            raise bad_request("function_not_allowed", f"function {word}() is not allowed")
    # An operator that is not built in is a call of the function behind it.
    operator_calls: set[str] = set()
    for symbol in sorted(_operator_symbols(statement.tree) & set(schema.operators)):
        for function in schema.operators[symbol]:
            if denied(function):
                raise bad_request("function_not_allowed", f"operator {symbol} calls function {function}(), "
                                                          "which is not allowed")
            operator_calls.add(function.lower())
    try:
        tokens = dialect.tokenize(sql)
    except Exception as error:  # sqlglot's TokenError and anything else it raises
        raise _failed(f"cannot read the statement: {str(error).splitlines()[0][:200]}") from None
    _readers_agree(statement, tokens)
    try:
        statements = [s for s in dialect.parser().parse(tokens, sql)
                      if s is not None and type(s).__name__ != "Semicolon"]
    except RecursionError:
        raise _failed("the statement is nested too deeply to analyse") from None
    except Exception as error:
        raise _failed(f"cannot parse the statement: {str(error).splitlines()[0][:200]}") from None
    if len(statements) != 1:   # PostgreSQL read exactly one (gateway.sql): the readers disagree
        raise _failed("the statement's end reads differently to the SQL analyser and to PostgreSQL")
    root = statements[0]
    if isinstance(root, exp.Command):   # sqlglot gave up on a statement that starts like a query
        raise _failed(f"cannot parse the statement ({str(root.this).upper()} ...)")
    kind, write_op = _statement_kind(root)
    if kind != statement.kind:
        raise _failed("the statement's kind reads differently to the SQL analyser and to PostgreSQL")
    analyzer = _Analyzer(schema, search_path, denied, frozenset(catalog_allowed))
    try:
        _forbidden_nodes(root)
        _names_survive(tokens, root)
        cols = analyzer.write(root) if kind == "write" else analyzer.query(root, None, {})
        for node in root.walk():
            if isinstance(node, _CHECKED) and id(node) not in analyzer.seen:
                raise _failed(f"a part of the statement was not analysed ({node.key.upper()})")
    except RecursionError:
        raise _failed("the statement is nested too deeply to analyse") from None
    _relations_agree(statement.tree, analyzer.tables)
    called = {f.rsplit(".", 1)[-1].lower() for f in analyzer.functions} | \
        {c.rsplit('.', 1)[-1] for c in statement.calls} | operator_calls
    user: tuple[str, ...] = ()
    if schema.functions is not None:
        user = tuple(sorted(f for f in schema.functions if f.lower() in called))
    side_effect = denied_matcher(SIDE_EFFECTS)
    side_effects = tuple(sorted(f for f in called if side_effect(f)))
    write_ops: tuple[str, ...] = ()
    if write_op is not None:
        extra = (analyzer.write_ops | _tree_write_ops(statement.tree)) - {write_op}
        write_ops = (write_op,) + tuple(sorted(extra))
    columns = tuple(_output_column(c) for c in cols)
    return Analysis(kind=kind, write_op=write_op,
                    tables=tuple(sorted(qname(*t) for t in analyzer.tables)),
                    columns=columns,
                    whole_row=tuple(sorted(qname(*w) for w in analyzer.whole_any)),
                    functions=tuple(sorted(analyzer.functions)),
                    views=tuple(sorted(qname(*v) for v in analyzer.views)),
                    user_functions=user,
                    referenced=tuple(sorted(qname(*s) for s in analyzer.referenced)),
                    write_sources=tuple(sorted(qname(*s) for s in analyzer.write_sources)),
                    side_effects=side_effects, write_ops=write_ops,
                    catalogs=tuple(sorted(qname(*c) for c in analyzer.catalogs)))
