"""Block `limits`: admission under realistic limits, what it costs and how exact it is.

    .venv/bin/python -m loadtests.bench --block limits --local-pg /tmp/bench-pg --rounds 5 --duration 10

Two targets, each our gateway with one worker pinned to CPU 1 (`--target-cpu`), its own store database and its
own Redis (PostgreSQL, both Redis servers and wrk on CPU 0), each with the same 1,000 keys (`--keys`):

- `limits-on`: GATEWAY_ADMISSION=on; every key "rate_limit": "20/second" (burst 20); every client IP
  GATEWAY_RATE_LIMIT=1000/minute; GATEWAY_TRUST_PROXY=1, and every call comes from one of 1,000 addresses
  (X-Forwarded-For) with one of the 1,000 keys, drawn at random: 2,000 buckets shared through Redis;
- `limits-off`: GATEWAY_ADMISSION=off, the same keys and addresses.

Two phases:

1. **Cost** (interleaved rounds of both targets, as every closed-loop block): the lookup at wrk -c32. At the
   throughput one worker reaches, each key and each address is asked a few times a second, far below its limits,
   so an exact limiter refuses nothing: every 429 is a call the leased limiter refused that an exact one would have
   admitted. Worker CPU per call on/off and Redis commands per call, paired per round.
2. **At the limit** (`limits-on` alone, --rounds runs): all calls on `--hot-keys` keys (default 10), each asked
   far above its 20/second. An exact token bucket admits exactly burst + rate x T per key in T seconds (the buckets
   are full at the start: the keys were idle or far under their limit before); the leased one admits at most
   burst + rate x (T + GATEWAY_LEASE_MS) (fleet/leases.py). The report gives admitted / exact per run: below 1,
   the calls refused that an exact limiter would admit (leftovers of expired leases, which are dropped); above
   1, over-admission, which the bound caps.
"""
from __future__ import annotations

ON, OFF = 'limits-on', 'limits-off'
KEY_RATE = 20                  # calls a second per key (burst the same)
IP_RATE = '1000/minute'
CLIENT_IPS = 1000
