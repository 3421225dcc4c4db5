"""Block `scaleout`: throughput against the number of workers in one gunicorn master, ours and the peer's
(``python -m loadtests.bench scaleout``; run.py says how)."""
