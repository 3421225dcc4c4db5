"""Load-test scenarios (the locust user classes loadtests/locustfile.py imports), over ``provision`` (their queries and
keys through the Management API) and ``common`` (one locust process's shared state and the answer checks)."""
