"""The reserved arguments of a call (``format``, ``page``, ``page_size``, ``version``,
``timeout``, ``stream``, ``cache``), parsed and checked once, the same for every entry point."""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import bad_request
from ..execution.formats import FORMATS, STREAM_FORMATS
from ..settings import FALSE_WORDS, TRUE_WORDS

if TYPE_CHECKING:
    from ..settings import Settings

# ``connection_name`` is QueryAPIGate's: on /q/<name> it may only name the query's own connection.
RESERVED = frozenset(("format", "page", "page_size", "version", "timeout", "stream", "cache", "connection_name"))
# Put among a call's reserved arguments by ``Cache-Control: no-store`` only: not in RESERVED, so no
# caller's argument of that name reaches it.
NO_STORE = "no-store"
# Put there by a request's ``Cache-Control: max-age=<seconds>`` only (as NO_STORE): the oldest
# cached answer the caller takes.
MAX_AGE = "max-age"


def positive_int(value: object, code: str, field: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 10:
        number = int(value)
    else:
        raise bad_request(code, f"{field} must be a positive integer")
    if number < 1:
        raise bad_request(code, f"{field} must be a positive integer")
    return number


def split_reserved(raw: Mapping[str, Any]) -> tuple[Mapping[str, Any], dict]:
    """(parameters, reserved arguments) of a query string or a body."""
    if RESERVED.isdisjoint(raw):   # most calls: one C loop over the call's few names, no dict built
        return raw, {}
    reserved = {k: raw[k] for k in RESERVED if k in raw}
    return {k: v for k, v in raw.items() if k not in RESERVED}, reserved


def reserved_args(query: Mapping[str, Any], body: Mapping[str, Any], names: frozenset[str] = RESERVED) -> dict:
    """A POST's reserved arguments (``/q/<name>``, ``/execute_sql``): the query string's, then
    the body's (the body wins)."""
    raw = {k: v for k, v in query.items() if k in names}
    raw.update((k, body[k]) for k in names if k in body)
    return raw


class CallArgs:
    """The reserved arguments of one call, parsed and checked."""

    __slots__ = ("fmt", "page", "page_size", "version", "timeout_ms", "stream", "cache", "store", "max_age",
                 "formula_guard")

    def __init__(self, raw: dict, settings: Settings) -> None:
        fmt = raw.get("format") or "json"
        if fmt not in FORMATS:
            fmt = str(fmt).lower()
            if fmt not in FORMATS:
                raise bad_request("invalid_format", f"format must be one of {', '.join(FORMATS)}")
        self.fmt = fmt
        page = raw.get("page")
        self.page = 1 if page in (None, "") else positive_int(page, "invalid_paging", "page")
        size = raw.get("page_size")
        self.page_size = settings.default_page_size if size in (None, "") else \
            positive_int(size, "invalid_paging", "page_size")
        if self.page_size > settings.max_page_size:
            raise bad_request("invalid_paging", f"page_size must not exceed {settings.max_page_size}")
        version = raw.get("version")
        self.version = None if version in (None, "") else positive_int(version, "invalid_version", "version")
        self.timeout_ms = self._timeout(raw.get("timeout"), settings.statement_timeout_ms)
        self.stream = self._stream(raw.get("stream"), fmt)
        self.cache = self._cache(raw.get("cache"))
        # ``Cache-Control: no-store`` (RFC 9111, 5.2.1.5): answered from the database, and the cache
        # keeps nothing of it (a ``cache=false`` or ``no-cache`` answer refreshes the entry).
        self.store = NO_STORE not in raw
        if not self.store:
            self.cache = False
        # ``Cache-Control: max-age=N`` (RFC 9111, 5.2.1.1): a cached answer older than N seconds
        # (its ``Age``) is not taken; the database answers and the entry is refreshed.
        self.max_age: int | None = raw.get(MAX_AGE)
        self.formula_guard = settings.csv_formula_guard   # CSV/TSV text that would run as a formula

    @staticmethod
    def _cache(raw: object) -> bool:
        """``cache=false`` (or ``Cache-Control: no-cache``): answer from the database."""
        if raw is None or raw is True or raw == "" or (isinstance(raw, str) and raw.lower() in TRUE_WORDS):
            return True
        if raw is False or (isinstance(raw, str) and raw.lower() in FALSE_WORDS):
            return False
        raise bad_request("invalid_cache", "cache must be true or false")

    @staticmethod
    def _stream(raw: object, fmt: str) -> bool:
        if raw is None or raw is False or raw == "" or (isinstance(raw, str) and raw.lower() in FALSE_WORDS):
            return False
        if raw is True or (isinstance(raw, str) and raw.lower() in TRUE_WORDS):
            if fmt not in STREAM_FORMATS:
                raise bad_request("invalid_stream", "only csv, tsv and ndjson can be streamed")
            return True
        raise bad_request("invalid_stream", "stream must be true or false")

    @staticmethod
    def _timeout(raw: Any, server_ms: int) -> int | None:
        """A caller may lower the server's statement timeout, never raise it."""
        if raw in (None, ""):
            return None
        try:
            seconds = float(raw)
        except (TypeError, ValueError):
            raise bad_request("invalid_timeout", "timeout must be a number of seconds") from None
        if not 0 < seconds < 1e9 or isinstance(raw, bool):
            raise bad_request("invalid_timeout", "timeout must be a positive number of seconds")
        wanted = max(1, int(seconds * 1000))
        return wanted if wanted < server_ms else None


def lower_timeout(asked_ms: int | None, key_limit_s: float | None, server_ms: int) -> int | None:
    """The statement timeout of a call: the lowest of the caller's, the key's and the
    server's; None when it is the server's own (set once per session)."""
    if key_limit_s is not None:
        key_ms = max(1, int(key_limit_s * 1000))
        asked_ms = key_ms if asked_ms is None else min(asked_ms, key_ms)
    return asked_ms if asked_ms is not None and asked_ms < server_ms else None
