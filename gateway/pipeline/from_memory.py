"""Calls this worker answers again from its memory alone, on the server's loop, without the
pipeline: asked by the server (fleet/server/worker.py) before it hands a request to a thread.

Why: a cache hit waits on nothing, yet through gunicorn's thread hand-off, Falcon and the
pipeline it cost about 93 us of a worker's CPU, against 117 for a call that asks the
database (one worker, 32 keep-alive connections): the cache saved little. Nearly all of a
hit's work repeats what the same request's previous hit already worked out. Answered here, a
hit costs 59 us against 114 (docs/bench/2026-12-01-cache-3.md: 1.95x the throughput).

What: a hit through the pipeline (``Pipeline.run``) is *learned* under its request exactly as
it arrived: its target, every header field but ``X-API-Key`` (in order, as sent), the peer's
address, and the key's secret only as Python's ``hash`` of it (``request``). The same request
again is *answered* (``__call__``) with what the pipeline would answer, by the same stages'
functions on what can change between two such calls; what cannot is the learned call's:

=============  ===========================================================================
stage          here, per call
=============  ===========================================================================
admit          learned only for a key whose admission never needs shared state
               (``Admission.local``: no rate limit, quota, ``max_concurrent``, or
               per-client limit): nothing to count or hold
identify       ``identify`` itself, on the secret sent, against the catalog snapshot the
               call was learned under, which must still be this worker's and fresh
               (``CatalogHolder.fresh``): a key revoked, disabled, narrowed or expired (a
               new snapshot, or ``identify``'s own clock checks) is not answered here
plan           the same snapshot, key and schema trees (``plans.kin_of``, the same object
               while unchanged): the plan, and so its masks and ``max_rows``, is the one the
               learned call was answered with
bind           the same target: the same values, so the same entry
cache          that entry must still be held, not purged or refilled since, and fresh a while
               longer, while the cache's bus keeps this worker fresh
               (``ResponseCache.replayed``, which counts the hit as ``answer`` does)
shape          the learned view (the body this plan makes of the entry); ``If-None-Match`` is
               a header, so its 200 or 304 is the learned one; the freshness headers are
               made now (``cached.cache_headers``)
record         ``record.Recorder.answered``, as ``Pipeline.run`` records
=============  ===========================================================================

then the headers Falcon and the middleware add (``content-type``, ``x-request-id`` (a new
id), ``content-length``), in Falcon's order: tests/pipeline/test_from_memory.py holds the
answer here byte for byte against the pipeline's for the same request. Anything else (no
such call learned, or any check above saying no) returns None: the server hands the request
to a thread, and the pipeline answers it.

What is learned never holds memory the cache has let go, nor old catalogs: a learned call
holds its entry and view weakly (an entry dropped from the cache is freed as before, and its
calls are answered by the pipeline again), all of them were learned under one catalog snapshot
(learning under another empties the table first), and there are at most ``MAX_LEARNED``
(emptied when full).
"""
from __future__ import annotations

import time
import weakref
from typing import TYPE_CHECKING, NamedTuple

from ..errors import GatewayError
from ..request_ids import new_request_id
from .cached import cache_headers
from .identify import identify
from .plans import kin_of
from .record import Recorder

if TYPE_CHECKING:
    from ..cache import Entry, ResponseCache
    from ..governance.schema_cache import SchemaCache
    from ..model.catalog import ApiKey, Catalog
    from ..model.state import CatalogHolder
    from ..ports import Admission
    from ..store.history import HistoryWriter
    from .cached import View
    from .call import Call
    from .identify import AdminIdentity

MAX_LEARNED = 10_000
# Set by the server (fleet/server/worker.py) on a plain GET without Cache-Control: the head as received,
# (target, the header fields but X-API-Key), for FromMemory.request.
REPLAYABLE = "gateway.replayable"
STATUS_LINES = {200: "200 OK", 304: "304 Not Modified"}

Headers = list[tuple[str, str]]


class Answer(NamedTuple):
    """What the server sends: a WSGI status line, the application's headers, the body."""

    status: str
    headers: Headers
    body: bytes


