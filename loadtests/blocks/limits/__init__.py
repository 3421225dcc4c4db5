"""Block `limits`: admission under realistic limits, what it costs and how exact it is, beside two reference
designs on the same machine, the same Redis build and the same load (issue 26; loadtests/README.md, "The limits
block").

    .venv/bin/python -m loadtests.bench --block limits --local-pg /tmp/bench-pg --mix both --rounds 3 --duration 10

Targets (provision.py: `--limits-targets` picks some), one worker each on CPU 1 with its own store and Redis:
limits-on and limits-off (our gateway, GATEWAY_ADMISSION on and off), limits-envoy (envoyproxy/ratelimit's fixed
windows as the gateway's admission, loadtests/peers/) and limits-qag (QueryAPIGate 0.43.0 with its Redis limits).
Mixes: mixes.py. Phases: the cost, per mix, in interleaved rounds at -c32 and at -c1 (every latency kept and
pooled); then the accuracy at 1x, 2x and 10x the limit, open loop (accuracy.py, drive.py), against an exact token
bucket on the same arrivals and each design's own rule (reference.py)."""
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
