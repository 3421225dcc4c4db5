"""HTTP resources: the data plane, the Management API, health."""
