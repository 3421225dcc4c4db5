"""The call pipeline: the named stages every entry point goes through, so that a rule is
enforced in exactly one place.

    1 identify   X-API-Key -> the key's record in the worker's catalog        (identify.py)
    2 admit      the client IP's rate limit; then the key's max_concurrent
                 (a place held until the call ends), limits and quota         (ports.Admission)
    3 plan       what runs (the entry point's ``resolve``) and the key's plan
                 for it, memoised with the catalog                            (plans.py)
    4 bind       typed values for the statement's parameters                  (the entry point)
    4 cache      a read with a ``cache_ttl``: this worker's cache, no I/O on a hit (cached.py)
    5 execute    one round trip on a pooled session                           (the entry point, execution/)
    6 shape      masks, format, paging headers, or a metered stream           (shape.py)
    7 record     one append to the history queue; rows settled on the quota

An entry point (``saved.SavedCall``, ``adhoc.AdHocCall``) supplies only what differs:
``resolve(catalog, key)`` (what runs, checking its grants), ``call_args()``, ``bind()``,
``page()`` and ``stream_text()``, plus the ``name``/``version`` recorded in the history.
"""
from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import GatewayError
from ..execution import runner
from ..execution.bulkhead import Claim
from ..execution.deadline import Deadline
from ..model.catalog import ApiKey
from .args import CallArgs, lower_timeout
from .cached import purge_summary, send_cached
from .identify import admin_identity, identify
from .plans import plan_for, reading
from .shape import send_page, send_stream

log = logging.getLogger("gateway")
MAX_LOGGED = 2000   # as gateway.http.errors bounds a logged detail

if TYPE_CHECKING:
    import falcon

    from ..cache import ResponseCache
    from ..execution.pool import SessionPool
    from ..governance import CallPlan
    from ..governance.schema_cache import SchemaCache
    from ..model.catalog import Catalog, Connection
    from ..model.state import CatalogHolder
    from ..ports import Admission, Headers
    from ..settings import Settings
    from ..store.history import HistoryWriter
    from .from_memory import FromMemory
    from .identify import AdminIdentity


class EntryPoint(Protocol):
    """What an entry point supplies (``saved.SavedCall``, ``adhoc.AdHocCall``). The subject
    ``resolve`` returns (a query version, an ad-hoc statement) is handed back to its own
    ``bind``, ``page`` and ``stream_text``; ``connection`` and ``version`` are set by ``resolve``."""

    name: str
    version: int | None
    connection: Connection | None
    admit_before_plan: bool   # whether resolve() costs CPU the caller chooses (see Pipeline.run)

    def resolve(self, catalog: Catalog, key: ApiKey) -> Any: ...

    def call_args(self) -> CallArgs: ...

    def bind(self, subject: Any) -> Sequence: ...

    def page(self, pool: SessionPool, subject: Any, bound: Any, size: int, page: int,
             timeout_ms: int | None) -> runner.Result: ...

    def stream_text(self, subject: Any, bound: Any) -> str: ...


