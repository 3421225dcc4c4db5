"""Live events across the fleet: runs and management changes from every worker and host,
through one bounded Redis stream.

Writers never add a Redis round trip to a call: each worker's history thread appends its
batch of runs as ONE stream entry (so the events cost one Redis command per batch, not one
per call); a management change appends one entry after its commit. A reader expands a
batch into one SSE event per run; the SSE id is set on the batch's last event, so a client
resumes after the last batch it received whole. Readers (``GET /events``, server-sent events) each hold a Redis
connection blocked in ``XREAD``, resuming from ``Last-Event-ID`` as long as that entry is
still within the stream's bound (``GATEWAY_EVENTS_MAXLEN``).

The stream is one key (``{events}``: one slot of a Redis Cluster). Through a failover the
entries the promoted replica had not received are gone, and a reader's ``Last-Event-ID`` may
then be ahead of the stream: it waits for newer entries (IDs keep rising with the clock),
so it misses the lost ones and nothing else. Writers drop their batches while the stream's
master is away (logged once per outage).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import orjson
import redis

from gateway.observe import batch_json

from .redis_client import RedisLink

if TYPE_CHECKING:
    from gateway.ports import Run

log = logging.getLogger("fleet.shared.events")

STREAM = "gw:{events}:stream"
POLL_MS = 1000  # a reader's longest XREAD: how soon a stream ends once its worker drains


class RedisEvents:
    def __init__(self, url: str, maxlen: int, max_readers: int, worker: str) -> None:
        self._link = RedisLink(url)
        self._redis = self._link.client(1.0)
        self._maxlen = maxlen
        self._readers = threading.BoundedSemaphore(max_readers)
        self._worker = worker
        self._failing = False
        # Set by fleet/server/gunicorn_conf.py: a draining worker ends its streams (the clients
        # resume elsewhere with Last-Event-ID) instead of holding its exit for the graceful timeout.
        self.draining: Callable[[], bool] = lambda: False

    # --- writers ------------------------------------------------------------------------
    def __call__(self, batch: Sequence[Run]) -> None:
        """A history observer: the batch's runs as one entry, one command."""
        runs = b"\n".join(batch_json(batch))   # encoded once for the access log too
        try:
            self._redis.xadd(STREAM, {"type": "runs", "data": runs}, maxlen=self._maxlen, approximate=True)
        except redis.RedisError as exc:
            if not self._failing:   # once per outage, not once per batch
                log.warning("events: cannot publish runs (%s); dropping them until Redis is back", exc)
            self._failing = True
            return
        if self._failing:
            log.warning("events: publishing runs again")
        self._failing = False

    def change(self, doc: dict) -> None:
        try:
            self._redis.xadd(STREAM, {"type": "change", "data": orjson.dumps(dict(doc, worker=self._worker))},
                             maxlen=self._maxlen, approximate=True)
        except redis.RedisError as exc:
            log.warning("events: could not publish a change (%s)", exc)

    # --- readers ------------------------------------------------------------------------
    def acquire_reader(self) -> bool:
        return self._readers.acquire(blocking=False)

    def read(self, last_id: str, block_ms: int = 15000) -> Iterator[bytes]:
        """Yield SSE frames from after ``last_id`` ('$': only new ones) until the worker
        drains; a comment line every ``block_ms`` keeps proxies from closing an idle stream."""
        conn = self._link.client(block_ms / 1000 + 5, connect_timeout_s=2, register=False)
        try:
            yield from self._frames(conn, last_id, block_ms)
        except redis.RedisError as exc:
            # The client reconnects with Last-Event-ID and resumes where it was.
            log.warning("events: a reader lost Redis (%s)", exc)
        finally:
            conn.close()
            self._readers.release()

    def _frames(self, conn: Any, last_id: str, block_ms: int) -> Iterator[bytes]:
        # conn: a redis.Redis answering bytes; Any because redis-py types every reply as a
        # union of bytes, str, int and None, whatever the connection decodes.
        if last_id == "$":  # pin "now" once, so nothing between two reads is missed
            newest = conn.xrevrange(STREAM, count=1)
            last_id = newest[0][0].decode() if newest else "0-0"
        yield b": connected\n\n"
        idle_ms = 0
        switches = self._link.switches()
        while not self.draining():
            if self._link.switches() != switches:   # Sentinel moved the master: resume there
                return
            entries = conn.xread({STREAM: last_id}, count=500, block=min(POLL_MS, block_ms))
            if not entries:
                idle_ms += min(POLL_MS, block_ms)
                if idle_ms >= block_ms:
                    idle_ms = 0
                    yield b": keep-alive\n\n"
                continue
            idle_ms = 0
            frames: list[bytes] = []
            for entry_id, fields in entries[0][1]:
                last_id = entry_id.decode()
                if fields[b"type"] == b"runs":
                    *first, final = fields[b"data"].split(b"\n")
                    frames.extend(b"event: run\ndata: " + run + b"\n\n" for run in first)
                    frames.append(b"id: " + entry_id + b"\nevent: run\ndata: " + final + b"\n\n")
                else:
                    frames.append(b"id: " + entry_id + b"\nevent: " + fields[b"type"] + b"\ndata: "
                                  + fields[b"data"] + b"\n\n")
            yield b"".join(frames)
