"""Metrics and the access log, through real gunicorn masters (``gateway/observe.py``).

- ``/metrics`` of one master sums the calls of all its workers (prometheus-client's
  multiprocess mode, one folder per master), behind ``GATEWAY_METRICS_TOKEN`` (off for
  everyone without one), and an unknown query name never becomes a label;
- the access log: JSON lines written by each worker's history thread, one per call with a
  sample of 1, none with ``GATEWAY_ACCESS_LOG=0``, about the share asked for with 0.5.

Which worker served a call is read from the run history's ``worker`` field.
"""
from __future__ import annotations

import json
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from helpers.history import wait_history_workers
from helpers.masters import start_masters
from helpers.util import METRICS_TOKEN, unique

TOKEN = "metrics-" + unique("token")


@pytest.fixture(scope="module")
def masters(services, tmp_path_factory):
    """Three masters on the session's store and Redis: 2 workers, sample 1, metrics behind a
    token of their own; 1 worker, sample 0.5; 1 worker, access log off and no metrics token.
    Started together."""
    home = lambda: tmp_path_factory.mktemp("observe-home")  # noqa: E731
    started = start_masters(services, home,
                            {"workers": 2, "log_level": "info", "metrics_token": TOKEN},
                            {"workers": 1, "log_level": "info", "access_log_sample": "0.5"},
                            {"workers": 1, "log_level": "info", "access_log": "0", "metrics_token": ""})
    try:
        yield dict(zip(("full", "half", "off"), started))
    finally:
        for master in started:
            master.stop()


def scrape(base: str, token: str = METRICS_TOKEN) -> dict:
    reply = requests.get(base + "/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert reply.status_code == 200, reply.text[:300]
    samples: dict = {}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def requests_total(samples: dict, **labels) -> float:
    return sum(value for got, value in samples.get("gateway_requests_total", [])
               if all(got.get(k) == v for k, v in labels.items()))


def calls_on_every_worker(base: str, ep, superuser, workers: int = 2, limit: int = 300) -> dict:
    """Calls on new connections until the run history shows ``workers`` workers served some:
    {request_id: worker}."""
    served: dict = {}
    while len(set(served.values())) < workers:
        assert len(served) < limit, f"{limit} calls, all served by {set(served.values())}"
        ids = []
        for _ in range(8):
            reply = requests.get(f"{base}/q/{ep.query}", headers={"X-API-Key": ep.secret, "Connection": "close"},
                                 timeout=30)
            assert reply.status_code == 200, reply.text
            ids.append(reply.headers["X-Request-Id"])
        found = wait_history_workers(superuser, ids)
        assert len(found) == len(ids), "runs missing from the history"
        served.update(found)
    return served


def poll(predicate, timeout_s: float = 10, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)


# --- metrics ------------------------------------------------------------------------------
def test_one_scrape_sums_the_calls_of_both_workers(gunicorn, http_endpoint, superuser):
    ep = http_endpoint("SELECT 1 AS one")
    served = calls_on_every_worker(gunicorn.base, ep, superuser)
    per_worker = {w: sum(1 for v in served.values() if v == w) for w in set(served.values())}
    assert len(per_worker) == 2 and all(per_worker.values()), per_worker
    # The history thread hands a batch to the metrics before it stores it: once the runs
    # are in the store, every worker's counters hold them; poll all the same.
    total = poll(lambda: (lambda n: n if n == len(served) else None)(
        requests_total(scrape(gunicorn.base), query=ep.query, status="200")))
    assert total == len(served), (requests_total(scrape(gunicorn.base), query=ep.query), per_worker)
    # Whichever worker answers a scrape (each is a new connection), it sees the same sum.
    for _ in range(4):
        assert requests_total(scrape(gunicorn.base), query=ep.query, status="200") == len(served)
    samples = scrape(gunicorn.base)
    latency = [v for labels, v in samples["gateway_request_duration_seconds_count"] if labels["query"] == ep.query]
    assert latency == [len(served)]
    assert {"gateway_history_queue_depth", "gateway_catalog_generation", "gateway_pool_sessions"} <= set(samples)


def test_unknown_query_names_never_become_labels(gunicorn, http_endpoint, superuser):
    ep = http_endpoint("SELECT 1 AS one")
    before = requests_total(scrape(gunicorn.base), query="-", status="404")
    names = [unique("nosuch"), "x" * 60, "evil\"} 1\nfake_metric 2"]
    ids = []
    for name in names:
        reply = requests.get(f"{gunicorn.base}/q/{requests.utils.quote(name, safe='')}",
                             headers={"X-API-Key": ep.secret}, timeout=10)
        assert reply.status_code == 404 and reply.json()["code"] == "query_not_found", reply.text
        ids.append(reply.headers["X-Request-Id"])
    assert len(wait_history_workers(superuser, ids)) == len(ids)
    after = poll(lambda: (lambda n: n if n >= before + len(names) else None)(
        requests_total(scrape(gunicorn.base), query="-", status="404")))
    assert after and after >= before + len(names)
    text = requests.get(gunicorn.base + "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"},
                        timeout=10).text
    for name in names[:2]:
        assert name not in text
    assert "fake_metric" not in text
    labels = {s.labels.get("query") for family in text_string_to_metric_families(text) for s in family.samples}
    assert not labels & set(names), labels & set(names)


