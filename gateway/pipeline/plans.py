"""Stage plan: what a key gets from a statement (``gateway.governance.plan``), computed
on first use and kept in the catalog's memo, a refusal too; so governance costs one dict
lookup per call. The memo belongs to the catalog snapshots: one per key, which the next
snapshot keeps unless the change was to that key (a saved version never changes), so grants
and plans never disagree."""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from .. import governance
from ..errors import GatewayError, bad_request
from ..governance.policy import analyze_under, refused_now
from ..governance.schema import split_qname

if TYPE_CHECKING:
    from ..governance.schema import Kin
    from ..governance.schema_cache import SchemaCache
    from ..model.catalog import ApiKey, Catalog, Connection, QueryVersion
    from ..settings import Settings

# A refusal kept in a memo: (status, code, message, extra, headers) of the GatewayError raised
# anew each time (one exception raised twice would grow its traceback).
Refusal = tuple[int, str, str, dict | None, dict | None]


class Subject(Protocol):
    """What a plan is made from: a saved query's version (``model.catalog.QueryVersion``) or an
    ad-hoc statement (``adhoc.AdHocStatement``)."""

    @property
    def plan_id(self) -> str: ...       # what the key's plan is memoised by

    @property
    def kind(self) -> str: ...          # "read" or "write"

    @property
    def analysis(self) -> governance.Analysis | None: ...

    @property
    def masks(self) -> Any: ...         # the query's own masks (an ad-hoc statement has none)


def kin_of(schemas: SchemaCache | None, connection: Connection) -> Kin | None:
    """The connection's inheritance and partition trees a plan is made under, as the worker
    last read them (``SchemaCache.kin``: the same object while they are unchanged); None
    without a schema cache, or before its first read."""
    return None if schemas is None else schemas.kin(connection)


def plan_for(catalog: Catalog, key: ApiKey, subject: Subject, settings: Settings, mask_key: bytes,
             kin: Kin | None = None) -> governance.CallPlan:
    """``subject``: a saved query version or an ad-hoc statement (``plan_id``, ``analysis``,
    ``masks``). ``kin``: the connection's inheritance and partition trees as the worker last
    read them (``SchemaCache.kin``); a plan made with other trees is made again (one identity
    test: the cache keeps the same object while the trees are unchanged)."""
    memo: dict[str, tuple[Kin | None, governance.CallPlan | Refusal]] | None = catalog.plans.get(key.id)
    if memo is None:
        memo = catalog.plans.setdefault(key.id, {})
    held = memo.get(subject.plan_id)
    if held is None or held[0] is not kin:
        held = memo[subject.plan_id] = (kin, _planned(key, subject, settings, mask_key, kin))
    got = held[1]
    if isinstance(got, tuple):
        raise raised(got)
    return got


def _planned(key: ApiKey, subject: Subject, settings: Settings, mask_key: bytes,
             kin: Kin | None) -> governance.CallPlan | Refusal:
    """The key's plan for ``subject``, or the refusal to keep."""
    try:
        analysis = _analysis(subject, settings, kin)
        # Saved under another gateway's settings, perhaps: planned under this one's.
        refused_now(analysis, settings)
        grants = key.governance
        if key.query_governance is not None:   # a per-query write grant (the memo is per statement)
            grants = key.query_governance.get(getattr(subject, "name", ""), grants)
        return governance.plan(analysis, grants, subject.masks, hash_key=mask_key,
                               server_allows_writes=settings.allow_writes, kin=kin)
    except GatewayError as exc:
        return kept(exc)


def kept(exc: GatewayError) -> Refusal:
    return (exc.status, exc.code, exc.message, exc.extra, exc.headers)


def raised(refusal: Refusal) -> GatewayError:
    return GatewayError(refusal[0], refusal[1], refusal[2], extra=refusal[3], headers=refusal[4])


def reading(subject: QueryVersion, settings: Settings, kin: Kin | None) -> str | None:
    """What a saved version's result is under the schema ``kin`` (None without one): a digest
    of the analysis its plans are made from (each output column's sources) and of the trees and
    views of the tables it reads, kept on ``kin`` per version and the same on every worker that
    read that schema. A cached answer is keyed by it (``gateway.cache.keys``): its rows were
    read under one reading, and a plan made under another takes some column for another one (a
    column added to an inner table took an unqualified name from an outer one; a partition was
    detached). A change elsewhere in the schema leaves it as it was. Called once ``plan_for``
    has planned the version under ``kin``."""
    if kin is None:
        return None
    got = kin.readings.get(subject.plan_id)
    if got is None:
        analysis = _analysis(subject, settings, kin)
        tables = {table: kin.get(_pair(table)) for table in analysis.tables}
        views = sorted(t for t in analysis.tables if split_qname(t) in kin.views)
        doc = orjson.dumps([analysis.to_doc(), tables, views], option=orjson.OPT_SORT_KEYS)
        got = kin.readings[subject.plan_id] = hashlib.blake2b(doc, digest_size=16).hexdigest()
    return got


def _pair(table: str) -> tuple[str, str]:
    """A table's (schema, name), as ``Kin`` knows it; a name of another shape is in no tree."""
    parts = split_qname(table)
    return (parts[0], parts[1]) if len(parts) == 2 else ("", table)


def _analysis(subject: Subject, settings: Settings, kin: Kin | None) -> governance.Analysis:
    """The analysis a plan is made from: the stored one, or a saved version's statement
    analysed again under ``kin``."""
    analysis = subject.analysis
    if analysis is None:
        raise bad_request("analysis_failed", "this version was saved by an older release or without an "
                          "analysis; save it again")
    positional = getattr(subject, "positional", None)   # a saved version (ad hoc: analysed on this copy)
    # Analysed again only on a copy read after the version was saved: an older copy (this
    # worker's, while another saved the version against a table made a moment before)
    # knows less than the stored analysis did.
    if kin is not None and kin.schema is not None and positional \
            and kin.read_at >= getattr(subject, "saved_at", 0.0):
        analysis = _analysis_now(subject.plan_id, positional, kin, kin.schema, settings)
    return analysis


def _analysis_now(plan_id: str, positional: str, kin: Kin, schema: governance.Schema,
                  settings: Settings) -> governance.Analysis:
    """A saved version's statement analysed again against the schema as the worker last read
    it, once per version while that schema is unchanged (kept on ``kin``): the stored analysis
    knows the schema of the save, and PostgreSQL resolves names against today's (a column
    added to an inner table takes an unqualified name from an outer one; a table became a
    view). A statement that no longer analyses is refused as at save time."""
    got = kin.analyses.get(plan_id)
    if got is None:
        try:
            got = analyze_under(positional, schema, settings)
        except GatewayError as exc:
            got = kept(exc)
        kin.analyses[plan_id] = got
    if isinstance(got, governance.Analysis):
        return got
    assert type(got) is tuple   # the only other thing kept there: a refusal
    raise raised(got)
