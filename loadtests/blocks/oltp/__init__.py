"""Block `oltp`: the saved query `account` (SELECT aid, bid, abalance FROM pgbench_accounts WHERE aid = :aid) called
as GET /q/account?aid=<random 1..1,000,000> with an X-API-Key, at 32 connections and at 1, on our gateway and on
its peer (QueryAPIGate 0.43.0). Its report is the closed-loop report that the admission and logging blocks build on.

    .venv/bin/python -m loadtests.bench --block oltp --local-pg /tmp/bench-pg --rounds 5 --duration 10
"""
