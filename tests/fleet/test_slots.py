"""The workers' table (fleet/server/slots.py): what one process writes, a forked one reads; a slot is
freed only for the worker it was given to."""
from __future__ import annotations

import os

from fleet.server.slots import BOOTING, FREE, LEAVING, SERVING, Slots


def test_a_forked_worker_writes_what_the_master_and_its_siblings_read():
    table = Slots(4)
    first, second = table.allocate(age=1), table.allocate(age=2)
    assert (first, second) == (0, 1)
    pid = os.fork()
    if pid == 0:                      # the "worker" in slot 0
        table.set_state(first, SERVING, os.getpid())
        table.set_connections(first, 17)
        os._exit(0)
    os.waitpid(pid, 0)
    assert list(table.others(second)) == [(SERVING, 1, 17)]
    assert table.snapshot() == [(SERVING, 1, 17, pid), (BOOTING, 2, 0, 0)]


def test_a_slot_is_freed_only_for_its_own_worker_and_then_reused():
    table = Slots(2)
    slot = table.allocate(age=5)
    table.set_state(slot, LEAVING)
    table.free(slot, age=4)           # an older worker's late exit: not this one's slot
    assert table.snapshot() == [(LEAVING, 5, 0, 0)]
    table.free(slot, age=5)
    assert table.snapshot() == [] and table.allocate(age=6) == slot
    assert table.allocate(age=7) == 1 and table.allocate(age=8) is None   # full: that worker runs unbalanced
    assert FREE == 0
