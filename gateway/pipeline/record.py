"""Stage record: what a call leaves behind, answered by the pipeline or again from memory
(``from_memory.py``) alike: the rows sent settled on the key's rows quota, and one append to
the history queue (a background thread writes batches with ``COPY``; the worker's crash spool
keeps them until then).

A refusal, or a bug (answered 500 ``internal_error``), is recorded too, so a charged call is
never missing from the history: ``admitted`` says whether it passed admission (its quota was
charged, whatever its status), from which the history can rebuild a quota counter Redis lost."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..errors import GatewayError

if TYPE_CHECKING:
    from ..model.catalog import ApiKey
    from ..ports import Admission
    from ..store.history import HistoryWriter


class Recorder:
    __slots__ = ("_history", "_admission")

    def __init__(self, history: HistoryWriter, admission: Admission) -> None:
        self._history = history
        self._admission = admission

    def answered(self, request_id: str, started: float, key: ApiKey, name: str, version: int | None, status: int,
                 rows: int | None) -> None:
        """``started``: ``time.perf_counter()`` when the call began; ``rows``: those sent (None:
        a stream's, charged batch by batch as they were sent)."""
        if rows:
            self._admission.settle(key, rows)
        self._history.record(request_id, key.id, name, version, status, None, rows,
                             (time.perf_counter() - started) * 1000, True)

    def refused(self, request_id: str, started: float, key: ApiKey | None, name: str, version: int | None,
                exc: Exception, admitted: bool) -> None:
        status, code = (exc.status, exc.code) if isinstance(exc, GatewayError) else (500, "internal_error")
        self._history.record(request_id, key.id if key else None, name, version, status, code, None,
                             (time.perf_counter() - started) * 1000, admitted)
