"""Reference designs the limits block measures beside our admission, implemented in the harness as
alternatives of the gateway's ports (gateway/ports.py), and the WSGI factories that run the gateway with them:
``fixed_window`` (envoyproxy/ratelimit's algorithm) and ``envoy_app`` (the gateway with it). Not part of the
product: nothing in gateway/ or fleet/ imports them."""
