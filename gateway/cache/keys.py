"""What makes a cached answer unique, and what it read.

The digest covers the query version as the catalog serves it (its store id and number,
so a new version, a re-created query or a version moved to another connection is another
entry), the connection's identity (a change of host, database or login is another entry),
the resolved parameter values (typed, defaults applied), the page and the page size the
call ran with (the key's ``max_rows`` lowers it), and what the version's columns are under
the schema the worker last read of the connection (``gateway.pipeline.plans.reading``): each
call masks the rows with a plan made under that schema, and a plan of another schema may see
another table behind a column of the same name. The format is not in it: an entry holds
rows, and each call renders them in its own format (and masks them with its own plan).
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..governance.schema import qname, split_qname

if TYPE_CHECKING:
    from ..governance import Analysis
    from ..governance.schema import Kin
    from ..model.catalog import Connection, QueryVersion


# Per version: its connection's identity and a hash that has already taken in the part of the
# digest that is the same on every call (the version and its connection), so a call hashes only
# its own values. Held by the version object itself (no id() that a new object could reuse);
# emptied past _HELD versions (old catalog snapshots' versions are not kept alive for long).
_prefixes: dict[QueryVersion, tuple[tuple, Any]] = {}
_HELD = 4096


def digest(qv: QueryVersion, bound: Sequence, page: int, size: int, reading: str | None = None) -> str:
    """The blake2b-128 of ``repr((statement, connection identity, bound, page, size, reading))``, in hex."""
    identity = qv.connection.identity
    held = _prefixes.get(qv)
    if held is None or held[0] is not identity:
        if len(_prefixes) >= _HELD:
            _prefixes.clear()
        prefix = hashlib.blake2b(f"({qv.statement!r}, {identity!r}, ".encode(), digest_size=16)
        held = _prefixes[qv] = (identity, prefix)
    hasher = held[1].copy()
    hasher.update(f"{bound!r}, {page!r}, {size!r}, {reading!r})".encode())
    return hasher.hexdigest()


def database(connection: Connection) -> str:
    """The scope a write through ``connection`` invalidates: the name of the data database it
    reaches. Two connections to one database (other logins) share its tables, so a write
    through one invalidates what the other read. Not the host nor the port: their text does not
    tell whether two connections reach one server (localhost and 127.0.0.1, a DNS alias, a
    pooler on another port). Two servers with a database of one name share the scope: a false
    match costs a refill, a missed one would serve the older answer."""
    return connection.database


def reads(qv: QueryVersion) -> tuple[frozenset[str], bool]:
    """(the relations the version reads, whether any write to its database may change its
    answer: it reads a view or calls a user-defined function, whose tables the analysis does
    not see through)."""
    analysis = qv.analysis
    if analysis is None:
        return frozenset(), True
    return frozenset(analysis.tables), bool(analysis.views or analysis.user_functions)


def written(analysis: Analysis, kin: Kin | None) -> frozenset[str] | None:
    """The relations whose rows a write may change, named as a read of them is: each table it
    touches and, through its connection's schema as the worker last read it (``kin``), every
    ancestor (a partition's or a child's rows are its parent's: a read of the parent sees them)
    and every descendant (a write through a parent reaches the partitions a read may name
    directly) of each, and the tables foreign keys' actions reach from them (``ON DELETE
    CASCADE``...), and theirs in turn. None when the schema is not known yet, or is older than a
    table the write names, or when one of them has a trigger or a rule: any table may be."""
    if kin is None:
        return None
    known = None if kin.schema is None else kin.schema.relations
    if known is not None and any(tuple(split_qname(name)) not in known for name in analysis.tables):
        return None    # made since the worker read the schema (a partition): it cannot say whose rows they are
    touched: set[tuple[str, str]] = set()
    followed: set[tuple[str, str]] = set()    # the tables whose trees and foreign keys were followed
    todo = [(parts[0], parts[1]) for parts in map(split_qname, analysis.tables) if len(parts) == 2]
    while todo:
        table = todo.pop()
        if table in followed:
            continue
        followed.add(table)
        kindred = kin.get(table)
        touched.add(table)
        touched.update(kindred)
        for one in (table, *kindred):
            todo.extend(kin.cascades.get(one, ()))
    if not kin.triggered.isdisjoint(touched):
        return None    # a trigger or a rule fires: it may write any table
    return frozenset(analysis.tables) | frozenset(qname(*t) for t in touched)


def views_now(relations: frozenset[str], kin: Kin) -> bool:
    """Whether any of ``relations`` is a view in the schema as the worker last read it: a table
    a version was saved reading (or a write was saved naming) may have been replaced by a view
    since, which reads other tables than the stored analysis says."""
    views = kin.views
    return bool(views) and any(tuple(split_qname(name)) in views for name in relations)