class Pipeline:
    __slots__ = ("_holder", "_pools", "_history", "_settings", "_admission", "_mask_key", "_cache", "_admin",
                 "_schemas", "_from_memory")

    def __init__(self, holder: CatalogHolder, pools: runner.Pools, history: HistoryWriter, settings: Settings,
                 admission: Admission, cache: ResponseCache | None = None, schemas: SchemaCache | None = None,
                 from_memory: FromMemory | None = None, admin: AdminIdentity | None = None) -> None:
        self._holder = holder
        self._pools = pools
        self._history = history
        self._settings = settings
        self._admission = admission
        self._mask_key = settings.mask_key_bytes()
        self._cache = cache
        # The connections' inheritance and partition trees as they are now, for the plans.
        self._schemas = schemas
        self._from_memory = from_memory   # learns the calls answered from the cache (see from_memory.py)
        # The admin key runs everything on the data plane too (as QueryAPIGate's); none: nobody does.
        self._admin = admin if admin is not None else admin_identity(settings)

    def run(self, resp: falcon.Response, call: EntryPoint, *, request_id: str, ip: str, secret: str | None,
            if_none_match: str | None = None, request: tuple | None = None, safe: bool = True,
            arrived: float | None = None) -> None:
        """``request``: the call as ``FromMemory.request`` names it, when the server may ask for
        it again (a plain GET): an answer from the cache is learned under it. ``safe``: a GET
        (``If-None-Match`` answers it 304), not a POST (412). ``arrived``: ``time.monotonic()``
        when the request arrived (``gateway.http.common.arrived``; None: now), from which the
        call's timeout counts."""
        started = time.perf_counter()
        if arrived is None:
            arrived = time.monotonic()
        key = None
        admitted = False   # past admission: the key's quota was charged, whatever happens next
        place: object = None   # one of the key's max_concurrent places, given back at the end
        admission = self._admission
        settings = self._settings
        try:
            limits = admission.admit_ip(ip)                                     # 2 admit (the client)
            catalog = self._holder.current()
            key = identify(secret, catalog, self._admin, ip=ip)                 # 1 identify
            # An entry point whose plan costs CPU the caller chooses (an ad-hoc statement read and
            # analysed anew per distinct text) is admitted first: the key's limits bound that cost.
            early = call.admit_before_plan
            if early:
                place, limits = self._admit_key(key, limits)
                admitted = True
            subject = call.resolve(catalog, key)                                # 3 plan
            schemas = self._schemas
            kin = None if schemas is None else schemas.kin(call.connection)  # type: ignore[arg-type]  # set by resolve()
            plan = plan_for(catalog, key, subject, settings, self._mask_key, kin)
            if not early:   # after the plan: a call refused by its plan is not charged
                place, limits = self._admit_key(key, limits)
                admitted = True
            args = call.call_args()
            bound = call.bind(subject)                                          # 4 bind
            write = subject.kind == "write"
            pool = self._pools.get(call.connection, write)  # type: ignore[arg-type]  # set by resolve() above
            deadline = Deadline(arrived, lower_timeout(args.timeout_ms, plan.query_timeout,
                                                       settings.statement_timeout_ms), settings.statement_timeout_ms)
            deadline.check()   # waited past its timeout already (for a thread): no late answer, cached or not
            # The connection's bulkhead: the place its statement (or its wait for another's) holds.
            claim = Claim(self._pools.bulkheads.get(call.connection), deadline)  # type: ignore[arg-type]
            rows: int | None
            status = 200
            if args.stream:                                                     # 5 execute, 6 shape
                self._stream(resp, call, subject, bound, args, plan, pool, claim, key, request_id)
                rows = None   # charged batch by batch as they are sent; the history records none
                if place is not None:   # the stream holds the place until its last row (or the client leaves)
                    resp.stream = _Then(resp.stream, functools.partial(admission.leave, key, place))
                    place = None
            else:
                size = args.page_size if plan.max_rows is None else min(args.page_size, plan.max_rows)

                def run_page() -> runner.Result:   # the statement's timeout: what is left when it starts
                    return call.page(pool, subject, bound, size, args.page, deadline.statement_ms())
                # 4 cache (a saved read with a cache_ttl only): one attribute test for a version without
                if subject.cache_ttl and not write and self._cache is not None:
                    # Keyed by what the columns are under the schema the plan was made under too:
                    # the cached rows and this call's masks agree on every column.
                    entry, state = self._cache.answer(subject, bound, args.page, size, run_page, not args.cache,
                                                      args.store, reading(subject, settings, kin), args.max_age,
                                                      claim=claim)
                    view, status = send_cached(resp, args, size, plan, entry, state, if_none_match, safe=safe)
                    rows = view.rows if status == 200 else 0
                    if request is not None and state != "bypass" and self._from_memory is not None:
                        self._from_memory.learn(request, catalog, key, ip, call.connection,  # type: ignore[arg-type]
                                                kin, entry, view, status, call.name, call.version)
                else:
                    with claim:
                        result = run_page()
                    rows = send_page(resp, args, size, plan, result, write)
                    if write and self._cache is not None:   # before the write is answered (see gateway.cache)
                        # The catalog now, not the call's: a cached query published while the
                        # write ran may have cached what it read before the write committed.
                        purged = self._cache.written(self._holder.catalog, call.connection,  # type: ignore[arg-type]
                                                     subject.analysis, kin)
                        if purged is not None:
                            resp.set_header("X-Cache-Invalidated", purge_summary(purged))
            for header, value in limits:
                resp.set_header(header, value)
            if rows:
                admission.settle(key, rows)                                     # 7 record
            self._history.record(request_id, key.id, call.name, call.version, status, None, rows,
                                 (time.perf_counter() - started) * 1000, True)
        except Exception as exc:
            # A refusal, or a bug (answered 500 internal_error): recorded either way, so a charged
            # call is never missing from the history.
            status, code = (exc.status, exc.code) if isinstance(exc, GatewayError) else (500, "internal_error")
            self._history.record(request_id, key.id if key else None, call.name, call.version, status, code,
                                 None, (time.perf_counter() - started) * 1000, admitted)
            raise
        finally:
            if place is not None:
                admission.leave(key, place)  # type: ignore[arg-type]  # a place is only taken with a key

    def _admit_key(self, key: ApiKey, limits: Headers) -> tuple[object, Headers]:
        """2 admit (the key): one of its max_concurrent places first (a refusal there is not
        charged), then its rate limits and quotas. (the place or None, the limit headers)"""
        admission = self._admission
        place = admission.enter(key) if key.max_concurrent is not None else None   # 2 admit (calls running)
        try:
            return place, limits + admission.admit_key(key)
        except BaseException:
            if place is not None:
                admission.leave(key, place)
            raise

    def _stream(self, resp: falcon.Response, call: EntryPoint, subject: Any, bound: Any, args: CallArgs,
                plan: CallPlan, pool: SessionPool, claim: Claim, key: ApiKey, request_id: str) -> None:
        """A stream's rows are charged batch by batch as they are sent (the history records
        none: they are not all known when the call is recorded). It holds its connection's
        place (``claim``) until its body is closed, as it holds its session."""
        text = call.stream_text(subject, bound)
        claim.enter()
        try:
            columns, source = runner.stream(pool, text, claim.deadline.statement_ms(),
                                            self._settings.stream_fetch_rows)
        except BaseException:
            claim.leave()
            raise
        admission = self._admission
        try:
            send_stream(resp, args, plan, columns, _logged(source, request_id), plan.max_rows,
                        lambda rows: admission.take_rows(key, rows))
        except BaseException:   # refused once the cursor was open (the result's names): give its session back
            _close_then_leave(source, claim)
            raise
        # The server closes the body whether it was read or not: the session and the place go back then.
        resp.stream = _Then(resp.stream, functools.partial(_close_then_leave, source, claim))
        return None


