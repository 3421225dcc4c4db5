"""The store's run history (``gw_run_history``) and keys, read as the superuser: ``sql`` is the
``superuser`` fixture or a ``Services.sql``."""
from __future__ import annotations

import time


def wait_for_history(sql, request_ids, timeout=5.0) -> dict:
    """{request_id: (query, version, status, code, row_count, key_id)} once every one of
    ``request_ids`` is in the history (or ``timeout`` passed: the ones that are)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = sql("SELECT request_id, query, version, status, code, row_count, key_id "
                   "FROM gw_run_history WHERE request_id = ANY(%s)", (list(request_ids),))
        found = {r[0]: r[1:] for r in rows}
        if len(found) == len(set(request_ids)) or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def history_workers(sql, request_ids) -> dict:
    """{request_id: worker} for the runs already in the store."""
    rows = sql("SELECT request_id, worker FROM gw_run_history WHERE request_id = ANY(%s)",
               (list(request_ids),))
    return dict(rows)


def wait_history_workers(sql, request_ids, timeout_s: float = 10) -> dict:
    request_ids = set(request_ids)
    deadline = time.monotonic() + timeout_s
    while True:
        found = history_workers(sql, request_ids)
        if len(found) == len(request_ids) or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def key_id(sql, name: str) -> int:
    return sql("SELECT id FROM gw_api_keys WHERE name = %s", (name,))[0][0]


def runs_by_worker(sql, key: int) -> dict:
    """Calls of key id ``key`` in the run history: {worker ("host:pid"): {status: count}}."""
    rows = sql("SELECT worker, status, count(*) FROM gw_run_history WHERE key_id = %s GROUP BY 1, 2", (key,))
    out: dict = {}
    for worker, status, count in rows:
        out.setdefault(worker, {})[status] = count
    return out
