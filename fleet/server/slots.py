"""The workers of one gunicorn master, as they see each other: one slot per live worker in a
shared memory table made by the master before it forks any worker.

A worker writes only its own slot (its state and how many connections it holds); the master
allocates a slot before it forks a worker and frees it when it reaps the worker. Reads of the
other slots take no lock: a value a few milliseconds old only delays a decision by that much
(fleet/server/worker.py re-reads every few milliseconds). The one decision that must not race, "may I
leave now", is taken under an inter-process lock (``leave_lock``), so two workers reaching
their recycling point together leave one after the other.
"""
from __future__ import annotations

import mmap
import multiprocessing
from collections.abc import Iterator

FREE, BOOTING, SERVING, LEAVING = 0, 1, 2, 3
_FIELDS = 4                    # state, age, connections, pid: one int64 each
_STATE, _AGE, _CONNS, _PID = range(_FIELDS)


class Slots:
    """``size`` slots in an anonymous shared mapping (inherited by every forked worker)."""

    __slots__ = ("size", "_map", "_cells", "leave_lock")

    def __init__(self, size: int) -> None:
        self.size = size
        self._map = mmap.mmap(-1, 8 * _FIELDS * size)      # MAP_SHARED | MAP_ANONYMOUS
        self._cells = memoryview(self._map).cast("q")
        self.leave_lock = multiprocessing.get_context("fork").Lock()

    # --- the master ----------------------------------------------------------------------
    def allocate(self, age: int) -> int | None:
        """A free slot marked BOOTING for a worker about to be forked (None: table full; that
        worker then runs unbalanced rather than not at all)."""
        for slot in range(self.size):
            base = slot * _FIELDS
            if self._cells[base + _STATE] == FREE:
                for field in range(_FIELDS):
                    self._cells[base + field] = 0
                self._cells[base + _AGE] = age
                self._cells[base + _STATE] = BOOTING
                return slot
        return None

    def free(self, slot: int | None, age: int) -> None:
        """The worker of ``age`` in ``slot`` is gone (reaped, or found gone). Ages are unique: a
        slot already given to a younger worker is left to it."""
        if slot is not None and self._cells[slot * _FIELDS + _AGE] == age:
            base = slot * _FIELDS
            self._cells[base + _CONNS] = 0
            self._cells[base + _STATE] = FREE

    # --- a worker, about its own slot ----------------------------------------------------
    def set_state(self, slot: int, state: int, pid: int = 0) -> None:
        base = slot * _FIELDS
        if pid:
            self._cells[base + _PID] = pid
        self._cells[base + _STATE] = state

    def set_connections(self, slot: int, count: int) -> None:
        self._cells[slot * _FIELDS + _CONNS] = count

    # --- a worker, about the others ------------------------------------------------------
    def others(self, slot: int) -> Iterator[tuple[int, int, int]]:
        """(state, age, connections) of every other slot in use."""
        cells = self._cells
        for other in range(self.size):
            if other == slot:
                continue
            base = other * _FIELDS
            state = cells[base + _STATE]
            if state != FREE:
                yield state, cells[base + _AGE], cells[base + _CONNS]

    def snapshot(self) -> list[tuple[int, ...]]:
        """The fields of every slot in use (tests, logs)."""
        cells = self._cells
        return [tuple(cells[s * _FIELDS:(s + 1) * _FIELDS].tolist()) for s in range(self.size)
                if cells[s * _FIELDS + _STATE] != FREE]
