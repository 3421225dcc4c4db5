"""Metrics and logs, kept off the hot path.

Both are derived from the run stream (``gateway.store.history``): a request thread only appends
its run to the worker's queue; the history thread hands each batch to the metrics and to
the access log. So a request never takes a logging lock or a metrics lock.

* Logs are JSON lines, written by one listener thread (``QueueHandler`` in front), so no
  lock is shared by request threads. The access log is sampled (``GATEWAY_ACCESS_LOG_SAMPLE``).
* Metrics use prometheus-client's multiprocess mode when ``PROMETHEUS_MULTIPROC_DIR`` is
  set (``fleet/server/gunicorn_conf.py`` sets one folder per master), so one scrape of any
  worker sees every worker of its master. Counters lag the calls by at most one history
  flush interval.
"""
from __future__ import annotations

import logging
import logging.handlers
import os
import queue
import random
import sys
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TextIO

import orjson

if TYPE_CHECKING:
    from .ports import Run

BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0, 2.0, 5.0, 10.0, 30.0)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        if getattr(record, "preformatted", False):
            return record.getMessage()
        doc = {"at": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
               "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage(),
               "pid": record.process}
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc).decode()


def setup_logging(level: str, stream: TextIO | None = None) -> logging.handlers.QueueListener:
    """Root logging through a queue: callers enqueue, one thread formats and writes."""
    records: queue.SimpleQueue = queue.SimpleQueue()
    output = logging.StreamHandler(stream or sys.stderr)
    output.setFormatter(JsonFormatter())
    listener = logging.handlers.QueueListener(records, output, respect_handler_level=False)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.handlers.QueueHandler):
            root.removeHandler(handler)
    root.addHandler(logging.handlers.QueueHandler(records))
    root.setLevel(level.upper())
    listener.start()
    return listener


def run_json(run: Run) -> bytes:
    """One run as the JSON object the access log and the live events carry."""
    at, rid, key_id, query, version, status, code, rows, duration_ms, worker, _ = run
    return orjson.dumps({"at": at, "request_id": rid, "key_id": key_id, "query": query, "version": version,
                         "status": status, "code": code, "rows": rows, "duration_ms": round(duration_ms, 3),
                         "worker": worker})


class BatchJson:
    """Every run of a batch as ``run_json``, made once for all the observers that send it on (the
    access log and the live events: the history thread hands each batch to one after the other),
    not once by each. Per thread: each worker's history thread has its own batches."""

    __slots__ = ("_local",)

    def __init__(self) -> None:
        self._local = threading.local()

    def __call__(self, batch: Sequence[Run]) -> list[bytes]:
        local = self._local
        if getattr(local, "batch", None) is not batch:   # held until the next batch: its id is not reused
            local.lines = [run_json(run) for run in batch]
            local.batch = batch
        return local.lines


batch_json = BatchJson()


class AccessLog:
    """A history observer: one JSON line per sampled run, written as one record per batch."""

    def __init__(self, sample: float, logger: logging.Logger | None = None) -> None:
        self._sample = sample
        self._log = logger or logging.getLogger("gateway.access")

    def __call__(self, batch: Sequence[Run]) -> None:
        sample = self._sample
        if sample >= 1.0:
            lines = batch_json(batch)
        else:   # only the sampled runs are encoded
            lines = [run_json(run) for run in batch if random.random() < sample]
        if lines:
            self._log.info(b"\n".join(lines).decode(), extra={"preformatted": True})


