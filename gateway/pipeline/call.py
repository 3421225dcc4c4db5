"""A call: named stages, in the order ``Pipeline.run`` runs them, so that a rule is enforced
in exactly one place.

    admit     the client IP's rate limit                                     (ports.Admission)
    identify  X-API-Key -> the key's record in the worker's catalog          (identify.py)
    plan      what runs (the entry point's ``resolve``: a ``Target``) and the key's plan for
              it under the connection's schema trees, memoised with the catalog      (plans.py)
    admit     the key: one of its max_concurrent places (held until the call ends), its rate
              limits and quotas; after plan (a call its plan refuses is not charged), or before
              it for an entry point whose plan costs CPU the caller chooses (``admit_before_plan``)
    bind      the reserved arguments and typed values for the statement's parameters (the entry point)
    schedule  the deadline, counted from the request's arrival (a call that waited past it gets
              no late answer, cached or not), the session pool, the claim on the connection's
              bulkhead                                                        (execution/)
    cache     a saved read with a ``cache_ttl``: this worker's cache, no I/O on a hit (cached.py)
    execute   one round trip on a pooled session (the entry point's ``page``), or a stream (stream.py)
    shape     masks, format, paging headers, or a metered stream              (shape.py)
    record    the limits' headers; rows settled on the quota; one append to the history (record.py)

The stages fill in one typed record of the call (``Call``), each its own fields, read by the
stages after it; the end of the call reads it whatever happened: who called, whether the key
was charged, the place to give back, the version to record.

An entry point (``saved.SavedCall``, ``adhoc.AdHocCall``) supplies only what differs:
``resolve(catalog, key)`` (what runs, checking its grants), ``call_args()``, ``bind()``,
``page()`` and ``stream_text()``, and the ``name`` recorded in the history. A call answered from
the cache is learned (``Learner``): the server's loop may answer it again from memory, by the
same stages' functions (``from_memory.py``).
"""
from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from ..execution import runner
from ..execution.bulkhead import Claim
from ..execution.deadline import Deadline
from ..ports import NO_HEADERS
from .args import CallArgs, lower_timeout
from .cached import purge_summary, send_cached
from .identify import admin_identity, identify
from .plans import Subject, kin_of, plan_for, reading
from .record import Recorder
from .shape import send_page
from .stream import release_after, send_streamed

if TYPE_CHECKING:
    import falcon

    from ..cache import Entry, ResponseCache
    from ..execution.pool import SessionPool
    from ..governance import CallPlan
    from ..governance.schema import Kin
    from ..governance.schema_cache import SchemaCache
    from ..model.catalog import ApiKey, Catalog, Connection, QueryVersion
    from ..model.state import CatalogHolder
    from ..ports import Admission, Headers
    from ..settings import Settings
    from ..store.history import HistoryWriter
    from .cached import View
    from .identify import AdminIdentity

# What an entry point runs: a saved query's version, or an ad-hoc statement (``plans.Subject``).
S = TypeVar("S", bound=Subject)
# The values its bind() makes of the call's parameters (a tuple, a list), handed back to its page().
V = TypeVar("V", bound=Sequence)


class Target(Generic[S]):
    """What runs, as the entry point's ``resolve`` found it (its grants checked)."""

    __slots__ = ("subject", "connection", "version", "cacheable")

    def __init__(self, subject: S, connection: Connection, version: int | None,
                 cacheable: QueryVersion | None = None) -> None:
        self.subject = subject
        self.connection = connection
        self.version = version         # recorded in the history (an ad-hoc statement has none)
        self.cacheable = cacheable     # the version the response cache answers (a saved read with a cache_ttl)


class Call(Generic[S, V]):
    """The record of one call: what its request brought, then what each stage decided, in the
    order they run. The end of the call reads ``key``, ``admitted``, ``place`` and ``version``
    whatever happened; every other field is set by its stage before a later one reads it."""

    __slots__ = ("name", "request_id", "ip", "if_none_match", "replay", "safe", "arrived", "started", "limits",
                 "key", "admitted", "place", "catalog", "target", "version", "kin", "plan", "args", "values", "size",
                 "pool", "claim")
    catalog: Catalog          # identify: the snapshot the call is identified and planned under
    target: Target[S]         # plan
    kin: Kin | None           # plan: the connection's inheritance and partition trees the plan was made under
    plan: CallPlan            # plan
    args: CallArgs            # bind: the reserved arguments (format, paging, timeout, stream, cache)
    values: V                 # bind: the statement's parameters, typed and checked
    size: int                 # bind: the page's size, the one asked but at most the plan's max_rows
    pool: SessionPool         # schedule: the connection's sessions for the statement's access mode
    claim: Claim              # schedule: the call's place on the connection's bulkhead, under its deadline

    def __init__(self, name: str, request_id: str, ip: str, if_none_match: str | None, replay: tuple | None,
                 safe: bool, arrived: float | None) -> None:
        self.started = time.perf_counter()
        self.name = name
        self.request_id = request_id
        self.ip = ip
        self.if_none_match = if_none_match
        self.replay = replay            # the request as from_memory names it, when the server may ask again
        self.safe = safe                # a GET (If-None-Match answers it 304), not a POST (412)
        self.arrived = time.monotonic() if arrived is None else arrived
        self.limits: Headers = NO_HEADERS   # admit: the rate limits' and quotas' headers, for the answer
        self.key: ApiKey | None = None      # identify
        self.admitted = False   # admit: the key's quota was charged, whatever happens next
        # admit: one of the key's max_concurrent places, given back at the end (or by a stream, when it ends)
        self.place: tuple[ApiKey, object] | None = None
        self.version: int | None = None     # plan: the version that runs, for the history


