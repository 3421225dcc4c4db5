"""A key's governance grants, compiled once, and the per-(key, query version) call plan.

``Grants.from_doc(doc)`` reads the QueryAPIGate-style fields of a key's grants:

* ``allowed_tables``: None (no restriction) or a list of relations the key may touch:
  ``schema.table``, ``schema.*``, or a bare ``table`` meaning ``public.table``. Names are
  exact (PostgreSQL's stored names; unquoted SQL folds to lower case). An empty list allows
  no relation. A view is a relation of its own: listing it allows reading it.
* ``mask``: a list of ``{"column": pattern, "action": action}``; the pattern is
  ``table.column`` (any schema) or ``schema.table.column`` with fnmatch wildcards
  (``*.email``, ``public.customers.*``), matched case-insensitively; the action is one of
  ``drop`` > ``null`` > ``hash`` > ``mask`` > ``keep`` (strictest first). A saved query may
  carry rules of the same shape; they apply to every caller.
* ``allow_writes`` (bool), ``allowed_write_ops`` (None or a list of insert / update /
  delete / merge), ``max_rows`` (int), ``query_timeout`` (seconds), ``allowed_ips`` (None
  or a list of addresses / CIDR ranges, IPv4 and IPv6).

``plan(analysis, grants, query_masks, hash_key=...)`` checks the analysis against the
grants (raising 403 ``table_not_allowed``, ``write_not_allowed``, ``write_op_not_allowed``,
``mask_unresolvable``, ``function_opaque``) and returns a :class:`CallPlan` whose
``apply(columns, rows)`` does the masking with precomputed index lists: no regex, no
fnmatch, no parsing per call.

What masking decides, per output column: the strictest action of every rule matching any of
its source columns (its lineage; reading a parent table reads its children, so a rule naming
a partition or an inheriting child applies there too). A ``hash`` or ``mask`` applies only to
a column that reaches the output as it is (renamed, through subqueries, CTEs and set
operations); of a value computed from it (``substr``, ``||``, a cast, an aggregate, a
constructor ...) it could be undone piece by piece, so that is refused (``mask_unresolvable``),
while ``null`` and ``drop`` apply to it. It is also refused rather than applied
when a masked column reaches the output through a whole-row reference (``row_to_json(t)``,
``to_jsonb(t.*)``, a bare ``t``), when a view is read and no rule names the view (lineage
stops at a view; name it, e.g. ``customer_view.*`` with ``keep``), or when a write would store
masked values. What masking does not hide: a masked column used in WHERE / JOIN / ORDER BY
still filters and orders (an oracle); ``Analysis.referenced`` lists those columns.
"""
from __future__ import annotations

import fnmatch
import hashlib
import hmac
import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import date, datetime, time
from decimal import Decimal
from operator import itemgetter
from typing import Any, overload

from ..errors import GatewayError, bad_request, forbidden
from .analysis import Analysis
from .schema import Kin, qname, split_qname

__all__ = ["ACTIONS", "MaskRule", "compile_masks", "Grants", "CallPlan", "plan"]

ACTIONS = ("drop", "null", "hash", "mask", "keep")   # strictest first
_RANK = {action: rank for rank, action in enumerate(ACTIONS)}
WRITE_OPS = ("insert", "update", "delete", "merge")
# A hash maps a value one to one and a partial mask shows part of it: of a value computed from
# a column (substr(email, k, 1)) either gives the column away piece by piece. Only null and
# drop hide whatever they are applied to.
_UNDOABLE = frozenset(("hash", "mask"))
_GRANT_FIELDS = ("allowed_tables", "mask", "allow_writes", "allowed_write_ops", "max_rows", "query_timeout",
                 "allowed_ips")


def _invalid(field: str, message: str) -> GatewayError:
    return bad_request("invalid_body", f"{field}: {message}", errors={field: message})


class MaskRule:
    __slots__ = ("pattern", "action", "schema", "table", "column", "literal_table", "table_text", "schema_text")

    def __init__(self, pattern: str, action: str) -> None:
        if not isinstance(pattern, str) or not pattern:
            raise _invalid("mask", "each rule's column must be a non-empty string")
        if action not in _RANK:
            raise _invalid("mask", f"action {action!r} must be one of {', '.join(ACTIONS)}")
        try:
            parts = split_qname(pattern)
        except ValueError:
            parts = ()
        if len(parts) not in (2, 3) or not all(parts):
            raise _invalid("mask", f"column {pattern!r} must be table.column or schema.table.column "
                                   "(wildcards allowed: *.email, public.customers.*)")
        self.pattern = pattern
        self.action = action
        schema_part = parts[0] if len(parts) == 3 else None
        table_part, column_part = parts[-2], parts[-1]
        self.schema = _compile(schema_part) if schema_part is not None else None
        self.table = _compile(table_part)
        self.column = _compile(column_part)
        self.literal_table = not any(ch in table_part for ch in "*?[")
        self.table_text = table_part.lower()
        self.schema_text = schema_part

    def matches(self, schema: str, table: str, column: str) -> bool:
        return (self.schema is None or bool(self.schema.match(schema))) and bool(self.table.match(table)) \
            and bool(self.column.match(column))

    def names_relation(self, schema: str, table: str) -> bool:
        """Whether this rule names the relation itself (no wildcard in its table part)."""
        return self.literal_table and self.table_text == table.lower() and \
            (self.schema is None or bool(self.schema.match(schema)))

    def to_doc(self) -> dict:
        return {"column": self.pattern, "action": self.action}


