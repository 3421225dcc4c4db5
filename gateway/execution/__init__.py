"""Running saved queries: per-worker session pools, prepared statements, output formats."""
