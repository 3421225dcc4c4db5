"""Request ids (``X-Request-Id``, the history's ``request_id``): unique per worker without a
system call per request: a random process prefix and a counter. The prefix is drawn again in
every forked child, so that a process that imported this before forking (a preloaded
application, a master) never gives its workers one prefix."""
from __future__ import annotations

import itertools
import os

_prefix = os.urandom(4).hex()
_counter = itertools.count(1)


def _draw() -> None:
    global _prefix, _counter
    _prefix = os.urandom(4).hex()
    _counter = itertools.count(1)


os.register_at_fork(after_in_child=_draw)


def new_request_id() -> str:
    return f"{_prefix}-{next(_counter):x}"
