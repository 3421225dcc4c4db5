"""Block `controlplane`: what a management change costs at fleet scale - the catalog grown to thousands of queries
and keys, management-call latency with 4 (and 16, 64) workers, the time to create 10,000 keys through the API, the
data plane's single-caller latency with and without changes streaming, worker memory
(``python -m loadtests.bench controlplane``; run.py says how)."""