def _compile(part: str) -> re.Pattern[str]:
    return re.compile(fnmatch.translate(part), re.IGNORECASE | re.DOTALL)


def compile_masks(rules: Any) -> tuple[MaskRule, ...]:
    """Mask rules as stored (a list of ``{"column", "action"}``), compiled; None is none."""
    if rules is None:
        return ()
    if isinstance(rules, tuple) and all(isinstance(r, MaskRule) for r in rules):
        return rules
    if not isinstance(rules, list):
        raise _invalid("mask", 'must be a list of {"column": "table.column", "action": "hash|null|drop|mask|keep"}')
    out = []
    for rule in rules:
        if isinstance(rule, MaskRule):
            out.append(rule)
            continue
        if not isinstance(rule, Mapping) or set(rule) != {"column", "action"}:
            raise _invalid("mask", 'each rule is {"column": "table.column", "action": ...} and nothing else')
        out.append(MaskRule(rule["column"], rule["action"]))
    return tuple(out)


class _TableMatcher:
    __slots__ = ("exact", "patterns", "raw")

    def __init__(self, names: Any) -> None:
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise _invalid("allowed_tables", "must be a list of table names (schema.table, schema.*, table), or null")
        self.raw = list(names)
        self.exact: set[tuple[str, str]] = set()
        self.patterns: list[tuple[re.Pattern[str], re.Pattern[str]]] = []
        for name in names:
            try:
                parts = split_qname(name)
            except ValueError:
                raise _invalid("allowed_tables", f"{name!r} is not a table name") from None
            if len(parts) == 1:
                parts = ("public", parts[0])
            if len(parts) != 2 or not all(parts):
                raise _invalid("allowed_tables", f"{name!r} must be schema.table, schema.* or table")
            if any(ch in p for p in parts for ch in "*?["):
                self.patterns.append((re.compile(fnmatch.translate(parts[0]), re.DOTALL),
                                      re.compile(fnmatch.translate(parts[1]), re.DOTALL)))
            else:
                self.exact.add(parts)

    def allows(self, qualified: str) -> bool:
        try:
            parts = split_qname(qualified)
        except ValueError:
            return False
        if len(parts) != 2:
            return False
        if parts in self.exact:
            return True
        return any(s.match(parts[0]) and t.match(parts[1]) for s, t in self.patterns)


