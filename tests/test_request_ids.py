"""gateway/request_ids.py: ids unique across a master's workers, whoever imported the module first."""
from __future__ import annotations

import os

from gateway.request_ids import new_request_id


def _prefix(request_id: str) -> str:
    return request_id.partition("-")[0]


def test_ids_count_up_under_one_prefix() -> None:
    first, second = new_request_id(), new_request_id()
    assert _prefix(first) == _prefix(second) and first != second
    assert int(second.partition("-")[2], 16) == int(first.partition("-")[2], 16) + 1


def test_a_forked_child_draws_its_own_prefix() -> None:
    """A worker forked from a process that had imported the module (gunicorn's master, a
    preloaded app) must not number its calls under its parent's prefix: two workers would
    give two calls one id (one history row would replace the other)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: its first id, then out at once
        os.write(write, new_request_id().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 100).decode()
    os.close(read)
    assert _prefix(child) != _prefix(new_request_id())
