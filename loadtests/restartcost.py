"""What a restart costs the callers of one master, seen by wrk (C, so the load generator adds little noise of its
own): latency p99 and max, and every error, over a wrk run with and without a SIGHUP reload in its middle.

    .venv/bin/python -m loadtests.restartcost --local-pg /tmp/restartcost-pg

For each worker class (--classes; the balanced `gthread` and gunicorn's plain gthread by default) and round: one
master with --workers workers on the default cores (one each, pinned), provisioned (the lookup), warmed; then two
wrk runs of --duration seconds, --connections keep-alive connections, every body checked: `steady` (nothing
happens) and `sighup` (the master is sent SIGHUP --at seconds in). A run's max latency against the steady run's
is the stall the reload adds. One JSON line per run.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from pathlib import Path

from . import system, targets, wrk
from .sharedcore import fleet_services

CLASSES = {"balanced": "gthread", "plain": "gunicorn.workers.gthread.ThreadWorker"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local-pg", required=True)
    parser.add_argument("--local-pg-port", type=int, default=54593)
    parser.add_argument("--redis-port", type=int, default=63893)
    parser.add_argument("--port", type=int, default=18932)
    parser.add_argument("--root", type=Path, default=system.REPO, help="the checkout to run")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--classes", default="balanced,plain")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--duration", type=float, default=8)
    parser.add_argument("--at", type=float, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("loadtests/results/restartcost.jsonl"))
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with fleet_services(args.local_pg, args.local_pg_port, args.redis_port, None) as (data, secret):
        for round_no in range(args.rounds):
            for name in [c.strip() for c in args.classes.split(",")]:
                extra = {"GATEWAY_WORKERS": str(args.workers), "GATEWAY_CPUS": "auto",
                         "GATEWAY_WORKER_CLASS": CLASSES[name], **secret}
                target = targets.start_gateway(port=args.port, cpu=None, store_url=data["store_url"],
                                               redis_url=data["redis_url"], run_dir=data["run_dir"], root=args.root,
                                               extra_env=extra, name=f"restart-{name}")
                try:
                    targets.wait_healthy(target)
                    targets.provision(target, data["url"])
                    env = {"API_KEY": target.api_key, "QUERY_PATH": target.query_path, "PARAM": target.param,
                           "MAX_ID": str(data["max_aid"])}
                    url = target.url("/")
                    wrk.run(url, connections=args.connections, duration_s=2, env=env)
                    for event in ("steady", "sighup"):
                        timer = None
                        if event == "sighup":
                            timer = threading.Timer(args.at, os.kill, (target.process.pid, signal.SIGHUP))
                            timer.start()
                        result = wrk.run(url, connections=args.connections, duration_s=args.duration, env=env)
                        if timer is not None:
                            timer.join()
                        line = {"round": round_no, "class": name, "event": event, "rps": round(result.rps, 1),
                                "latency_us": result.latency_us, "errors": result.errors, "bodies": result.bodies,
                                "statuses": getattr(result, "statuses", {}), "at": time.strftime("%H:%M:%S"),
                                "loadavg": system.loadavg()}
                        print(json.dumps(line), flush=True)
                        with args.out.open("a") as out:
                            out.write(json.dumps(line) + "\n")
                        time.sleep(3)       # the reloaded workers settle before the next run
                finally:
                    targets.stop_process(target.process)


if __name__ == "__main__":
    main()