class Grants:
    """A key's governance grants, validated and compiled once (at catalog load)."""

    __slots__ = ("allowed_tables", "masks", "allow_writes", "allowed_write_ops", "max_rows", "query_timeout",
                 "allowed_ips", "_networks")

    def __init__(self, allowed_tables: _TableMatcher | None = None, masks: tuple[MaskRule, ...] = (),
                 allow_writes: bool = False, allowed_write_ops: frozenset[str] | None = None,
                 max_rows: int | None = None, query_timeout: float | None = None,
                 allowed_ips: list[str] | None = None) -> None:
        self.allowed_tables = allowed_tables        # _TableMatcher or None
        self.masks = masks                          # tuple[MaskRule, ...]
        self.allow_writes = allow_writes
        self.allowed_write_ops = allowed_write_ops  # frozenset or None
        self.max_rows = max_rows
        self.query_timeout = query_timeout          # seconds or None
        self.allowed_ips = allowed_ips              # list of strings or None
        self._networks = None if allowed_ips is None else \
            tuple(ipaddress.ip_network(v, strict=False) for v in allowed_ips)

    @classmethod
    def from_doc(cls, doc: Mapping | None) -> Grants:
        doc = doc or {}
        if not isinstance(doc, Mapping):
            raise _invalid("grants", "must be an object")
        tables = doc.get("allowed_tables")
        matcher = None if tables is None else _TableMatcher(tables)
        masks = compile_masks(doc.get("mask"))
        allow_writes = doc.get("allow_writes", False)
        if not isinstance(allow_writes, bool):
            raise _invalid("allow_writes", "must be true or false")
        ops = doc.get("allowed_write_ops")
        if ops is not None:
            if not isinstance(ops, list) or not all(isinstance(o, str) for o in ops) \
                    or not {o.lower() for o in ops} <= set(WRITE_OPS):
                raise _invalid("allowed_write_ops", f"must be a list of {', '.join(WRITE_OPS)}, or null")
            ops = frozenset(o.lower() for o in ops)
        max_rows = doc.get("max_rows")
        if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int)
                                     or not 1 <= max_rows <= 10_000_000):
            raise _invalid("max_rows", "must be a whole number from 1 to 10,000,000, or null")
        timeout = doc.get("query_timeout")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not 0.1 <= timeout <= 86400):
            raise _invalid("query_timeout", "must be a number of seconds from 0.1 to 86400, or null")
        ips = doc.get("allowed_ips")
        if ips is not None:
            if not isinstance(ips, list) or not all(isinstance(v, str) for v in ips):
                raise _invalid("allowed_ips", "must be a list of IP addresses or CIDR ranges, or null")
            for value in ips:
                try:
                    ipaddress.ip_network(value, strict=False)
                except ValueError:
                    raise _invalid("allowed_ips", f"{value!r} is not an IP address or CIDR range") from None
        return cls(matcher, masks, allow_writes, ops, max_rows, timeout, ips)

    def to_doc(self) -> dict:
        return {"allowed_tables": self.allowed_tables.raw if self.allowed_tables is not None else None,
                "mask": [m.to_doc() for m in self.masks] or None, "allow_writes": self.allow_writes,
                "allowed_write_ops": sorted(self.allowed_write_ops) if self.allowed_write_ops is not None else None,
                "max_rows": self.max_rows, "query_timeout": self.query_timeout, "allowed_ips": self.allowed_ips}

    def table_allowed(self, qualified: str) -> bool:
        return self.allowed_tables is None or self.allowed_tables.allows(qualified)

    def ip_allowed(self, client_ip: str) -> bool:
        """True with no ``allowed_ips``; otherwise the address must parse and fall in a range
        (an IPv4-mapped IPv6 address counts as its IPv4 address). Fails closed."""
        networks = self._networks
        if networks is None:
            return True
        if not client_ip:
            return False
        try:
            address = ipaddress.ip_address(client_ip.strip().split("%", 1)[0])
        except ValueError:
            return False
        mapped = getattr(address, "ipv4_mapped", None)
        if mapped is not None:
            address = mapped
        return any(address.version == net.version and address in net for net in networks)

    def check_ip(self, client_ip: str) -> None:
        if not self.ip_allowed(client_ip):
            raise forbidden("ip_not_allowed", "this key may not be used from this address")


# --- values -----------------------------------------------------------------------------------
def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float, Decimal)) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, bool):
        return "true" if value else "false"
    return None


def _hasher(key: bytes) -> Callable[[Any], str | None]:
    base = hmac.new(key, digestmod=hashlib.sha256)

    def digest(value):
        if value is None:
            return None
        if isinstance(value, (bytes, bytearray, memoryview)):
            data = bytes(value)
        else:
            text = _text(value)
            if text is None:
                text = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
            data = text.encode("utf-8")
        h = base.copy()
        h.update(data)
        return h.hexdigest()
    return digest


def mask_value(value: Any) -> str | None:
    """Text keeps its last 4 characters (``****1234``); 4 characters or fewer are hidden
    entirely; a value with no text form (JSON, bytes, arrays) becomes null."""
    if value is None:
        return None
    text = _text(value)
    if text is None:
        return None
    return "****" + text[-4:] if len(text) > 4 else "****"


# --- the plan -------------------------------------------------------------------------------
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
        digest = _hasher(hash_key) if hashes and hash_key else None
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


def _refuse(code: str, message: str) -> GatewayError:
    return forbidden(code, message)


