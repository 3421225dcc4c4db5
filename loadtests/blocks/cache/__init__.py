"""Block `cache`: issue 14's benchmark of the response cache (loadtests/blocks/cache/run.py), and its goals."""

THROUGHPUT_GOAL = 1.5     # cached / uncached requests a second at 32 connections, every round
P50_GOAL = 0.7            # cached / uncached single-caller p50, every round (at most)
PEER_GOAL = 5.0           # cached / QueryAPIGate 0.43.0 with its Redis cache, 32 connections, every round
WRITE_BOUND_MS = 100.0    # a write's answer to no worker serving the older body (docs/cache.md), pooled p99

UNCACHED, CACHED, PEER = 'uncached', 'cached', 'peer'