class EntryPoint(Protocol[S, V]):
    """What an entry point supplies (``saved.SavedCall``, ``adhoc.AdHocCall``); the subject of
    the ``Target`` its ``resolve`` returns, and the values its ``bind`` makes, are handed back
    to its own ``page`` and ``stream_text``."""

    name: str
    admit_before_plan: bool   # whether resolve() costs CPU the caller chooses (see Pipeline.run)

    def resolve(self, catalog: Catalog, key: ApiKey) -> Target[S]: ...

    def call_args(self) -> CallArgs: ...

    def bind(self, subject: S) -> V: ...

    def page(self, pool: SessionPool, subject: S, bound: V, size: int, page: int,
             timeout_ms: int | None) -> runner.Result: ...

    def stream_text(self, subject: S, bound: V) -> str: ...


class Learner(Protocol):
    """What learns the calls answered from the cache, for the server's loop (``from_memory.FromMemory``)."""

    def learn(self, request: tuple, call: Call, key: ApiKey, entry: Entry, view: View, status: int) -> None: ...


class Pipeline:
    __slots__ = ("_holder", "_pools", "_settings", "_admission", "_mask_key", "_cache", "_admin", "_schemas",
                 "_learner", "_recorder")

    def __init__(self, holder: CatalogHolder, pools: runner.Pools, history: HistoryWriter, settings: Settings,
                 admission: Admission, cache: ResponseCache | None = None, schemas: SchemaCache | None = None,
                 learner: Learner | None = None, admin: AdminIdentity | None = None) -> None:
        self._holder = holder
        self._pools = pools
        self._settings = settings
        self._admission = admission
        self._mask_key = settings.mask_key_bytes()
        self._cache = cache
        # The connections' inheritance and partition trees as they are now, for the plans.
        self._schemas = schemas
        self._learner = learner
        # The admin key runs everything on the data plane too (as QueryAPIGate's); none: nobody does.
        self._admin = admin if admin is not None else admin_identity(settings)
        self._recorder = Recorder(history, admission)

    def run(self, resp: falcon.Response, entry: EntryPoint[S, V], *, request_id: str, ip: str, secret: str | None,
            if_none_match: str | None = None, request: tuple | None = None, safe: bool = True,
            arrived: float | None = None) -> None:
        """``request``: the call as ``FromMemory.request`` names it, when the server may ask for
        it again (a plain GET): an answer from the cache is learned under it. ``safe``: a GET
        (``If-None-Match`` answers it 304), not a POST (412). ``arrived``: ``time.monotonic()``
        when the request arrived (``gateway.http.common.arrived``; None: now), from which the
        call's timeout counts."""
        call: Call[S, V] = Call(entry.name, request_id, ip, if_none_match, request, safe, arrived)
        try:
            call.limits = self._admission.admit_ip(ip)                        # admit (the client)
            catalog = call.catalog = self._holder.current()
            key = call.key = identify(secret, catalog, self._admin, ip=ip)    # identify
            if entry.admit_before_plan:   # its plan costs CPU the caller chooses: the key's limits bound it
                self._admit(call, key)                                        # admit (the key)
            self._plan(call, entry, catalog, key)                             # plan
            if not entry.admit_before_plan:   # after the plan: a call its plan refuses is not charged
                self._admit(call, key)                                        # admit (the key)
            self._bind(call, entry)                                           # bind
            self._schedule(call)                                              # schedule
            status, rows = self._answer(resp, call, entry, key)               # cache, execute, shape
            for header, value in call.limits:                                 # record
                resp.set_header(header, value)
            self._recorder.answered(call.request_id, call.started, key, call.name, call.version, status, rows)
        except Exception as exc:
            self._recorder.refused(call.request_id, call.started, call.key, call.name, call.version, exc,
                                   call.admitted)
            raise
        finally:
            if call.place is not None:
                self._admission.leave(*call.place)

    def _admit(self, call: Call, key: ApiKey) -> None:
        """admit (the key): one of its max_concurrent places first (a refusal there is not
        charged), then its rate limits and quotas."""
        admission = self._admission
        place = admission.enter(key) if key.max_concurrent is not None else None   # calls running
        try:
            call.limits = call.limits + admission.admit_key(key)
        except BaseException:
            if place is not None:
                admission.leave(key, place)
            raise
        if place is not None:
            call.place = (key, place)
        call.admitted = True

    def _plan(self, call: Call[S, V], entry: EntryPoint[S, V], catalog: Catalog, key: ApiKey) -> None:
        """plan: what runs, its grants checked by the entry point, and the key's plan for it
        under the connection's schema trees as they are now."""
        target = call.target = entry.resolve(catalog, key)
        call.version = target.version
        kin = call.kin = kin_of(self._schemas, target.connection)
        call.plan = plan_for(catalog, key, target.subject, self._settings, self._mask_key, kin)

    @staticmethod
    def _bind(call: Call[S, V], entry: EntryPoint[S, V]) -> None:
        args = call.args = entry.call_args()
        call.values = entry.bind(call.target.subject)
        max_rows = call.plan.max_rows
        call.size = args.page_size if max_rows is None else min(args.page_size, max_rows)

    def _schedule(self, call: Call) -> None:
        target, settings = call.target, self._settings
        call.pool = self._pools.get(target.connection, target.subject.kind == "write")
        deadline = Deadline(call.arrived, lower_timeout(call.args.timeout_ms, call.plan.query_timeout,
                                                        settings.statement_timeout_ms), settings.statement_timeout_ms)
        deadline.check()   # waited past its timeout already (for a thread): no late answer, cached or not
        call.claim = Claim(self._pools.bulkheads.get(target.connection), deadline)

    def _answer(self, resp: falcon.Response, call: Call[S, V], entry: EntryPoint[S, V],
                key: ApiKey) -> tuple[int, int | None]:
        """cache or execute, then shape: (the status, the rows sent; None for a stream's)."""
        if call.args.stream:
            self._stream(resp, call, entry, key)
            return 200, None
        qv, cache = call.target.cacheable, self._cache
        if qv is not None and cache is not None:
            return self._cached(resp, call, entry, key, cache, qv)
        return 200, self._execute(resp, call, entry)

    def _cached(self, resp: falcon.Response, call: Call[S, V], entry: EntryPoint[S, V], key: ApiKey,
                cache: ResponseCache, qv: QueryVersion) -> tuple[int, int]:
        """cache, shape: this call's entry (a miss executes the page once per entry in the worker),
        sent with this key's plan; learned for the server's loop unless it bypassed the cache."""
        args = call.args

        def compute() -> runner.Result:   # a miss
            return _page(call, entry)
        # Keyed by what the columns are under the schema the plan was made under too: the cached
        # rows and this call's masks agree on every column.
        held, state = cache.answer(qv, call.values, args.page, call.size, compute, not args.cache, args.store,
                                   reading(qv, self._settings, call.kin), args.max_age, claim=call.claim)
        view, status = send_cached(resp, args, call.size, call.plan, held, state, call.if_none_match, safe=call.safe)
        if call.replay is not None and state != "bypass" and self._learner is not None:
            self._learner.learn(call.replay, call, key, held, view, status)
        return status, view.rows if status == 200 else 0

    def _execute(self, resp: falcon.Response, call: Call[S, V], entry: EntryPoint[S, V]) -> int:
        """execute, shape: one round trip under the connection's bulkhead; a write purges the
        cached answers of what it touched, on every worker, before it is answered."""
        with call.claim:
            result = _page(call, entry)
        target = call.target
        write = target.subject.kind == "write"
        rows = send_page(resp, call.args, call.size, call.plan, result, write)
        if write and self._cache is not None:   # before the write is answered (see gateway.cache)
            # The catalog now, not the call's: a cached query published while the write ran may
            # have cached what it read before the write committed.
            purged = self._cache.written(self._holder.catalog, target.connection, target.subject.analysis, call.kin)
            if purged is not None:
                resp.set_header("X-Cache-Invalidated", purge_summary(purged))
        return rows

    def _stream(self, resp: falcon.Response, call: Call[S, V], entry: EntryPoint[S, V], key: ApiKey) -> None:
        """execute, shape (a stream): it holds the key's max_concurrent place until its last row
        (or the client leaves), as it holds its session and its place on the connection."""
        admission = self._admission
        send_streamed(resp, entry.stream_text(call.target.subject, call.values), call.args, call.plan, call.pool,
                      call.claim, self._settings.stream_fetch_rows, functools.partial(admission.take_rows, key),
                      call.request_id)
        if call.place is not None:
            release_after(resp, functools.partial(admission.leave, *call.place))
            call.place = None


def _page(call: Call[S, V], entry: EntryPoint[S, V]) -> runner.Result:
    """execute: one page, one round trip on a pooled session, under what is left of the
    deadline when it starts."""
    return entry.page(call.pool, call.target.subject, call.values, call.size, call.args.page,
                      call.claim.deadline.statement_ms())
