"""One cached answer: the unmasked rows of one page of one query version, and how it
travels through Redis.

The Redis encoding is a pickle read back by an unpickler that knows only the types a data
session returns, behind an HMAC with the fleet's secret: whoever can write to Redis cannot
make a worker build an arbitrary object or serve an answer the fleet did not store.
"""
from __future__ import annotations

import datetime
import hashlib
import hmac
import io
import pickle
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from ..execution.runner import Result

# What an entry costs beyond its encoded rows (the objects, the index): a rough constant.
OVERHEAD = 256
# The answers an entry keeps ready (``keep``): one per format for every key with nothing to mask,
# one per format and plan for a key with masks. Past this many, a call renders its own each time.
MAX_VIEWS = 8
_MAC = 16
_ALLOWED = {("datetime", n) for n in ("datetime", "date", "time", "timedelta", "timezone")} | \
    {("decimal", "Decimal"), ("uuid", "UUID"), ("builtins", "set"), ("builtins", "frozenset"),
     ("builtins", "bytearray"), ("builtins", "complex")} | \
    {("gateway.execution.values", n) for n in ("Number", "Json", "Rendered")}   # a value's exact text, marked


V = TypeVar("V")   # a view: what its keeper (gateway.pipeline.cached) makes of the rows


class Owner(Protocol):
    """What holds an entry (``memory.MemoryCache``): charged for the views the entry keeps."""

    def grow(self, entry: Entry, extra: int) -> None: ...


class Entry:
    __slots__ = ("digest", "query", "version", "db", "tables", "wildcard", "columns", "rows", "rowcount",
                 "created", "expires", "expires_mono", "size", "payload", "hits", "meta", "views", "owner",
                 "__weakref__")   # the calls answered again from memory hold it weakly (pipeline/from_memory.py)

    def __init__(self, digest: str, query: str, version: int, db: str, tables: frozenset[str], wildcard: bool,
                 columns: tuple[str, ...], rows: list, rowcount: int, created: float, expires: float,
                 expires_mono: float, payload: bytes | None, meta: dict | None = None) -> None:
        self.digest = digest
        self.query = query
        self.version = version
        self.db = db                    # the data database (its name, keys.database): what a write names
        self.tables = tables            # the relations it read (schema-qualified)
        self.wildcard = wildcard        # read a view or a user function: any write to db may change it
        self.columns = columns
        self.rows = rows
        self.rowcount = rowcount
        self.created = created          # wall clock (Age, and the same on every host)
        self.expires = expires          # wall clock
        self.expires_mono = expires_mono
        self.payload = payload          # the rows encoded (None: not encodable; never shared)
        self.size = (len(payload) if payload is not None else 64 * (len(rows) + 1) * (len(columns) + 1)) + OVERHEAD
        self.hits = 0
        self.meta = meta or {}          # connection, page, page_size: for the listing only
        # Answers rendered from the rows, ready to send (``gateway.pipeline.cached``): never shared
        # through Redis, each made here from the unmasked rows with one plan.
        self.views: dict[object, Any] = {}      # each of the type its keeper made
        self.owner: Owner | None = None   # the memory that holds it (set by ``put``): views are charged there

    def keep(self, key: object, view: V, size: int) -> V:
        """The view kept under ``key`` (``view`` unless another thread kept one first; ``view``
        itself, not kept, past ``MAX_VIEWS``); its ``size`` bytes are charged to the memory that
        holds the entry."""
        views = self.views
        if len(views) >= MAX_VIEWS:
            return view
        held = views.setdefault(key, view)
        if held is view and self.owner is not None:
            self.owner.grow(self, size)
        return held

    @property
    def result(self) -> Result:
        from ..execution.runner import Result
        return Result(self.columns, self.rows, self.rowcount)

    def doc(self, now: float, worker: str, tier: str = "memory") -> dict:
        """QueryAPIGate's entry (``key``, ``meta``, ``content_type``, ``size_bytes``, ``ttl_remaining_s``) and
        ours. The entry holds rows, not a body: it answers every format, so ``meta.format`` is null."""
        return {"key": self.digest,
                "meta": {"name": self.query, "version": self.version, "connection": self.meta.get("connection"),
                         "format": None, "page": self.meta.get("page"), "page_size": self.meta.get("page_size")},
                "content_type": "application/json", "size_bytes": self.size,
                "ttl_remaining_s": max(0.0, round(self.expires - now, 1)),
                "query": self.query, "version": self.version, "rows": len(self.rows),
                "created_at": _iso(self.created), "expires_at": _iso(self.expires), "hits": self.hits, "tier": tier,
                "worker": worker}


def _iso(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.UTC).isoformat(timespec="milliseconds")


def encode_rows(columns: tuple[str, ...], rows: list, rowcount: int) -> bytes | None:
    """The rows as bytes (None: a value pickle cannot carry, e.g. a driver's own type)."""
    try:
        return pickle.dumps((columns, [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
                                       for row in rows], rowcount), protocol=5)
    except (pickle.PicklingError, TypeError, AttributeError):
        return None


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> type:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not a type of a cached row")
        return super().find_class(module, name)


def decode_rows(payload: bytes) -> tuple[tuple[str, ...], list, int]:
    return _Unpickler(io.BytesIO(payload)).load()


def seal(entry: Entry, secret: bytes) -> bytes:
    """The entry for Redis: mac | header | payload."""
    header = pickle.dumps((entry.query, entry.version, entry.db, sorted(entry.tables), entry.wildcard,
                           entry.created, entry.expires, entry.meta), protocol=5)
    body = len(header).to_bytes(4, "big") + header + (entry.payload or b"")
    return hmac.digest(secret, entry.digest.encode() + body, "sha256")[:_MAC] + body


def unseal(digest: str, raw: bytes | str, secret: bytes, now: float, now_mono: float) -> Entry | None:
    """The entry Redis held, or None (forged, damaged, or expired)."""
    if isinstance(raw, str):
        return None
    mac, body = raw[:_MAC], raw[_MAC:]
    if len(mac) != _MAC or not hmac.compare_digest(mac, hmac.digest(secret, digest.encode() + body, "sha256")[:_MAC]):
        return None
    try:
        size = int.from_bytes(body[:4], "big")
        query, version, db, tables, wildcard, created, expires, meta = _Unpickler(io.BytesIO(body[4:4 + size])).load()
        payload = bytes(body[4 + size:])
        columns, rows, rowcount = decode_rows(payload)
    except Exception:   # a damaged value is a miss, never an error
        return None
    left = expires - now
    if left <= 0:
        return None
    return Entry(digest, query, version, db, frozenset(tables), wildcard, tuple(columns), rows, rowcount, created,
                 expires, now_mono + left, payload, meta)


def mac_key(secret_key: str) -> bytes:
    return hashlib.sha256(b"cache:" + secret_key.encode()).digest()