def test_metrics_token(masters):
    base = masters["full"].base
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
                    {"Authorization": f"Bearer {TOKEN}x"}, {"Authorization": f"Basic {TOKEN}"},
                    {"Authorization": f"Bearer {METRICS_TOKEN}"}):   # another master's token
        got = requests.get(base + "/metrics", headers=headers, timeout=10)
        assert got.status_code == 401, (headers, got.text)
        assert got.json()["code"] == "unauthorized" and got.headers["WWW-Authenticate"].startswith("Bearer")
        assert "gateway_" not in got.text
    assert "gateway_history_queue_depth" in scrape(base, TOKEN)


def test_metrics_without_a_token_configured_reveal_nothing(masters):
    """Least privilege by default: a master with no GATEWAY_METRICS_TOKEN serves /metrics to
    nobody, whatever is sent (before, it served every query's name and counts to anyone)."""
    base = masters["off"].base
    for headers in ({}, {"Authorization": f"Bearer {METRICS_TOKEN}"}, {"Authorization": "Bearer "}):
        got = requests.get(base + "/metrics", headers=headers, timeout=10)
        assert (got.status_code, got.json()["code"]) == (403, "metrics_disabled"), (headers, got.text)
        assert "gateway_" not in got.text and "query" not in got.text


# --- the access log -----------------------------------------------------------------------
def access_lines(master) -> list[dict]:
    lines = []
    for raw in master.log_path.read_text(errors="replace").splitlines():
        if not raw.startswith("{"):
            continue
        try:
            doc = json.loads(raw)
        except ValueError:
            continue
        if "request_id" in doc and "status" in doc:
            lines.append(doc)
    return lines


def make_calls(master, ep, count: int, close: bool = False) -> list[str]:
    ids = []
    with requests.Session() as session:
        headers = {"X-API-Key": ep.secret, **({"Connection": "close"} if close else {})}
        for _ in range(count):
            reply = session.get(f"{master.base}/q/{ep.query}", headers=headers, timeout=30)
            assert reply.status_code == 200, reply.text
            ids.append(reply.headers["X-Request-Id"])
    return ids


def test_access_log_one_line_per_call(masters, endpoint, superuser):
    master = masters["full"]
    ep = endpoint("SELECT 1 AS one")
    ids = make_calls(master, ep, 40, close=True)
    workers = wait_history_workers(superuser, ids)
    assert len(workers) == len(ids)
    # The access log is written when the history thread hands the batch to its observers,
    # before the COPY; the log listener thread writes it out: poll the file.
    lines = poll(lambda: (lambda got: got if {d["request_id"] for d in got} >= set(ids) else None)(
        [d for d in access_lines(master) if d["request_id"] in set(ids)]))
    assert lines, f"access lines missing:\n{master.log_tail()}"
    assert sorted(d["request_id"] for d in lines) == sorted(ids)  # exactly one line each
    for doc in lines:
        assert doc["query"] == ep.query and doc["status"] == 200 and doc["rows"] == 1 and doc["code"] is None
        assert doc["version"] == 1 and isinstance(doc["duration_ms"], float | int)
        assert doc["worker"] == workers[doc["request_id"]]
    # A refused call is logged too, with its code.
    reply = requests.get(f"{master.base}/q/{ep.query}", headers={"X-API-Key": "gw_nope_nope"}, timeout=10)
    assert reply.status_code == 401
    rid = reply.headers["X-Request-Id"]
    refused = poll(lambda: [d for d in access_lines(master) if d["request_id"] == rid])
    assert refused and refused[0]["code"] == "unauthorized" and refused[0]["status"] == 401


