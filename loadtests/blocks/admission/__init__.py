"""Block `admission`: what shared rate limits and quotas cost a call.

    .venv/bin/python -m loadtests.bench --block admission --local-pg /tmp/bench-pg --rounds 5 --duration 10

Two targets, each our gateway with one worker pinned to CPU 1 (`--target-cpu`), its own store database and its
own Redis (PostgreSQL, both Redis servers and wrk on CPU 0), provisioned with the same bodies:

- `admission-on`: GATEWAY_ADMISSION=on, GATEWAY_RATE_LIMIT=1000000/second (the per-IP limit, every call), and the
  key has "rate_limit": "1000000/second" and "quota": {"calls": 10^9, "per": "day"}: three shared buckets per call,
  none of them ever refuses, so the calls served are the same work as without admission;
- `admission-off`: GATEWAY_ADMISSION=off (the same key body; nothing is limited or counted).

The `account` lookup (the oltp block's) at wrk -c32 (`--connections`), interleaved rounds rotated each round,
after a warm-up of each target and with a /health floor before and after, as the oltp block.

Per run, besides what every block records: the CPU of the gunicorn *worker* processes alone (user + system from
/proc, every thread, the master left out) per call served, and Redis' commands during the run (INFO commandstats,
before and after, less the INFO calls themselves) per call served - three ways, as commandstats counts the commands
a script runs too: every command, every command but the event stream's XADD (fleet.shared.events appends every run), and
the scripts alone (EVALSHA: the round trips of the leases and the bus' heartbeat). Targets: CPU per call on/off
<= 1.10, Redis commands per call < 0.1 at steady state (the bus' heartbeats are in the count: Redis traffic too).
"""
from __future__ import annotations

ON, OFF = 'admission-on', 'admission-off'
CPU_TARGET = 1.10      # worker CPU per call, on / off
REDIS_TARGET = 0.1     # Redis commands per call, admission on
