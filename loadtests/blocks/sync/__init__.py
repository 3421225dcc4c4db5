"""Block `sync`: how long a management call takes, now that it returns only once every worker has applied it.

    .venv/bin/python -m loadtests.bench --block sync --local-pg /tmp/bench-pg --rounds 5 --changes 300

One gateway target, GATEWAY_WORKERS=4 (`--sync-workers`) pinned to `--target-cpu` (default CPU 1: with one core the
four share it), its own store database and its own Redis (with PostgreSQL on CPU 0). Cells, interleaved in rounds
rotated each round:

- `patch-key`: PATCH /api/v1/api-keys/bench, its "queries" grant alternating between two lists;
- `publish`: POST /api/v1/queries/account/publish, alternating versions 1 and 2 (the same SQL);

each with the fleet idle (c=0) and under a background wrk load on /q/account (c=N for each N in `--connections`,
default 8; wrk on CPU 0, from 1 s before the first change to the last). A run makes `--changes` changes one after the other (a pause of `--sync-pause-ms` between
them) on one keep-alive connection and times each call on the client, from sending the request to reading the
whole answer (time.perf_counter). Target: p99 < 20 ms.

The announce wait - from the PUBLISH of a change's generation to the last worker's acknowledgement - is read from
Redis MONITOR (server timestamps) during the run: for every PUBLISH of generation G, the first `HSET acks <worker>
g` with g >= G of each worker acking in the run. MONITOR costs Redis some CPU; the management call's own wait also
includes its polling (0.5 ms, doubling to 4 ms).
"""
