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

Each stage takes typed values and returns one (``Target``, ``Planned``, ``Bound``,
``Scheduled``); the ``Call`` record holds what the end of the call reads whatever happened: who
called, whether the key was charged, the place to give back, the version to record.

An entry point (``saved.SavedCall``, ``adhoc.AdHocCall``) supplies only what differs:
``resolve(catalog, key)`` (what runs, checking its grants), ``call_args()``, ``bind()``,
``page()`` and ``stream_text()``, and the ``name`` recorded in the history. A call answered from
the cache is learned (``Learner``): the server's loop may answer it again from memory, by the
same stages' functions (``from_memory.py``).
"""
from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Generic, NamedTuple, Protocol, TypeVar

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


class Planned(Generic[S]):
    """What the key gets from the target under this catalog snapshot and these schema trees."""

    __slots__ = ("catalog", "key", "target", "kin", "plan")

    def __init__(self, catalog: Catalog, key: ApiKey, target: Target[S], kin: Kin | None, plan: CallPlan) -> None:
        self.catalog = catalog
        self.key = key
        self.target = target
        self.kin = kin      # the connection's inheritance and partition trees the plan was made under
        self.plan = plan


class Bound(NamedTuple, Generic[S, V]):
    planned: Planned[S]
    args: CallArgs        # the reserved arguments (format, paging, timeout, stream, cache)
    values: V             # the statement's parameters, typed and checked
    size: int             # the page's size: the one asked, at most the plan's max_rows


class Scheduled(NamedTuple, Generic[S, V]):
    bound: Bound[S, V]
    pool: SessionPool     # the connection's sessions for the statement's access mode
    claim: Claim          # the call's place on the connection's bulkhead, under its deadline


class Call:
    """The record of one call: what its request brought, and what each stage decided that the
    end of the call reads, answered or refused."""

    __slots__ = ("name", "request_id", "ip", "if_none_match", "replay", "safe", "arrived", "started", "limits",
                 "key", "version", "admitted", "place")

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
        self.limits: Headers = NO_HEADERS   # the rate limits' and quotas' headers, for the answer
        self.key: ApiKey | None = None      # identify
        self.version: int | None = None     # plan: the version that runs, for the history
        self.admitted = False   # past admission: the key's quota was charged, whatever happens next
        # One of the key's max_concurrent places, given back at the end (or by a stream, when it ends).
        self.place: tuple[ApiKey, object] | None = None


class EntryPoint(Protocol[S, V]):
    """What an entry point supplies (``saved.SavedCall``, ``adhoc.AdHocCall``); the subject of
    the ``Target`` its ``resolve`` returns is handed back to its own ``bind``, ``page`` and
    ``stream_text``."""

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

    def learn(self, request: tuple, call: Call, planned: Planned, entry: Entry, view: View, status: int) -> None: ...


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
        call = Call(entry.name, request_id, ip, if_none_match, request, safe, arrived)
        try:
            call.limits = self._admission.admit_ip(ip)                        # admit (the client)
            catalog = self._holder.current()
            key = call.key = identify(secret, catalog, self._admin, ip=ip)    # identify
            if entry.admit_before_plan:   # its plan costs CPU the caller chooses: the key's limits bound it
                self._admit(call, key)                                        # admit (the key)
            planned = self._plan(call, entry, catalog, key)                   # plan
            if not entry.admit_before_plan:   # after the plan: a call its plan refuses is not charged
                self._admit(call, key)                                        # admit (the key)
            bound = self._bind(entry, planned)                                # bind
            scheduled = self._schedule(call, bound)                           # schedule
            status, rows = self._answer(resp, call, entry, scheduled)         # cache, execute, shape
            self._record(resp, call, key, status, rows)                       # record
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

    def _plan(self, call: Call, entry: EntryPoint[S, V], catalog: Catalog, key: ApiKey) -> Planned[S]:
        target = entry.resolve(catalog, key)
        call.version = target.version
        kin = kin_of(self._schemas, target.connection)
        return Planned(catalog, key, target, kin, plan_for(catalog, key, target.subject, self._settings,
                                                           self._mask_key, kin))

    @staticmethod
    def _bind(entry: EntryPoint[S, V], planned: Planned[S]) -> Bound[S, V]:
        args, max_rows = entry.call_args(), planned.plan.max_rows
        return Bound(planned, args, entry.bind(planned.target.subject),
                     args.page_size if max_rows is None else min(args.page_size, max_rows))

    def _schedule(self, call: Call, bound: Bound[S, V]) -> Scheduled[S, V]:
        target, settings = bound.planned.target, self._settings
        pool = self._pools.get(target.connection, target.subject.kind == "write")
        deadline = Deadline(call.arrived, lower_timeout(bound.args.timeout_ms, bound.planned.plan.query_timeout,
                                                        settings.statement_timeout_ms), settings.statement_timeout_ms)
        deadline.check()   # waited past its timeout already (for a thread): no late answer, cached or not
        return Scheduled(bound, pool, Claim(self._pools.bulkheads.get(target.connection), deadline))

    def _answer(self, resp: falcon.Response, call: Call, entry: EntryPoint[S, V],
                scheduled: Scheduled[S, V]) -> tuple[int, int | None]:
        """cache or execute, then shape: (the status, the rows sent; None for a stream's)."""
        if scheduled.bound.args.stream:
            self._stream(resp, call, entry, scheduled)
            return 200, None
        qv, cache = scheduled.bound.planned.target.cacheable, self._cache
        if qv is not None and cache is not None:
            return self._cached(resp, call, cache, qv, functools.partial(_page, entry, scheduled), scheduled)
        return 200, self._execute(resp, entry, scheduled)

    def _cached(self, resp: falcon.Response, call: Call, cache: ResponseCache, qv: QueryVersion,
                compute: Callable[[], runner.Result], scheduled: Scheduled[S, V]) -> tuple[int, int]:
        """cache, shape: this call's entry (a miss runs ``compute`` once per entry in the worker),
        sent with this key's plan; learned for the server's loop unless it bypassed the cache."""
        bound = scheduled.bound
        args, planned = bound.args, bound.planned
        # Keyed by what the columns are under the schema the plan was made under too: the cached
        # rows and this call's masks agree on every column.
        held, state = cache.answer(qv, bound.values, args.page, bound.size, compute, not args.cache, args.store,
                                   reading(qv, self._settings, planned.kin), args.max_age, claim=scheduled.claim)
        view, status = send_cached(resp, args, bound.size, planned.plan, held, state, call.if_none_match,
                                   safe=call.safe)
        if call.replay is not None and state != "bypass" and self._learner is not None:
            self._learner.learn(call.replay, call, planned, held, view, status)
        return status, view.rows if status == 200 else 0

    def _execute(self, resp: falcon.Response, entry: EntryPoint[S, V], scheduled: Scheduled[S, V]) -> int:
        """execute, shape: one round trip under the connection's bulkhead; a write purges the
        cached answers of what it touched, on every worker, before it is answered."""
        bound = scheduled.bound
        planned = bound.planned
        with scheduled.claim:
            result = _page(entry, scheduled)
        target = planned.target
        write = target.subject.kind == "write"
        rows = send_page(resp, bound.args, bound.size, planned.plan, result, write)
        if write and self._cache is not None:   # before the write is answered (see gateway.cache)
            # The catalog now, not the call's: a cached query published while the write ran may
            # have cached what it read before the write committed.
            purged = self._cache.written(self._holder.catalog, target.connection, target.subject.analysis,
                                         planned.kin)
            if purged is not None:
                resp.set_header("X-Cache-Invalidated", purge_summary(purged))
        return rows

    def _stream(self, resp: falcon.Response, call: Call, entry: EntryPoint[S, V], scheduled: Scheduled[S, V]) -> None:
        """execute, shape (a stream): it holds the key's max_concurrent place until its last row
        (or the client leaves), as it holds its session and its place on the connection."""
        admission, bound = self._admission, scheduled.bound
        planned = bound.planned
        send_streamed(resp, entry.stream_text(planned.target.subject, bound.values), bound.args, planned.plan,
                      scheduled.pool, scheduled.claim, self._settings.stream_fetch_rows,
                      functools.partial(admission.take_rows, planned.key), call.request_id)
        if call.place is not None:
            release_after(resp, functools.partial(admission.leave, *call.place))
            call.place = None

    def _record(self, resp: falcon.Response, call: Call, key: ApiKey, status: int, rows: int | None) -> None:
        for header, value in call.limits:
            resp.set_header(header, value)
        self._recorder.answered(call.request_id, call.started, key, call.name, call.version, status, rows)


def _page(entry: EntryPoint[S, V], scheduled: Scheduled[S, V]) -> runner.Result:
    """execute: one page, one round trip on a pooled session, under what is left of the
    deadline when it starts."""
    bound = scheduled.bound
    return entry.page(scheduled.pool, bound.planned.target.subject, bound.values, bound.size, bound.args.page,
                      scheduled.claim.deadline.statement_ms())