def _close_then_leave(source: runner.Batches, claim: Claim) -> None:
    try:
        source.close()
    finally:
        claim.leave()



def _logged(batches: runner.Batches, request_id: str) -> runner.Batches:
    """A stream that fails after its first rows were sent cannot answer with an error body:
    the server cuts it. Its cause goes to the log here, under the request id, as an error
    before the rows does (``gateway.http.errors``); what propagates carries no server text."""
    try:
        yield from batches
    except GatewayError as exc:
        if exc.detail:
            log.warning("request %s: %s (the stream was cut after rows were sent): %s", request_id, exc.code,
                        exc.detail[:MAX_LOGGED])
        raise GatewayError(exc.status, exc.code, exc.message, extra=exc.extra) from None
    finally:
        batches.close()


class _Then:
    """A stream's chunks, running ``then`` once when they end: the last chunk sent, an error,
    or the server closing the body (a client that went away, or a stream never started: WSGI
    servers call ``close()`` on the body in every case; a generator's ``finally`` would not run
    for one closed before its first chunk). What a stream holds is given back through it: the
    pooled session of ``runner.stream``'s batches, the key's ``max_concurrent`` place."""

    __slots__ = ("_chunks", "_then")

    def __init__(self, chunks: Any, then: Callable[[], object]) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._then: Callable[[], object] | None = then

    def __iter__(self) -> _Then:
        return self

    def __next__(self) -> bytes:
        try:
            return next(self._chunks)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        then, self._then = self._then, None
        if then is None:
            return
        try:
            close = getattr(self._chunks, "close", None)
            if close is not None:
                close()
        finally:
            then()
