"""Driver options of a connection: the libpq parameters it may set."""
from __future__ import annotations

# libpq connection parameters a connection may set (QueryAPIGate's "driver options": any field of the
# body that is not one of FIELDS); they reach psycopg2.connect. Those that shape a session (``options``,
# timeouts, the application name) are the gateway's own and cannot be set.
DRIVER_OPTIONS = frozenset({"sslmode", "sslrootcert", "sslcert", "sslkey", "sslcrl", "sslpassword",
                            "sslnegotiation", "sslsni", "channel_binding", "gssencmode", "require_auth",
                            "target_session_attrs", "keepalives", "keepalives_idle", "keepalives_interval",
                            "keepalives_count", "tcp_user_timeout"})


def driver_options(options: object) -> dict:
    """The libpq parameters among a connection's stored ``options`` (others are kept, not applied)."""
    if not isinstance(options, dict):
        return {}
    return {k: str(v) for k, v in options.items() if k in DRIVER_OPTIONS and isinstance(v, (str, int))
            and not isinstance(v, bool)}