def plan(analysis: Analysis, grants: Grants | None, query_masks: Any = None, *, hash_key: bytes | None = None,
         server_allows_writes: bool = True,
         kin: Kin | Mapping[tuple[str, str], Sequence[tuple[str, str]]] | None = None
         ) -> CallPlan:
    """Check ``analysis`` against ``grants`` (plus the saved query's own ``query_masks``)
    and compile what each call does. Raises 403 ``GatewayError`` on a refusal.

    ``kin``: the connection's inheritance and partition trees (and views) as they are now
    (``gateway.governance.schema.Kin``; a mapping of trees alone is taken too). The analysis
    knows the children a table had when the query was saved; a rule naming a partition
    attached since (or the parent of a table that joined a tree since) matches the column
    read through its kin as well; a table that is a view now is refused like a view."""
    if grants is None:
        grants = Grants()
    for table in analysis.tables:
        if not grants.table_allowed(table):
            raise _refuse("table_not_allowed", f"this key may not read or write {table}")
    if analysis.kind == "write":
        if not (server_allows_writes and grants.allow_writes):
            raise _refuse("write_not_allowed", "this query writes; the key or the server does not allow writes")
        if grants.allowed_write_ops is not None:
            # ON CONFLICT DO UPDATE also updates; a MERGE also does what its actions do.
            for op in analysis.write_ops or (analysis.write_op,):
                if op not in grants.allowed_write_ops:
                    raise _refuse("write_op_not_allowed", f"this key may not {op}" + (
                        "" if op == analysis.write_op else f" (this {analysis.write_op} also does {op})"))
    elif analysis.kind != "read":
        raise _refuse("write_not_allowed", f"unknown statement kind {analysis.kind!r}")
    elif analysis.side_effects:
        raise _refuse("write_not_allowed", f"this query calls {', '.join(f + '()' for f in analysis.side_effects)}, "
                      "which changes state outside the statement; it runs only as a write, for a key and a "
                      "server that allow writes")
    rules = tuple(grants.masks) + compile_masks(query_masks)
    restricted = bool(rules) or grants.allowed_tables is not None
    if restricted and analysis.user_functions:
        raise _refuse("function_opaque", "this query calls user-defined function(s) "
                      f"{', '.join(analysis.user_functions)}, whose reads cannot be checked against this "
                      "key's table or mask restrictions")
    if not rules:
        return CallPlan([None] * len(analysis.columns), hash_key, grants.max_rows, grants.query_timeout)
    views_now: frozenset = getattr(kin, "views", None) or frozenset()
    for table in analysis.tables if views_now else ():
        relation = _table_parts(table)
        if table not in analysis.views and relation in views_now \
                and not any(rule.names_relation(*relation) for rule in rules):
            raise _refuse("mask_unresolvable", f"{table} was a table when this query was saved and is a view now: "
                          "masks are not traced through views; save the query again (a rule must then name the "
                          "view)")
    for view in analysis.views:
        schema_name, table = _table_parts(view)
        if not any(rule.names_relation(schema_name, table) for rule in rules):
            raise _refuse("mask_unresolvable", f"this query reads view {view}; masks are not traced through "
                          f"views, so a mask rule must name the view itself (e.g. {table}.* with 'keep', "
                          f"or {table}.<column> with an action)")
    cache: dict[str, tuple[str, str] | None] = {}

    def decide(source: str) -> tuple[str, str] | None:
        if source not in cache:
            parts = split_qname(source)
            tables = [(parts[0], parts[1])]
            if kin:
                tables.extend(kin.get(tables[0], ()))
            best = None
            for rule in rules:
                if any(rule.matches(s, t, parts[-1]) for s, t in tables) \
                        and (best is None or _RANK[rule.action] < _RANK[best[0]]):
                    best = (rule.action, rule.pattern)
            cache[source] = best
        return cache[source]

    for source in analysis.write_sources:
        got = decide(source)
        if got is not None and got[0] != "keep":
            raise _refuse("mask_unresolvable", f"this write would store values of masked column {source}")
    actions: list[str | None] = []
    fired = []
    for position, column in enumerate(analysis.columns):
        best = None
        computed = None   # a masked source this column is computed from, not the value itself
        for source in sorted(column.sources):
            got = decide(source)
            if got is not None and (best is None or _RANK[got[0]] < _RANK[best[0]]):
                best = (got[0], got[1], source)
            if got is not None and got[0] != "keep" and column.whole_row:
                parts = split_qname(source)
                if qname(parts[0], parts[1]) in column.whole_row:
                    raise _refuse("mask_unresolvable", f"output column {column.name!r} holds whole rows of a "
                                  f"table with masked column {source}; name the columns instead")
            if got is not None and got[0] != "keep" and computed is None and source in column.derived:
                computed = source
        action = None if best is None or best[0] == "keep" else best[0]
        if computed is not None and action in _UNDOABLE:
            raise _refuse("mask_unresolvable", f"output column {column.name!r} is computed from masked column "
                          f"{computed}, and a {action} of a computed value (substr, ||, a cast, an aggregate ...) "
                          f"can be undone piece by piece: select {split_qname(computed)[-1]} as it is (it is "
                          f"then masked), or mask it with null or drop")
        actions.append(action)
        if action is not None and best is not None:   # an action comes from a best rule
            fired.append({"position": position, "column": column.name, "action": action,
                          "source": best[2], "rule": best[1]})
    # Masks follow names: the result's columns are checked against these on every call.
    names = [c.name if c.exact_name else None for c in analysis.columns]
    return CallPlan(actions, hash_key, grants.max_rows, grants.query_timeout, fired, names)


def _table_parts(qualified: str) -> tuple[str, str]:
    parts = split_qname(qualified)
    return parts[0], parts[1]
