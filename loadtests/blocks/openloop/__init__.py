"""Block `openloop`: latency against offered load where oha is not installed - wrk for capacity, then a small
open-loop generator in Python (``python -m loadtests.bench openloop``; run.py says how). Its report is the oha
block's tables and plot, with the generator's own lag and CPU."""
