"""What N workers sharing one core cost against one worker on it: the coordination of a master's
workers (the bus, leases, history, metrics, the balancer) measured where it cannot hide behind
more CPU.

    .venv/bin/python -m loadtests.sharedcore --local-pg /tmp/sharedcore-pg --root <checkout>

Per layout (--layouts; by default 1, 2 and 4 balanced workers and 2 plain gthread workers, all
pinned to --cpu with their master), one master at a time on one store and one Redis: started, provisioned (the
lookup, loadtests/targets.py), warmed, then wrk with --connections keep-alive connections for
--duration seconds pinned to --wrk-cpu (random_aid.lua checks every body). --rounds rounds,
the layouts in an order rotated each round; a run with any error or wrong body is reported as
such. Prints one JSON line per run and a summary: each layout's req/s against one worker's in
the same round (median and range), and per call the gateway's CPU (master and workers) and
context switches, which a busy machine blurs less than throughput.
"""
from __future__ import annotations

import argparse
import json
import secrets
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from . import system, targets, wrk

LAYOUTS = {"1 worker": {"GATEWAY_WORKERS": "1"},
           "2 workers": {"GATEWAY_WORKERS": "2"},
           "4 workers": {"GATEWAY_WORKERS": "4"},
           "2 plain gthread": {"GATEWAY_WORKERS": "2",
                               "GATEWAY_WORKER_CLASS": "gunicorn.workers.gthread.ThreadWorker"},
           "4 plain gthread": {"GATEWAY_WORKERS": "4",
                               "GATEWAY_WORKER_CLASS": "gunicorn.workers.gthread.ThreadWorker"}}
DEFAULT_LAYOUTS = ["1 worker", "2 workers", "4 workers", "2 plain gthread"]


@contextmanager
def fleet_services(local_pg: str, pg_port: int, redis_port: int, redis_cpu: str | None) -> Iterator[tuple[dict, dict]]:
    """fleet.ops.local's PostgreSQL with the demo data and an empty store, and a Redis, for one run:
    ({url, store_url, redis_url, run_dir, max_aid}, the GATEWAY_SECRET_KEY every master shares
    to read the store's connection password)."""
    from fleet.ops.local import LocalPostgres
    from fleet.ops.local.demo import create_demo_data
    pg = LocalPostgres(local_pg, pg_port)
    pg.start()
    try:
        pg.ensure_database("demo")
        data_url = pg.url("demo")
        try:
            data = system.check_demo_table(data_url)
        except RuntimeError:
            create_demo_data(data_url)
            data = system.check_demo_table(data_url)
        run_dir = Path(local_pg) / "runs"
        redis, redis_url = targets.start_redis(port=redis_port, cpu=redis_cpu, run_dir=run_dir)
        try:
            system.recreate_database(data_url, "gwsharedcore")
            yield ({"url": data_url, "store_url": system.dsn_with_db(data_url, "gwsharedcore"),
                    "redis_url": redis_url, "run_dir": run_dir, "max_aid": data["max_aid"]},
                   {"GATEWAY_SECRET_KEY": secrets.token_urlsafe(32)})
        finally:
            targets.stop_process(redis)
    finally:
        pg.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local-pg", required=True)
    parser.add_argument("--local-pg-port", type=int, default=54592)
    parser.add_argument("--redis-port", type=int, default=63892)
    parser.add_argument("--port", type=int, default=18931)
    parser.add_argument("--root", type=Path, default=system.REPO, help="the checkout to run")
    parser.add_argument("--cpu", default="1")
    parser.add_argument("--wrk-cpu", default="0")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--duration", type=float, default=8)
    parser.add_argument("--warmup", type=float, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("loadtests/results/sharedcore.jsonl"))
    parser.add_argument("--layouts", default=",".join(DEFAULT_LAYOUTS),
                        help=f"comma-separated, the first is the reference; of: {', '.join(LAYOUTS)}")
    args = parser.parse_args()

    args.out.parent.mkdir(parents=True, exist_ok=True)
    names = [name.strip() for name in args.layouts.split(",")]
    results: dict[str, list[float]] = {name: [] for name in names}
    cpu_per_call: dict[str, list[float]] = {name: [] for name in names}
    with fleet_services(args.local_pg, args.local_pg_port, args.redis_port, args.wrk_cpu) as (data, secret):
        data_url, store_url, redis_url, run_dir = data["url"], data["store_url"], data["redis_url"], data["run_dir"]
        for round_no in range(args.rounds):
            order = names[round_no % len(names):] + names[:round_no % len(names)]
            for name in order:
                target = targets.start_gateway(port=args.port, cpu=args.cpu, store_url=store_url,
                                               redis_url=redis_url, run_dir=run_dir, root=args.root,
                                               extra_env={**LAYOUTS[name], **secret}, name=name.replace(" ", "-"))
                try:
                    targets.wait_healthy(target)
                    targets.provision(target, data_url)
                    env = {"API_KEY": target.api_key, "QUERY_PATH": target.query_path, "PARAM": target.param,
                           "MAX_ID": str(data["max_aid"])}
                    url = target.url("/")
                    wrk.run(url, connections=args.connections, duration_s=args.warmup, env=env, cpu=args.wrk_cpu)
                    cpu, switches = system.CpuMeter(target.process.pid), system.SwitchMeter(target.process.pid)
                    cpu.start()
                    switches.start()
                    result = wrk.run(url, connections=args.connections, duration_s=args.duration, env=env,
                                     cpu=args.wrk_cpu)
                    used, (voluntary, involuntary) = cpu.stop() or 0.0, switches.stop()
                finally:
                    targets.stop_process(target.process)
                line = {"round": round_no, "layout": name, "rps": round(result.rps, 1),
                        "errors": result.errors, "bodies": result.bodies,
                        # per call, the master and its workers: CPU, and context switches (voluntary, involuntary)
                        "cpu_us_per_call": round(used * 1e6 / max(1, result.requests), 1),
                        "switches_per_call": [round(voluntary / max(1, result.requests), 2),
                                              round(involuntary / max(1, result.requests), 2)],
                        "latency_us": result.latency_us, "at": time.strftime("%H:%M:%S"),
                        "loadavg": system.loadavg()}
                print(json.dumps(line), flush=True)
                with args.out.open("a") as out:
                    out.write(json.dumps(line) + "\n")
                results[name].append(result.rps if not result.error_count else float("nan"))
                cpu_per_call[name].append(line["cpu_us_per_call"])
    base = results[names[0]]
    for name, values in results.items():
        ratios = [v / b for v, b in zip(values, base, strict=True)]
        print(f"{name}: req/s {[round(v) for v in values]}; against {names[0]} in the same round: "
              f"median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}; "
              f"gateway CPU per call {[round(v) for v in cpu_per_call[name]]} us")


if __name__ == "__main__":
    main()
