"""What the fleet shares through Redis: the adapters of the gateway's ports (``gateway.ports``).

The invalidation bus (``bus``), the cache's purge bus and shared tier (``cache``), live events
(``events``), admission (``leases``: rate limits in ``rates``, quotas in ``quotas``,
``max_concurrent`` in ``concurrency``), and how a worker tells Redis is away (``reach``,
``degraded``); the one factory of Redis clients (``redis_client``, ``sentinel_watch``).
"""
