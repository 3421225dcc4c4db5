"""Deterministic cost of a cache hit against an uncached lookup in one worker's app (issue 14), for one or more
checkouts side by side: what timing cannot attribute on a noisy machine, counted.

    .venv/bin/python -m loadtests.cachecost --pg-url postgresql://postgres:...@127.0.0.1:5432/postgres \\
        --redis-url redis://:...@127.0.0.1:6379/0 [--root /path/to/base-checkout --root .] \\
        [--calls 3000] [--measure profile,opcodes,tracemalloc,cpu,callgrind]

Per root and target, a fresh process (this repo's .venv, ``PYTHONPATH`` the root) builds the app as a worker does
(``fleet.app.create_app``) on its own store database (``cachecost_<n>``, recreated), provisions through its
Management API the cache block's lookup twice, ``account`` (no cache_ttl) and ``account_cached`` (cache_ttl 600),
and one key granted both, then calls the WSGI app in process with one identical call: ``uncached`` is
``/q/account?aid=42`` (a database call each time), ``hit`` is ``/q/account_cached?aid=42`` (after the warm-up,
one hot entry). No sockets, no gunicorn: only what the gateway's code does per call. Per call:

- ``profile``: Python function calls (cProfile's ncalls summed);
- ``opcodes``: Python bytecodes executed (``sys.settrace`` opcode events);
- ``tracemalloc``: the peak of traced memory above the start of a call (median), in bytes;
- ``cpu``: CPU time of the calling thread and of the whole process (the history thread's work included), in us:
  timing, so noisy; the others are counts;
- ``callgrind``: instructions of the calling thread (valgrind's callgrind, ``Ir``), a run of twice ``--calls``
  minus a run of ``--calls`` (the start-up cancels out).

What a real server adds per call (gunicorn's parsing, the worker's poller and threads) is the same for both and is
not here: the cache block (``python -m loadtests.bench cache``) measures it, with its /health floor.
The data table ``pgbench_accounts`` is made in database ``bench`` if missing.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
VENV_PY = HERE.parent.parent / ".venv" / "bin" / "python"
ADMIN = "cachecost-admin-key-0123456789"
SECRET = "cachecost-secret-key-0123456789"
SQL = "SELECT aid, bid, abalance FROM pgbench_accounts WHERE aid = :aid"
PATHS = {"hit": "/q/account_cached", "uncached": "/q/account"}
MEASURES = ("profile", "opcodes", "tracemalloc", "cpu", "callgrind")


# --- the child: one checkout's app, in process, one target ------------------------------------------------
def child(args: argparse.Namespace) -> None:
    import gc
    import io
    import time

    import falcon.testing
    import psycopg2

    from fleet.app import create_app
    from gateway.settings import Settings

    data = json.loads(args.child)
    with tempfile.TemporaryDirectory() as home:
        settings = Settings(database_url=data["store_url"], redis_url=data["redis_url"], admin_key=ADMIN,
                            secret_key=SECRET, home=home, log_level="warning")
        app = create_app(settings)
        try:
            client = falcon.testing.TestClient(app)
            hdr = {"X-API-Key": ADMIN}
            dsn = psycopg2.extensions.parse_dsn(data["data_url"])
            connection = {"name": "demo", "db": "postgres", "host": dsn["host"], "port": int(dsn["port"]),
                          "user": dsn["user"], "password": dsn["password"], "database": dsn["dbname"]}
            query = {"sql": SQL, "connection_name": "demo", "parameters": {"aid": "int"}, "publish": True}
            for path, body in (("/api/v1/connections", connection),
                               ("/api/v1/queries", {"name": "account", **query}),
                               ("/api/v1/queries", {"name": "account_cached", "cache_ttl": 600, **query})):
                got = client.simulate_post(path, json=body, headers=hdr)
                assert got.status_code == 201, got.text
            got = client.simulate_post("/api/v1/api-keys", json={"name": "bench", "queries": ["account",
                                       "account_cached"], "connections": ["demo"]}, headers=hdr)
            assert got.status_code == 201, got.text
            environ = falcon.testing.create_environ(path=PATHS[args.target], query_string="aid=42",
                                                    headers={"X-API-Key": got.json["secret"]}, host="127.0.0.1")
            seen: list = []

            def start_response(status: str, headers: list, exc_info: object = None) -> None:
                seen.append((status, dict((k.lower(), v) for k, v in headers).get("x-cache")))

            def call() -> bytes:
                env = dict(environ)
                env["wsgi.input"] = io.BytesIO(b"")
                result = app(env, start_response)
                try:
                    return b"".join(result)
                finally:
                    if hasattr(result, "close"):
                        result.close()

            body = call()
            assert seen[-1][0].startswith("200") and b'"aid":42' in body.replace(b" ", b""), (seen, body)
            for _ in range(args.warmup):
                call()
            assert seen[-1] == ("200 OK", "hit" if args.target == "hit" else None), seen[-1]
            out: dict = {"body": body.decode()}
            n = args.calls
            gc.collect()
            gc.disable()   # one collector pass more or less in a run would swamp a per-call difference
            if args.mode == "profile":
                import cProfile
                import pstats
                profile = cProfile.Profile()
                profile.enable()
                for _ in range(n):
                    call()
                profile.disable()
                out["value"] = pstats.Stats(profile).total_calls / n  # type: ignore[attr-defined]
            elif args.mode == "opcodes":
                count = [0]

                def local(frame, event, arg):   # noqa: ANN001, ANN202
                    if event == "opcode":
                        count[0] += 1
                    return local

                def global_(frame, event, arg):   # noqa: ANN001, ANN202
                    frame.f_trace_opcodes = True
                    return local

                sys.settrace(global_)
                for _ in range(n):
                    call()
                sys.settrace(None)
                out["value"] = count[0] / n
            elif args.mode == "tracemalloc":
                import tracemalloc
                tracemalloc.start()
                peaks = []
                for _ in range(n):
                    tracemalloc.reset_peak()
                    before = tracemalloc.get_traced_memory()[0]
                    call()
                    peaks.append(tracemalloc.get_traced_memory()[1] - before)
                tracemalloc.stop()
                out["value"] = sorted(peaks)[n // 2]
            elif args.mode == "cpu":
                thread, process = time.thread_time(), time.process_time()
                for _ in range(n):
                    call()
                thread = time.thread_time() - thread
                time.sleep(1.0)   # the history thread's last batch
                out["value"] = [thread / n * 1e6, (time.process_time() - process) / n * 1e6]
            else:   # plain: the calls only (callgrind counts them)
                for _ in range(n):
                    call()
            gc.enable()
            assert all(s == ("200 OK", "hit" if args.target == "hit" else None) for s in seen[-n:]), set(seen)
            Path(args.out).write_text(json.dumps(out))
        finally:
            app.parts.close()


# --- the driver -------------------------------------------------------------------------------------------
def run_child(root: Path, index: int, args: argparse.Namespace, target: str, mode: str, calls: int,
              wrap: list[str]) -> dict:
    from .callcost import _callgrind_ir, _recreate  # the driver's side only (the child runs this file as a script)
    store_url = _recreate(args.pg_url, f"cachecost_{index}")
    spec = json.dumps({"store_url": store_url, "redis_url": args.redis_url,
                       "data_url": args.pg_url.rsplit("/", 1)[0] + "/bench"})
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [*[w.replace("{tmp}", tmp) for w in wrap], str(VENV_PY), str(HERE), "--child", spec, "--target",
               target, "--mode", mode, "--calls", str(calls), "--warmup", str(args.warmup), "--out", str(out)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        env["PYTHONPATH"] = str(root)
        env["PYTHONHASHSEED"] = "0"
        done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
        if done.returncode != 0 or not out.exists():
            raise SystemExit(f"{root} {target} {mode}: exit {done.returncode}\n{done.stderr[-3000:]}")
        result = json.loads(out.read_text())
        if wrap:
            # --separate-threads: one file per thread, the calling (main) thread's ends in -01
            (main,) = Path(tmp).glob("callgrind.out*-01")
            result["value"] = _callgrind_ir(main)
        return result


def measure(root: Path, index: int, args: argparse.Namespace, target: str, what: str) -> str:
    if what == "callgrind":
        wrap = ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--dump-line=no",
                "--callgrind-out-file={tmp}/callgrind.out.%p"]
        low = run_child(root, index, args, target, "plain", args.calls, wrap)["value"]
        high = run_child(root, index, args, target, "plain", 2 * args.calls, wrap)["value"]
        return f"{(high - low) / args.calls:,.0f}"
    value = run_child(root, index, args, target, what, args.calls, [])["value"]
    if what == "cpu":
        return f"{value[0]:.1f} / {value[1]:.1f}"
    return f"{value:,.1f}" if isinstance(value, float) else f"{value:,}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", action="append", type=Path, help="a checkout to measure (repeatable)")
    parser.add_argument("--pg-url")
    parser.add_argument("--redis-url")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--measure", default="profile,opcodes,tracemalloc,cpu")
    parser.add_argument("--child")
    parser.add_argument("--target", choices=sorted(PATHS))
    parser.add_argument("--mode", default="plain")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if not (args.pg_url and args.redis_url):
        parser.error("--pg-url and --redis-url are required")
    measures = args.measure.split(",")
    unknown = set(measures) - set(MEASURES)
    if unknown:
        parser.error(f"unknown measure(s): {', '.join(sorted(unknown))} (known: {', '.join(MEASURES)})")
    roots = [r.resolve() for r in (args.root or [HERE.parent.parent])]
    names = {"profile": "Python calls", "opcodes": "bytecodes", "tracemalloc": "peak bytes",
             "cpu": "CPU us thread / process", "callgrind": "instructions (thread)"}
    print(f"| checkout | call | {' | '.join(names[m] for m in measures)} |")
    print(f"|---|---|{'---|' * len(measures)}")
    for index, root in enumerate(roots):
        for target in ("hit", "uncached"):
            cells = [measure(root, index, args, target, m) for m in measures]
            print(f"| {root} | {target} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