class Metrics:
    """Prometheus metrics of one worker; a history observer plus gauges read each flush."""

    def __init__(self, gauges: dict[str, Callable[[], int]]) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.registry = CollectorRegistry()
        reg = self.registry
        self.requests = Counter("gateway_requests", "Data-plane calls by query, status and code",
                                ["query", "status", "code"], registry=reg)
        self.latency = Histogram("gateway_request_duration_seconds", "Data-plane call latency in the worker",
                                 ["query"], buckets=BUCKETS, registry=reg)
        self.rows = Counter("gateway_rows_returned", "Rows returned by data-plane calls", ["query"], registry=reg)
        self.dropped = Counter("gateway_history_dropped", "Runs dropped because the history queue was full",
                               registry=reg)
        self.fallbacks = Counter("gateway_redis_fallbacks", "Admission decisions made by the local fallback "
                                 "while Redis was unreachable", registry=reg)
        self.reloads = Counter("gateway_catalog_reloads", "Catalog reloads from the store", registry=reg)
        self.full_loads = Counter("gateway_catalog_full_loads", "Catalog reloads that read the whole catalog "
                                  "(the others applied only the changed rows)", registry=reg)
        self.front_closed = Counter("gateway_front_closed", "Connections the worker's front closed before their "
                                    "request was whole, by reason: timeout, malformed_request, headers_too_large, "
                                    "payload_too_large, unsupported_transfer_coding, per_client, evicted, "
                                    "evicted_idle", ["reason"], registry=reg)
        self.loop_answers = Counter("gateway_loop_answers", "Calls answered from memory on the server's loop "
                                    "instead of a thread", registry=reg)
        self.queue_depth = Gauge("gateway_history_queue_depth", "Runs waiting to be stored",
                                 multiprocess_mode="livesum", registry=reg)
        self.generation = Gauge("gateway_catalog_generation", "Catalog generation served",
                                multiprocess_mode="livemin", registry=reg)
        self.pool_sessions = Gauge("gateway_pool_sessions", "Open data-database sessions",
                                   multiprocess_mode="livesum", registry=reg)
        self.bus_connected = Gauge("gateway_bus_connected", "Workers connected to the bus",
                                   multiprocess_mode="livesum", registry=reg)
        self._gauges = gauges
        self._last = {"dropped": 0, "fallbacks": 0, "reloads": 0, "full_loads": 0, "loop_answers": 0}

    def __call__(self, batch: Sequence[Run]) -> None:
        # The counters are summed over the batch and added once per label set: every inc() or
        # observe() is a labels() lookup under a lock and, in multiprocess mode, a getpid(2) and a
        # write to the mmap, and a batch is hundreds of runs of a few queries. Each observation
        # stays one observe() (its bucket).
        calls: dict[tuple[str | None, int, str | None], int] = {}
        rows_by: dict[str | None, int] = {}
        observe: dict[str | None, Callable[[float], None]] = {}
        latency = self.latency
        for _, _, _, query, version, status, code, rows, duration_ms, _, _ in batch:
            label = query if version is not None else "-"   # unknown names never become labels
            labels = (label, status, code)
            calls[labels] = calls.get(labels, 0) + 1
            into = observe.get(label)
            if into is None:
                into = observe[label] = latency.labels(label).observe
            into(duration_ms / 1000)
            if rows:
                rows_by[label] = rows_by.get(label, 0) + rows
        requests, rows_counter = self.requests, self.rows
        for (label, status, code), count in calls.items():
            requests.labels(label, str(status), code or "").inc(count)
        for label, count in rows_by.items():
            rows_counter.labels(label).inc(count)
        self.tick()

    def tick(self) -> None:
        values = {name: read() for name, read in self._gauges.items()}
        for name, counter in (("dropped", self.dropped), ("fallbacks", self.fallbacks), ("reloads", self.reloads),
                              ("full_loads", self.full_loads), ("loop_answers", self.loop_answers)):
            delta = values.get(name, 0) - self._last[name]
            if delta > 0:
                counter.inc(delta)
                self._last[name] = values[name]
        self.queue_depth.set(values.get("queue_depth", 0))
        self.generation.set(values.get("generation", 0))
        self.pool_sessions.set(values.get("pool_sessions", 0))
        self.bus_connected.set(1 if values.get("bus_connected", True) else 0)

    def exposition(self) -> bytes:
        from prometheus_client import CollectorRegistry, generate_latest
        if not self.multiprocess:
            self.tick()
            return generate_latest(self.registry)
        from prometheus_client import multiprocess
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry)