class _Learned:
    """A call answered from the cache by the pipeline: what its stages decided that a replay
    checks or records again, and what its answer was made of."""

    __slots__ = ("catalog", "key", "ip", "connection", "kin", "name", "version", "entry", "view", "status", "rows",
                 "status_line", "view_headers", "content_type", "length")

    def __init__(self, call: Call, key: ApiKey, entry: Entry, view: View, status: int) -> None:
        self.catalog = call.catalog
        self.key = key
        self.ip = call.ip                   # the client address the pipeline identified it from
        self.connection = call.target.connection
        self.kin = call.kin
        self.name = call.name
        self.version = call.version
        self.entry = weakref.ref(entry)
        self.view = weakref.ref(view)       # the entry holds it (``Entry.views``)
        self.status = status
        self.rows = view.rows if status == 200 else 0
        self.status_line = STATUS_LINES[status]
        self.view_headers = tuple((name.lower(), value) for name, value in view.headers)
        # A 304 carries no content and no type (``send_cached``); Falcon's default type otherwise.
        self.content_type = None if status == 304 else (view.content_type or "application/json")
        # The view's body never changes: its content-length is made once (a 304 has none).
        self.length = str(len(view.body)) if status == 200 else None


class FromMemory:
    __slots__ = ("_learned", "_catalog", "_holder", "_cache", "_admission", "_recorder", "_schemas", "_admin",
                 "answered")

    def __init__(self, holder: CatalogHolder, cache: ResponseCache, admission: Admission, history: HistoryWriter,
                 schemas: SchemaCache | None = None, admin: AdminIdentity | None = None) -> None:
        self._learned: dict[tuple, _Learned] = {}
        self._catalog: Catalog | None = None    # the snapshot every learned call was answered under
        self._holder = holder
        self._cache = cache
        self._admission = admission
        self._recorder = Recorder(history, admission)
        self._schemas = schemas
        self._admin = admin
        self.answered = 0   # the calls answered here (/metrics: gateway_loop_answers_total)

    @staticmethod
    def request(target: str, fields: tuple, peer: str, secret: str | None) -> tuple:
        """What a call is learned and recognised by: its target as received, its other header
        fields as received, the peer's address and (only as a hash) the key's secret."""
        return target, fields, peer, hash(secret)

    def learn(self, request: tuple, call: Call, key: ApiKey, entry: Entry, view: View, status: int) -> None:
        """The pipeline answered ``request`` (``call``, of ``key``) from the cache ``entry`` with
        this view and status."""
        if not self._admission.local(key) or status not in STATUS_LINES:
            return
        learned = self._learned
        if call.catalog is not self._catalog or (len(learned) >= MAX_LEARNED and request not in learned):
            learned.clear()
            self._catalog = call.catalog
        learned[request] = _Learned(call, key, entry, view, status)

    def __call__(self, target: str, fields: tuple, peer: str, secret: str | None) -> Answer | None:
        started = time.perf_counter()
        learned = self._learned.get((target, fields, peer, hash(secret)))   # ``request``
        if learned is None:
            return None
        catalog = self._holder.fresh()
        if catalog is not learned.catalog:
            return None
        try:
            key = identify(secret, catalog, self._admin, ip=learned.ip)                    # identify
        except GatewayError:
            return None   # the pipeline refuses it, with its answer
        if key is not learned.key or kin_of(self._schemas, learned.connection) is not learned.kin:
            return None                                                                     # plan
        entry, view = learned.entry(), learned.view()
        if entry is None or view is None or not self._cache.replayed(entry):               # cache
            return None
        request_id = new_request_id()
        headers = [*learned.view_headers, *cache_headers(entry, "hit", time.time())]        # shape
        if learned.content_type is not None:
            headers.append(("content-type", learned.content_type))
        headers.append(("x-request-id", request_id))
        body = b""
        if learned.length is not None:
            body = view.body
            headers.append(("content-length", learned.length))
        self._recorder.answered(request_id, started, key, learned.name, learned.version, learned.status,
                                learned.rows)                                               # record
        self.answered += 1
        return Answer(learned.status_line, headers, body)