def test_access_log_off(masters, endpoint, superuser):
    master = masters["off"]
    ep = endpoint("SELECT 1 AS one")
    ids = make_calls(master, ep, 30)
    assert len(wait_history_workers(superuser, ids)) == len(ids)
    # A sleep that is the test: a flush interval and more, so the log listener had every chance to
    # write a line it should not (nothing announces that it wrote nothing).
    time.sleep(0.5)
    assert not access_lines(master), master.log_tail()


def test_access_log_sample(masters, endpoint, superuser):
    master = masters["half"]
    ep = endpoint("SELECT 1 AS one")
    ids = make_calls(master, ep, 300)
    assert len(wait_history_workers(superuser, ids)) == len(ids)
    time.sleep(0.5)   # a flush interval and more: the sampled lines are written (none announces the last)
    logged = [d["request_id"] for d in access_lines(master) if d["request_id"] in set(ids)]
    assert len(logged) == len(set(logged))
    # Binomial(300, 0.5): standard deviation 8.7 calls; the bounds are more than 5 of them away.
    assert 0.3 * len(ids) <= len(logged) <= 0.7 * len(ids), len(logged)


def test_a_batch_is_counted_per_run(monkeypatch):
    """The observer sums a batch's counters per label set before adding them: every run is still
    counted once, its rows added, its latency observed in its own bucket."""
    from gateway.observe import Metrics
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    metrics = Metrics({})
    run = lambda query, version, status, code, rows, ms: (0.0, "r", 1, query, version, status, code, rows, ms,  # noqa: E731
                                                           "w", True)
    batch = [run("a", 1, 200, None, 2, 3.0), run("a", 1, 200, None, 5, 700.0), run("b", 2, 200, None, None, 1.0),
             run("a", 1, 400, "invalid_paging", None, 1.0), run("nope", None, 404, "query_not_found", None, 1.0),
             run("other", None, 404, "query_not_found", None, 1.0)]
    metrics(batch)
    metrics(batch[:1])
    value = metrics.registry.get_sample_value
    assert value("gateway_requests_total", {"query": "a", "status": "200", "code": ""}) == 3
    assert value("gateway_requests_total", {"query": "a", "status": "400", "code": "invalid_paging"}) == 1
    assert value("gateway_requests_total", {"query": "b", "status": "200", "code": ""}) == 1
    assert value("gateway_requests_total", {"query": "-", "status": "404", "code": "query_not_found"}) == 2
    assert value("gateway_requests_total", {"query": "nope", "status": "404", "code": "query_not_found"}) is None
    assert value("gateway_rows_returned_total", {"query": "a"}) == 9
    assert value("gateway_rows_returned_total", {"query": "b"}) is None
    assert value("gateway_request_duration_seconds_count", {"query": "a"}) == 4
    assert value("gateway_request_duration_seconds_sum", {"query": "a"}) == pytest.approx((3 + 700 + 1 + 3) / 1000)
    assert value("gateway_request_duration_seconds_count", {"query": "-"}) == 2


def test_a_batch_is_encoded_once_for_the_access_log_and_the_events():
    from gateway.observe import AccessLog, BatchJson, batch_json
    run = (1.5, "rid", 7, "q\t1", 2, 200, None, 3, 1.23456, "w:1", True)
    batch = [run, (*run[:5], 400, "invalid_paging", None, *run[8:])]
    shared = BatchJson()
    lines = shared(batch)
    assert shared(batch) is lines                       # the second observer gets the same encoding
    assert shared(list(batch)) is not lines            # another batch (equal or not) is encoded anew
    assert [json.loads(line) for line in lines] == [
        {"at": 1.5, "request_id": "rid", "key_id": 7, "query": "q\t1", "version": 2, "status": 200, "code": None,
         "rows": 3, "duration_ms": 1.235, "worker": "w:1"},
        {"at": 1.5, "request_id": "rid", "key_id": 7, "query": "q\t1", "version": 2, "status": 400,
         "code": "invalid_paging", "rows": None, "duration_ms": 1.235, "worker": "w:1"}]

    class Lines:
        """What AccessLog calls on its logger."""

        def __init__(self):
            self.texts = []

        def info(self, text, extra=None):
            self.texts.append(text)

    written = Lines()
    AccessLog(1.0, logger=written)(batch)      # type: ignore[arg-type]
    assert written.texts == [b"\n".join(batch_json(batch)).decode()]
    sampled = Lines()
    AccessLog(0.0, logger=sampled)(batch)      # type: ignore[arg-type]
    assert sampled.texts == []
