"""Load-test scenarios: what each one calls, with which key, and what counts as a right answer.

- ``provision``: the saved queries and keys every scenario needs, created through the Management API (the same
  bodies a user's script would send); used by the locust ``test_start`` listener and by ``python -m
  loadtests.scenarios.provision`` (which writes the secrets to a file for oha / wrk runs).
- ``common``: the shared state of one locust process (secrets, the newest published version) and small helpers.
- ``lookup``, ``page``, ``write``, ``ratelimit``, ``churn``: the locust user classes (loadtests/locustfile.py
  imports them all).
"""
