"""What makes many processes one gateway: shared state in Redis, the invalidation bus,
the gunicorn configuration and the local runner."""
