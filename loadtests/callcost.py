"""Deterministic cost of one lookup call (the oltp block's ``/q/account?aid=N``) in one worker's app, for two
checkouts side by side: what timing cannot attribute on a noisy machine, counted.

    .venv/bin/python -m loadtests.callcost --pg-url postgresql://postgres:...@127.0.0.1:5432/postgres \\
        --redis-url redis://:...@127.0.0.1:6379/0 --root /path/to/base-checkout --root . \\
        [--calls 2000] [--measure profile,strace,callgrind]

Per root, a fresh process (the interpreter is this repo's .venv; ``PYTHONPATH`` is the root) builds the app as a
worker does (``fleet.app.create_app``) on its own store database (``cc_<n>``, recreated), provisions the bench's
connection, query and key through its Management API, and calls the WSGI app in process with one identical
lookup (``aid=42``): no sockets, no gunicorn, only what the gateway's code does per call. Measures, per call:

- ``profile``: Python function calls (cProfile's ncalls summed) and the functions whose count differs most;
- ``strace``: system calls of the whole process (``strace -c -f``), a run of ``--calls`` minus a run of none;
- ``callgrind``: instructions (valgrind's callgrind, ``Ir``) of the whole process and of the request thread, a run of
  twice ``--calls`` minus a run of ``--calls`` (so one-off work after the warm-up cancels out);
- ``opcodes``: Python bytecodes executed (``sys.settrace`` opcode events), by function;
- ``gunicorn``: system calls of a real gunicorn worker (``fleet/server/gunicorn_conf.py``, one worker, every thread,
  ``strace -c -f -p``) per call, for ``--calls`` keep-alive calls made one after another over one connection
  (1 s of idle threads is counted too: the bus's pings, the history thread's flushes);
- ``tracemalloc``: bytes allocated and not freed per call, and the peak above the start of a call.

Background threads (the bus, the history writer, its COPY batches, the metrics in multiprocess mode as in a worker)
are part of the process's counts, as they are of a worker's CPU; their timed work (pings, flushes) makes the
whole-process instructions vary from run to run, the request thread's much less (use ``--no-gc``). The data table ``pgbench_accounts`` is made in database ``bench`` if missing.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
VENV_PY = HERE.parent.parent / ".venv" / "bin" / "python"
ADMIN = "callcost-admin-key-0123456789"
SECRET = "callcost-secret-key-0123456789"
SQL = "SELECT aid, bid, abalance FROM pgbench_accounts WHERE aid = :aid"
CACHE_PATHS = {"hit": "/q/account_cached", "uncached": "/q/account"}


# --- the child: one checkout's app, in process ---------------------------------------------
def child(args: argparse.Namespace) -> None:
    import gc
    import io
    import time

    import falcon.testing
    import psycopg2

    from fleet.app import create_app
    from gateway.settings import Settings

    data = json.loads(args.child)
    cache = data.get("target")     # loadtests.cachecost's calls: "hit" or "uncached", with the cached query too
    with tempfile.TemporaryDirectory() as home:
        # A freshness lease far longer than a run: under valgrind the bus thread can be starved past
        # the default 1.5 s, and the request thread would then read the store's generation itself (timed
        # work, not the call's).
        settings = Settings(database_url=data["store_url"], redis_url=data["redis_url"], admin_key=ADMIN,
                            secret_key=SECRET, home=home, log_level="warning",
                            **({} if cache else {"freshness_lease_ms": 600_000}))
        app = create_app(settings)
        try:
            client = falcon.testing.TestClient(app)
            hdr = {"X-API-Key": ADMIN}
            dsn = psycopg2.extensions.parse_dsn(data["data_url"])
            query = {"sql": SQL, "connection_name": "demo", "parameters": {"aid": "int"}, "publish": True}
            for path, body in (
                    ("/api/v1/connections", {"name": "demo", "db": "postgres", "host": dsn["host"],
                                             "port": int(dsn["port"]), "user": dsn["user"],
                                             "password": dsn["password"], "database": dsn["dbname"]}),
                    ("/api/v1/queries", {"name": "account", **query}),
                    *([("/api/v1/queries", {"name": "account_cached", "cache_ttl": 600, **query})] if cache else [])):
                got = client.simulate_post(path, json=body, headers=hdr)
                assert got.status_code == 201, got.text
            got = client.simulate_post("/api/v1/api-keys", json={"name": "bench", "connections": ["demo"], "queries": [
                "account", *(["account_cached"] if cache else [])]}, headers=hdr)
            assert got.status_code == 201, got.text
            environ = falcon.testing.create_environ(path=CACHE_PATHS.get(cache, "/q/account"), query_string="aid=42",
                                                    headers={"X-API-Key": got.json["secret"]}, host="127.0.0.1")
            statuses: list[str] = []
            expected = ("200 OK", "hit" if cache == "hit" else None)

            # one or the other, chosen once: the per-call bytecodes are the app's and this function's only
            def start_response(status, headers, exc_info=None):
                statuses.append(status)

            def start_response_cached(status, headers, exc_info=None):
                statuses.append((status, dict((k.lower(), v) for k, v in headers).get("x-cache")))
            start_response = start_response_cached if cache else start_response

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
            first = statuses[-1][0] if cache else statuses[-1]
            assert first.startswith("200") and b'"aid":42' in body.replace(b" ", b""), (statuses, body)
            for _ in range(args.warmup):
                call()
            assert not cache or statuses[-1] == expected, statuses[-1]
            out: dict = {"body": body.decode()}
            n = args.calls
            if args.no_gc or cache:
                # The cyclic collector runs every so many allocations, and a full pass walks every object:
                # one pass more or less in a run would swamp a per-call difference. Counted without it.
                gc.collect()
                gc.disable()
            if args.mode == "profile":
                import cProfile
                import pstats
                profile = cProfile.Profile()
                profile.enable()
                for _ in range(n):
                    call()
                profile.disable()
                stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
                funcs = {}
                for (file, _line, name), (_cc, nc, tt, _ct, _callers) in stats.items():
                    file = re.sub(r"^.*?/(gateway|fleet|loadtests|falcon)/", r"\1/", file)
                    file = re.sub(r".*/site-packages/", "", file)
                    funcs[f"{file}:{name}"] = funcs.get(f"{file}:{name}", (0, 0.0))
                    funcs[f"{file}:{name}"] = (funcs[f"{file}:{name}"][0] + nc, funcs[f"{file}:{name}"][1] + tt)
                out["funcs"] = {k: [c / n, t / n * 1e6] for k, (c, t) in funcs.items()}
                out["calls_per_call"] = sum(c for c, _ in funcs.values()) / n
            elif args.mode == "opcodes":
                counts: dict = {}

                def local(frame, event, arg):
                    if event == "opcode":
                        code = frame.f_code
                        counts[code] = counts.get(code, 0) + 1
                    return local

                def global_(frame, event, arg):
                    frame.f_trace_opcodes = True
                    return local

                sys.settrace(global_)
                for _ in range(n):
                    call()
                sys.settrace(None)
                funcs = {}
                for code, c in counts.items():
                    file = re.sub(r"^.*?/(gateway|fleet|loadtests|falcon)/", r"\1/", code.co_filename)
                    file = re.sub(r".*/site-packages/", "", file)
                    name = f"{file}:{code.co_qualname}"
                    funcs[name] = funcs.get(name, 0) + c
                out["funcs"] = {k: [c / n, 0.0] for k, c in funcs.items()}
                out["calls_per_call"] = sum(funcs.values()) / n
            elif args.mode == "tracemalloc":
                import tracemalloc
                tracemalloc.start()
                peaks = []
                start = tracemalloc.get_traced_memory()[0]
                for _ in range(n):
                    tracemalloc.reset_peak()
                    before = tracemalloc.get_traced_memory()[0]
                    call()
                    peaks.append(tracemalloc.get_traced_memory()[1] - before)
                out["retained_per_call"] = (tracemalloc.get_traced_memory()[0] - start) / n
                out["peak_per_call"] = sorted(peaks)[len(peaks) // 2]
                tracemalloc.stop()
            elif args.mode == "cpu":   # timing, so noisy: the calling thread's CPU and the whole process's
                thread, process = time.thread_time(), time.process_time()
                for _ in range(n):
                    call()
                thread = time.thread_time() - thread
                time.sleep(1.0)   # the history thread's last batch
                out["cpu_us"] = [thread / n * 1e6, (time.process_time() - process) / n * 1e6]
            else:   # plain: the calls only (strace / callgrind count the whole process)
                for _ in range(n):
                    call()
            gc.enable()
            assert all(s == expected for s in statuses[-n:]) if cache else all(s.startswith("200") for s in statuses), \
                set(statuses)
            out["calls"] = n
            Path(args.out).write_text(json.dumps(out))
        finally:
            app.parts.close()


# --- a real gunicorn worker under strace --------------------------------------------------------
def gunicorn_strace(root: Path, index: int, args: argparse.Namespace) -> tuple[float, dict]:
    """System calls of one gunicorn worker (all its threads) per call, for ``--calls`` keep-alive calls
    made one after another (so the count is the calls', not the load's)."""
    import http.client
    import signal
    import socket
    import time

    store_url = _recreate(args.pg_url, f"cc_{index}")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        env.update({"PYTHONPATH": str(root), "GATEWAY_DATABASE_URL": store_url, "GATEWAY_REDIS_URL": args.redis_url,
                    "GATEWAY_ADMIN_KEY": ADMIN, "GATEWAY_SECRET_KEY": SECRET, "GATEWAY_WORKERS": "1",
                    "GATEWAY_CPUS": "off", "GATEWAY_HOME": home, "GATEWAY_LOG_LEVEL": "warning"})
        master = subprocess.Popen([str(VENV_PY.parent / "gunicorn"), "-c", "fleet/server/gunicorn_conf.py", "--bind",
                                   f"127.0.0.1:{port}", "fleet.app:create_app()"], cwd=root, env=env,
                                  stdout=subprocess.DEVNULL, stderr=open(Path(home) / "log", "wb"),
                                  start_new_session=True)
        try:
            conn = None
            deadline = time.monotonic() + 60
            while True:
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                    conn.request("GET", "/health")
                    if conn.getresponse().read() is not None:
                        break
                except OSError as error:
                    if time.monotonic() > deadline or master.poll() is not None:
                        log = (Path(home) / "log").read_text()[-2000:]
                        raise SystemExit(f"{root}: gunicorn did not start:\n{log}") from error
                    time.sleep(0.25)

            def call(method: str, path: str, body: dict | None = None, key: str = ADMIN) -> tuple[int, bytes]:
                assert conn is not None
                conn.request(method, path, body=json.dumps(body) if body is not None else None,
                             headers={"X-API-Key": key, "Content-Type": "application/json"})
                got = conn.getresponse()
                return got.status, got.read()

            dsn = psycopg2_parse(args.pg_url.rsplit("/", 1)[0] + "/bench")
            for path, body in (("/api/v1/connections", {"name": "demo", "db": "postgres", "host": dsn["host"],
                                                        "port": int(dsn["port"]), "user": dsn["user"],
                                                        "password": dsn["password"], "database": dsn["dbname"]}),
                               ("/api/v1/queries", {"name": "account", "sql": SQL, "connection_name": "demo",
                                                    "parameters": {"aid": "int"}, "publish": True})):
                status, text = call("POST", path, body)
                assert status == 201, text
            status, text = call("POST", "/api/v1/api-keys", {"name": "bench", "queries": ["account"],
                                                             "connections": ["demo"]})
            assert status == 201, text
            key = json.loads(text)["secret"]
            for _ in range(args.warmup):
                status, text = call("GET", "/q/account?aid=42", key=key)
                assert status == 200, text
            worker = int(subprocess.run(["pgrep", "-P", str(master.pid)], capture_output=True, text=True)
                         .stdout.split()[0])
            out = Path(home) / "strace"
            tracer = subprocess.Popen(["strace", "-c", "-f", "-o", str(out), "-p", str(worker)],
                                      stderr=subprocess.DEVNULL)
            time.sleep(1.0)   # attached to every thread
            for _ in range(args.calls):
                status, text = call("GET", "/q/account?aid=42", key=key)
                assert status == 200 and b'"aid":42' in text.replace(b" ", b""), text
            time.sleep(0.5)   # the history thread's batch of these calls
            tracer.send_signal(signal.SIGINT)
            tracer.wait(10)
            total, per = _strace_total(out.read_text())
            return total / args.calls, {k: round(v / args.calls, 3) for k, v in sorted(per.items(), key=lambda kv: -kv[1])
                                        if v / args.calls >= 0.005}
        finally:
            os.killpg(master.pid, signal.SIGTERM)
            master.wait(30)


def psycopg2_parse(url: str) -> dict:
    import psycopg2.extensions
    return psycopg2.extensions.parse_dsn(url)


# --- the driver -------------------------------------------------------------------------------
def _recreate(pg_url: str, db: str) -> str:
    import psycopg2
    conn = psycopg2.connect(pg_url)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        cur.execute(f'CREATE DATABASE "{db}"')
        cur.execute("SELECT 1 FROM pg_database WHERE datname = 'bench'")
        if not cur.fetchone():
            cur.execute('CREATE DATABASE "bench"')
    conn.close()
    conn = psycopg2.connect(pg_url.rsplit("/", 1)[0] + "/bench")
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS pgbench_accounts (aid int PRIMARY KEY, bid int, abalance int, "
                    "filler char(84))")
        cur.execute("INSERT INTO pgbench_accounts SELECT g, 1, 0, '' FROM generate_series(1, 1000) g "
                    "ON CONFLICT DO NOTHING")
    conn.close()
    return pg_url.rsplit("/", 1)[0] + "/" + db


def run_child(root: Path, index: int, args: argparse.Namespace, mode: str, calls: int, wrap: list[str],
              target: str | None = None) -> dict:
    """One child (this file with --child) on `root`'s code, in a fresh store; `target`: cachecost's call."""
    store_url = _recreate(args.pg_url, f"cachecost_{index}" if target else f"cc_{index}")
    spec = json.dumps({"store_url": store_url, "redis_url": args.redis_url, "target": target,
                       "data_url": args.pg_url.rsplit("/", 1)[0] + "/bench"})
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [*[w.replace("{tmp}", tmp) for w in wrap], str(VENV_PY), str(HERE), "--child", spec, "--mode", mode,
               "--calls", str(calls), "--warmup", str(args.warmup), "--out", str(out),
               *(["--no-gc"] if getattr(args, "no_gc", False) else [])]
        env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        env["PYTHONPATH"] = str(root)
        env["PYTHONHASHSEED"] = "0"
        if not target:   # as in a gunicorn worker (fleet/server/gunicorn_conf.py): the metrics in multiprocess mode
            env["PROMETHEUS_MULTIPROC_DIR"] = tmp
        done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
        if done.returncode != 0 or not out.exists():
            raise SystemExit(f"{root} {target or ''} {mode}: exit {done.returncode}\n{done.stderr[-3000:]}")
        result = json.loads(out.read_text())
        result["stderr"] = done.stderr
        result["tmp"] = tmp
        if wrap and wrap[0] == "valgrind":
            files = list(Path(tmp).glob("callgrind.out*"))
            result["ir"] = sum(_callgrind_ir(f) for f in files)
            # --separate-threads: one file per thread, the calling (main) thread's ends in -01
            result["ir_main"] = sum(_callgrind_ir(f) for f in files if f.name.endswith("-01"))
        return result


def _callgrind_ir(path: Path) -> int:
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("summary:") or line.startswith("totals:"):
            return int(line.split()[1])
    return 0


def _strace_total(text: str) -> tuple[int, dict]:
    per = {}
    total = 0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0].replace(".", "").isdigit() and parts[-1] != "total":
            calls = int(parts[3])
            per[parts[-1]] = calls
        if parts and parts[-1] == "total":
            total = int(parts[3])
    return total, per


def _by_function(roots: list[Path], args: argparse.Namespace, mode: str, report: dict, field: str,
                 what: str) -> dict:
    """Each root's count per call for ``mode`` (into ``report[root][field]``, printed as ``what``)
    and its counts by function, per root."""
    funcs = {}
    for i, root in enumerate(roots):
        got = run_child(root, i, args, mode, args.calls, [])
        funcs[root] = got["funcs"]
        report[str(root)][field] = got["calls_per_call"]
        print(f"{root}: {got['calls_per_call']:.1f} {what} per call", flush=True)
    return funcs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", action="append", type=Path, help="a checkout to measure (repeatable)")
    parser.add_argument("--pg-url")
    parser.add_argument("--redis-url")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--measure", default="profile,strace,tracemalloc")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--keep", help="a folder to keep callgrind's files in (callgrind_annotate them)")
    parser.add_argument("--no-gc", action="store_true", help="the calls with the cyclic garbage collector off "
                        "(after a full collection): callgrind's counts repeat within a fraction of a percent")
    parser.add_argument("--child")
    parser.add_argument("--mode", default="plain")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    roots = [r.resolve() for r in (args.root or [HERE.parent.parent])]
    measures = args.measure.split(",")
    report: dict = {str(r): {} for r in roots}
    if "profile" in measures:
        profiles = _by_function(roots, args, "profile", report, "py_calls", "Python function calls")
        if len(roots) >= 2:
            a, b = profiles[roots[0]], profiles[roots[-1]]
            rows = []
            for name in set(a) | set(b):
                ca, ta = a.get(name, (0, 0))
                cb, tb = b.get(name, (0, 0))
                if ca != cb:
                    rows.append((cb - ca, name, ca, cb, ta, tb))
            rows.sort(key=lambda r: -abs(r[0]))
            print(f"\nfunctions whose calls per call differ ({roots[0].name} -> {roots[-1].name}):")
            print(f"{'diff':>7} {'first':>6} {'last':>6} {'us first':>9} {'us last':>8}  function")
            for d, name, ca, cb, ta, tb in rows[:args.top]:
                print(f"{d:+7.2f} {ca:6.2f} {cb:6.2f} {ta:9.2f} {tb:8.2f}  {name}")
    if "opcodes" in measures:
        ops = _by_function(roots, args, "opcodes", report, "bytecodes", "Python bytecodes executed")
        if len(roots) >= 2:
            a, b = ops[roots[0]], ops[roots[-1]]
            rows = sorted(((b.get(k, (0, 0))[0] - a.get(k, (0, 0))[0], k) for k in set(a) | set(b)),
                          key=lambda r: -abs(r[0]))
            print(f"\nbytecodes per call by function ({roots[0].name} -> {roots[-1].name}):")
            for d, name in rows[:args.top]:
                if d:
                    print(f"{d:+8.1f} {a.get(name, (0, 0))[0]:8.1f} {b.get(name, (0, 0))[0]:8.1f}  {name}")
    if "tracemalloc" in measures:
        for i, root in enumerate(roots):
            got = run_child(root, i, args, "tracemalloc", args.calls, [])
            report[str(root)]["peak_bytes"] = got["peak_per_call"]
            print(f"{root}: tracemalloc peak per call {got['peak_per_call']} B, retained "
                  f"{got['retained_per_call']:.1f} B/call", flush=True)
    if "strace" in measures:
        for i, root in enumerate(roots):
            counts = []
            for calls in (0, args.calls):
                with tempfile.NamedTemporaryFile(suffix=".strace") as f:
                    run_child(root, i, args, "plain", calls, ["strace", "-c", "-f", "-o", f.name])
                    counts.append(_strace_total(Path(f.name).read_text()))
            (t0, p0), (t1, p1) = counts
            per = {k: (p1.get(k, 0) - p0.get(k, 0)) / args.calls for k in set(p0) | set(p1)}
            per = {k: round(v, 3) for k, v in sorted(per.items(), key=lambda kv: -kv[1]) if abs(v) >= 0.005}
            report[str(root)]["syscalls"] = (t1 - t0) / args.calls
            print(f"{root}: {(t1 - t0) / args.calls:.3f} syscalls per call {per}", flush=True)
    if "gunicorn" in measures:
        for i, root in enumerate(roots):
            total, per = gunicorn_strace(root, i, args)
            report[str(root)]["worker_syscalls"] = total
            print(f"{root}: {total:.3f} syscalls per call in a gunicorn worker {per}", flush=True)
    if "callgrind" in measures:
        for i, root in enumerate(roots):
            irs = []
            for calls in (args.calls, 2 * args.calls):
                with tempfile.TemporaryDirectory() as tmp:
                    wrap = ["valgrind", "--tool=callgrind", "--trace-children=no", "--separate-threads=yes",
                            f"--callgrind-out-file={tmp}/callgrind.out.%p", "--dump-line=no"]
                    got = run_child(root, i, args, "plain", calls, wrap)
                    files = sorted(Path(tmp).glob("callgrind.out*-*"), key=lambda f: int(f.name.rsplit("-", 1)[-1]))
                    irs.append([_callgrind_ir(f) for f in files])
                    if args.keep:
                        for f in files:
                            dest = Path(args.keep) / f"{root.name}-{calls}-{f.name.rsplit('-', 1)[-1]}.cg"
                            dest.parent.mkdir(parents=True, exist_ok=True)
                            dest.write_bytes(f.read_bytes())
            total = (sum(irs[1]) - sum(irs[0])) / args.calls
            main_thread = (irs[1][0] - irs[0][0]) / args.calls
            # the history thread: the other thread whose work grows most with the calls
            busiest = max((b - a for a, b in zip(irs[0][1:], irs[1][1:], strict=False)), default=0) / args.calls
            report[str(root)]["instructions"] = total
            report[str(root)]["instructions_request_thread"] = main_thread
            report[str(root)]["instructions_history_thread"] = busiest
            print(f"{root}: {total:,.0f} instructions per call, {main_thread:,.0f} of them on the request thread, "
                  f"{busiest:,.0f} on the busiest other (the history thread) (threads with {args.calls} calls "
                  f"{irs[0]}, with {2 * args.calls} {irs[1]})", flush=True)
    print(json.dumps(report))


if __name__ == "__main__":
    sys.path[:0] = [os.environ.get("PYTHONPATH", "")] if "--child" in sys.argv else []
    main()
