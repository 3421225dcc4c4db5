"""Block `logging`: what the access log (and the live event stream) cost a call.

    .venv/bin/python -m loadtests.bench --block logging --local-pg /tmp/bench-pg --rounds 5 --duration 10

Three targets, each our gateway with one worker pinned to CPU 1 (`--target-cpu`), its own store database and its
own Redis (PostgreSQL, every Redis server and wrk on CPU 0), provisioned with the same bodies, differing only in:

- `access-log-on`: GATEWAY_ACCESS_LOG=1, GATEWAY_ACCESS_LOG_SAMPLE=1 (every call logged: one JSON line each,
  formatted by the worker's history thread and written by its log listener thread to the target's log file);
- `access-log-off`: GATEWAY_ACCESS_LOG=0 (the baseline);
- `events-off`: GATEWAY_ACCESS_LOG=0 and GATEWAY_EVENTS=0 (no XADD of each history batch to the fleet's event
  stream either). Metrics have no switch: they are on in every target, so this is the floor the gateway's
  observability can reach without a code change.

GATEWAY_LOG_LEVEL=info everywhere (the access log is written at info). The `account` lookup (the oltp block's) at
wrk -c32 (`--connections`), interleaved rounds in an order rotated each round, after a warm-up of each target and
with a /health floor before and after, as the oltp block.

Per run, besides what every block records: the CPU of the gunicorn *worker* process alone (user + system of every
thread, the master left out) per call served, and the access-log lines the target wrote during the run per call
served (about 1 for `access-log-on`, 0 otherwise: proof the switch did what it says). Target: the access log costs
at most 3% of throughput (req/s on/off >= 0.97).
"""
from __future__ import annotations

ON, OFF, BARE = 'access-log-on', 'access-log-off', 'events-off'
NAMES = (ON, OFF, BARE)
THROUGHPUT_TARGET = 0.97   # access log on / off, req/s
