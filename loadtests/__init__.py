"""Load tests and the benchmark harness (see loadtests/bench.py and loadtests/PEER.md)."""
