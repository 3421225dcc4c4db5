"""Block `limits`: admission under realistic limits, what it costs and how exact it is, beside two reference
designs on the same machine, the same Redis build and the same load (issue 26).

    .venv/bin/python -m loadtests.bench --block limits --local-pg /tmp/bench-pg --mix both --rounds 3 --duration 10

Targets, each one worker pinned to CPU 1 (`--target-cpu`) with its own store database and its own Redis server
(PostgreSQL, the Redis servers and the load generators on CPU 0); `--limits-targets` picks some:

- `limits-on`: our gateway, GATEWAY_ADMISSION=on (fleet/leases.py), GATEWAY_RATE_LIMIT=1000/minute per client
  address, GATEWAY_TRUST_PROXY=1 (each call's address from X-Forwarded-For);
- `limits-off`: the same with GATEWAY_ADMISSION=off (the bus heartbeats and the event stream still use Redis);
- `limits-envoy`: the same gateway with envoyproxy/ratelimit's algorithm as its admission (fixed windows, one
  pipelined round trip per call, a near-cache of keys over their limit): loadtests/peers/fixed_window.py, run
  through loadtests/peers/envoy_app.py - a faithful reimplementation in the harness, not envoy itself;
- `limits-qag`: QueryAPIGate 0.43.0 with QUERYAPIGATE_REDIS_URL (its shared rate limits and quotas),
  QUERYAPIGATE_RATE_LIMIT=1000/minute, QUERYAPIGATE_TRUST_PROXY=1.

Mixes (`--mix uniform|skewed|both`, mixes.py): `uniform`, 1,000 keys at 20/second and 1,000 addresses, drawn
evenly; `skewed`, 10,000 keys (20/second, burst 40, 100,000 calls a day), the hottest 100 making half the calls,
10,000 addresses. Each target gets each mix's keys through its own Management API, once per run.

Phases:

1. **Cost**, per mix (interleaved rounds, every cell once a round in a rotated order, the other targets frozen):
   the lookup at wrk -c32 (throughput, worker CPU per call, Redis commands, scripts, reads (round trips) and CPU
   per call, paired per round against limits-off) and at wrk -c1 -t1 (a single caller's latency, every call's
   latency kept so the rounds pool into one p99).
2. **Accuracy** (the last mix chosen, skewed when it is): `--accuracy-keys` keys of the hot set driven at 1x, 2x
   and 10x their 20/second, open loop with Poisson arrivals (drive.py), every call's send time and answer
   recorded; compared offline with what an exact token bucket (20/s, the mix's burst, full at the start) admits
   for the same arrivals (reference.py), and with each design's own rule.
"""
from __future__ import annotations

ON, OFF, ENVOY, QAG = 'limits-on', 'limits-off', 'limits-envoy', 'limits-qag'
TARGETS = {'on': ON, 'off': OFF, 'envoy': ENVOY, 'qag': QAG}
KEY_RATE = 20                  # calls a second per key
IP_RATE = '1000/minute'
CLIENT_IPS = 1000              # the uniform mix's (kept for the reports of runs before the mixes)

# Issue 26's goals, judged on the worst round (render_cost.py)
GOAL_CPU = 1.10                # worker CPU per call, admission on / off, at most
GOAL_RPS = 0.90                # throughput on / off, at least
GOAL_ROUND_TRIPS = 0.05        # Redis round trips per call (on minus off), at most
GOAL_REDIS_US = 5.0            # Redis CPU per call (on minus off), at most
GOAL_P99_MS = 0.3              # a single caller's p99, on minus off, at most
