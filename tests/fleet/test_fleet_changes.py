"""Changes streaming into a real 4-worker gunicorn master under load, applied incrementally
(``gateway.model.catalog.refresh``): every call that starts after a management call returned
sees its change, on every worker, and no worker read the whole catalog to get there (its
``gateway_catalog_full_loads`` stays at the one load it made when it started)."""
from __future__ import annotations

import threading
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from helpers.api import Api
from helpers.history import key_id, runs_by_worker
from helpers.load import Load, statuses, until_each_made
from helpers.masters import Master
from helpers.util import METRICS_AUTH, unique, wait_until

pytestmark = pytest.mark.slow

WORKERS = 4
CALLS_BETWEEN = 10   # calls after each change returned, before the next: what must see it


@pytest.fixture(scope="module")
def master(services, tmp_path_factory):
    m = Master(services, tmp_path_factory.mktemp("changes-home"), workers=WORKERS, lease_ms=100)
    try:
        yield m.start()
    finally:
        m.stop()


def counter(base: str, name: str) -> float:
    text = requests.get(base + "/metrics", headers=METRICS_AUTH, timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def test_changes_under_load_are_exact_and_incremental(master, services, superuser):
    admin = Api.over_http(master.base, services)
    try:
        connection = admin.connection()
        query = admin.query("SELECT 1 AS v", connection=connection)
        admin.ok("POST", f"/queries/{query}/versions",
                 {"connection_name": connection, "sql": "SELECT 2 AS v", "parameters": {}, "publish": False})
        name, secret = admin.named_key([query], [connection])
        bystanders = [admin.named_key([query], [connection])[0] for _ in range(20)]
        load = Load(master.base, f"/q/{query}", secret, threads=8, close=True, keep_bodies=True)
        changes = []   # (started, returned, what every later call must see)
        with load:
            until_each_made([load], 20)
            for i in range(24):
                started = time.monotonic()
                step = i % 4
                if step == 0:
                    version = 2 if (i // 4) % 2 == 0 else 1
                    admin.ok("POST", f"/queries/{query}/publish", {"version": version})
                    expect = ("v", version)
                elif step == 1:   # unrelated keys come and go: nothing the callers see may move
                    admin.ok("DELETE", f"/api-keys/{bystanders.pop()}")
                    bystanders.insert(0, admin.named_key([query], [connection], name=unique("by"))[0])
                elif step == 2:   # the callers' key: off, then on again
                    admin.ok("PATCH", f"/api-keys/{name}", {"active": False})
                    changes.append((started, time.monotonic(), ("off", None)))
                    until_each_made([load], CALLS_BETWEEN, since=changes[-1][1])
                    started = time.monotonic()
                    admin.ok("PATCH", f"/api-keys/{name}", {"active": True})
                else:             # the connection changes (its versions are rebound, not read again)
                    admin.ok("PATCH", f"/connections/{connection}", {"options": {"step": i}})
                changes.append((started, time.monotonic(), expect))
                until_each_made([load], CALLS_BETWEEN, since=changes[-1][1])   # calls that must see it
        calls = load.calls
        assert not [c for c in calls if c.status == 0 or c.status >= 500], statuses(calls)
        checked = 0
        for i, (_, returned, (state, version)) in enumerate(changes):
            next_start = changes[i + 1][0] if i + 1 < len(changes) else float("inf")
            seen = [c for c in calls if c.started > returned and c.ended < next_start]
            checked += len(seen)
            if state == "off":
                wrong = [c for c in seen if (c.status, c.code) != (401, "unauthorized")]
            else:
                wrong = [c for c in seen if c.status != 200 or c.body != [{"v": version}]]
            assert not wrong, (i, state, version, statuses(wrong), wrong[:2])
        assert checked > 200, checked
        # Every worker served the key: the changes reached all of them.
        by_worker = wait_until(lambda: (lambda w: w if len(w) == WORKERS else None)(
            runs_by_worker(superuser, key_id(superuser, name))), 5, 0.1, "runs of every worker")
        assert len(by_worker) == WORKERS, by_worker
        # Each worker read the whole catalog once, when it started; every change since was applied
        # from the change log.
        # (The metrics are flushed now and then: until they show every reload.)
        wait_until(lambda: counter(master.base, "gateway_catalog_reloads_total") >= WORKERS * len(changes), 10, 0.1,
                   lambda: f"{WORKERS * len(changes)} reloads: {counter(master.base, 'gateway_catalog_reloads_total')}")
        assert counter(master.base, "gateway_catalog_full_loads_total") == WORKERS
    finally:
        admin.close()


CLIENTS = 8
KEYS_EACH = 6
PROBES = 4   # calls on new connections after each change: the balancer spreads them over the workers


def test_concurrent_changes_are_each_exact_when_they_return(master, services, superuser):
    """``CLIENTS`` management clients at once, each creating keys and then switching them off.
    Concurrent calls share announcements and acknowledgement rounds; each must still return
    only once every worker serves its own change: the new key answers 200 with the right body
    on every call started after its create returned (never 401 unknown), and 401 on every call
    started after its deactivation returned."""
    setup = Api.over_http(master.base, services)
    try:
        connection = setup.connection()
        query = setup.query("SELECT 7 AS v", connection=connection)
    finally:
        setup.close()
    wrong: list = []
    made: list = []
    failures: list = []
    lock = threading.Lock()

    def probe(secret: str) -> list:
        out = []
        for _ in range(PROBES):
            reply = requests.get(f"{master.base}/q/{query}", headers={"X-API-Key": secret, "Connection": "close"},
                                 timeout=10)
            out.append((reply.status_code, reply.json()))
        return out

    def client() -> None:
        api = Api.over_http(master.base, services)
        try:
            for _ in range(KEYS_EACH):
                name, secret = api.named_key([query], [connection], name=unique("cc"))
                seen = probe(secret)
                bad = [s for s in seen if s != (200, [{"v": 7}])]
                api.ok("PATCH", f"/api-keys/{name}", {"active": False})
                off = probe(secret)
                bad += [s for s in off if s[0] != 401 or s[1].get("code") != "unauthorized"]
                with lock:
                    made.append(name)
                    wrong.extend(bad)
        except BaseException as exc:   # noqa: BLE001 - reported by the main thread
            with lock:
                failures.append(repr(exc))
        finally:
            api.close()

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, failures
    assert len(made) == CLIENTS * KEYS_EACH, len(made)
    assert not wrong, wrong[:5]
    # The probes reached every worker: the check covered the whole fleet.
    ids = [key_id(superuser, name) for name in made]
    workers = wait_until(lambda: (lambda w: w if len(w) == WORKERS else None)(
        {r[0] for r in superuser("SELECT DISTINCT worker FROM gw_run_history WHERE key_id = ANY(%s)", (ids,))}),
        5, 0.1, "runs of every worker")
    assert len(workers) == WORKERS, workers
