"""A worker's start (``fleet.app.create_app``): it opens each store session it needs once and
keeps it. Each session costs both sides about 4 ms of CPU to open (SCRAM), at every boot, next
to the workers that serve: the first one (waited for while the store restarts) migrates and
then holds the catalog, and the warm-up reads the history on the store pool's session."""
from __future__ import annotations

from gateway.ports import LocalSync


def test_a_starting_worker_closes_no_store_session_it_opened(make_app, opened_sessions):
    make_app(sync=LocalSync())                 # warm-up on: it reads the run history
    store = [(name, conn) for name, conn in opened_sessions
             if name in ("gateway-fleet-boot", "gateway-fleet-store", "gateway-fleet-admin")]
    assert store, opened_sessions
    assert [name for name, conn in store if conn.closed] == []
    # The catalog's (the first, waited for), the store pool's; the history's too when its first
    # flush comes before the start is over.
    assert "gateway-fleet-boot" not in [name for name, _ in store]
    assert [name for name, _ in store].count("gateway-fleet-admin") == 1 and len(store) <= 3, store
