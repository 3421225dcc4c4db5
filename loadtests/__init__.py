"""Load tests and the benchmark harness, run from a checkout (not in the product's wheel; the `load` extra has its
dependencies): ``python -m loadtests.bench`` (bench.py), the blocks in loadtests/blocks/, the locust scenarios
(locustfile.py), the peer (peer.py, PEER.md). See loadtests/README.md."""
