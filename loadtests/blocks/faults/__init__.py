"""Block `faults`: the faults of an operator's day, one at a time, under a load that checks every body - PostgreSQL
restarted or killed, Redis killed with its data (and a quota'd key's count), a worker or a whole master killed, a
reload, a rolling reload, max_requests recycling - and per fault the calls, what was not 2xx, wrong bodies and 500s
(both must be 0), the time to recovery, the latency in the fault's window and what was lost
(``python -m loadtests.bench faults``; run.py says how, render.py writes docs/bench/<date>-faults.md)."""
