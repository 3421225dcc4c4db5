"""The ports: what the gateway asks of the world around it, and the in-process versions.

The product depends on these interfaces only; ``fleet`` implements them over Redis
(``fleet.shared.bus.RedisBus`` is a ``Sync``, ``fleet.shared.leases.LeasedAdmission`` an ``Admission``,
``fleet.shared.events.RedisEvents`` an ``Events``), and the composition root (``fleet.app``)
chooses. The in-process versions here serve a single process with no Redis: unit tests,
embedded tools, a gateway run without a fleet.

* ``Sync``: how a worker learns of management changes (and a change waits for the fleet).
* ``Admission``: may this call run now (rate limits per client IP and per key, quotas);
  ``admit_*`` return the response headers to add or raise a 429 ``GatewayError``;
  ``settle`` reports the rows a call returned (row quotas settle after the call);
  ``rows_left`` bounds a stream; ``enter``/``leave`` hold one of a key's ``max_concurrent``
  places for as long as its call runs (a stream: until its last row is sent).
* ``Events``: live events of runs and changes, fanned out to ``GET /events`` readers.
* ``Clock``: monotonic seconds, injected where time is tested (leases).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

from .errors import GatewayError

if TYPE_CHECKING:   # the model implements what Sync drives; ports import nothing at run time
    from .model.catalog import ApiKey
    from .model.state import CatalogHolder

Clock = Callable[[], float]
FOREVER = float("inf")
# Response headers an admission adds: ((name, value), ...).
Headers = tuple[tuple[str, str], ...]
NO_HEADERS: Headers = ()
# One answered call as the history records it: (at, request_id, key_id, query, version,
# status, code, rows, duration_ms, worker, admitted). ``admitted``: the call passed admission
# (its key's quota was charged), whatever its status. Observers (``Events`` among them) get batches.
Run = tuple[float, str, int | None, str | None, int | None, int, str | None, int | None, float, str, bool]


# --- Sync --------------------------------------------------------------------------------
class Sync(Protocol):
    connected: bool        # hearing from the shared state now (a metric)
    live_workers: int      # workers of the fleet seen alive (admission's fallback share)

    def start(self, holder: CatalogHolder) -> None:
        """Begin keeping ``holder`` current (worker side)."""

    def announce(self, generation: int) -> dict:
        """After a change committed at ``generation``: return once no worker serves older."""

    def ready(self) -> bool:
        """Whether the shared state is reachable (for ``/ready``)."""

    def close(self) -> None: ...


class LocalSync:
    """One process: a change reloads the catalog in place."""

    __slots__ = ("_holder",)
    connected = True
    live_workers = 1

    def __init__(self) -> None:
        self._holder: CatalogHolder | None = None

    def start(self, holder: CatalogHolder) -> None:
        self._holder = holder
        holder.reload()
        holder.renew(FOREVER)

    def announce(self, generation: int) -> dict:
        if self._holder is not None:
            self._holder.reload(at_least=generation)
        return {"workers": 1, "waited_ms": 0.0}

    def ready(self) -> bool:
        return True

    def close(self) -> None:
        pass


# --- Admission ---------------------------------------------------------------------------
class Admission(Protocol):
    fallbacks: int         # calls decided by a local fallback while the shared state was away

    def admit_ip(self, ip: str) -> Headers: ...

    def admit_key(self, key: ApiKey) -> Headers: ...

    def settle(self, key: ApiKey, rows: int) -> None: ...

    def rows_left(self, key: ApiKey) -> int | None:
        """Rows the key may still receive this period as far as this worker knows (None:
        no rows quota). A page may overshoot by its own size."""

    def take_rows(self, key: ApiKey, wanted: int) -> int:
        """Charge up to ``wanted`` rows to the key's rows quota and say how many (all of them
        without a rows quota): the check and the charge in one step, so streams of one key
        running at once in this worker share what is left instead of each sending all of it."""

    def usage(self, keys: Iterable[ApiKey]) -> list[dict]: ...

    def enter(self, key: ApiKey) -> object:
        """One of the places of ``key.max_concurrent`` (called only when the key has one), held
        until ``leave``; raises 429 ``too_many_concurrent`` when all are taken."""

    def leave(self, key: ApiKey, place: object) -> None:
        """Give back what ``enter`` returned (once; never raises)."""

    def local(self, key: ApiKey) -> bool:
        """Whether admitting a call of ``key``, from any client, never needs the shared state
        (no limit applies: nothing to lease, count or hold)."""

    def close(self) -> None: ...


class AdmitAll:
    """Admission switched off: nothing is limited or counted."""

    __slots__ = ()
    fallbacks = 0

    def admit_ip(self, ip: str) -> Headers:
        return NO_HEADERS

    def admit_key(self, key: ApiKey) -> Headers:
        return NO_HEADERS

    def settle(self, key: ApiKey, rows: int) -> None:
        pass

    def rows_left(self, key: ApiKey) -> int | None:
        return None

    def take_rows(self, key: ApiKey, wanted: int) -> int:
        return wanted

    def usage(self, keys: Iterable[ApiKey]) -> list[dict]:
        return []

    def enter(self, key: ApiKey) -> object:
        return None

    def leave(self, key: ApiKey, place: object) -> None:
        pass

    def local(self, key: ApiKey) -> bool:
        return True

    def close(self) -> None:
        pass


def rate_limited(retry_after_s: float, headers: Headers, what: str) -> GatewayError:
    seconds = max(1, int(retry_after_s + 0.999))
    return GatewayError(429, "rate_limited", f"rate limit of {what} exceeded; retry after {seconds}s",
                        extra={"retry_after": seconds},
                        headers=dict(headers, **{"Retry-After": str(seconds)}))


def too_many_concurrent(maximum: int) -> GatewayError:
    """QueryAPIGate's answer, as it gives it (status, code, Retry-After, body fields)."""
    return GatewayError(429, "too_many_concurrent",
                        f"this key already has {maximum} calls running, its max_concurrent; retry when one finishes",
                        extra={"retry_after": 1, "max_concurrent": maximum}, headers={"Retry-After": "1"})


def quota_exceeded(what: str, reset_s: int, headers: Headers) -> GatewayError:
    return GatewayError(429, "quota_exceeded", f"the key's {what} quota is used up",
                        extra={"retry_after": reset_s},
                        headers=dict(headers, **{"Retry-After": str(reset_s)}))


# --- Events ------------------------------------------------------------------------------
class Events(Protocol):
    # Whether this worker is draining (a stream ends then, else it would hold the worker until
    # the graceful timeout); the server's hooks set it through ``Parts.drain_when``.
    draining: Callable[[], bool]

    def __call__(self, batch: Sequence[Run]) -> None:
        """A batch of answered runs (a history observer, off the hot path)."""

    def change(self, doc: dict) -> None:
        """A management change, after it committed."""

    def acquire_reader(self) -> bool:
        """Take one of this worker's reader slots (False when all are taken)."""

    def read(self, last_id: str, block_ms: int = 15000) -> Iterator[bytes]:
        """Server-sent event frames after ``last_id``; releases the reader slot at the end."""
