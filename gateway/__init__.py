"""gateway-fleet: saved SQL as governed HTTP endpoints."""
__version__ = "0.1.0"
