"""``fleet``: bring the gateway up on one machine, from the same settings as everywhere.

    fleet up [--instances N]   start PostgreSQL and Redis (embedded default when no URLs
                               are set), the demo data and its roles (demo_reader reads,
                               demo_writer may only run the load tests' deposit), N
                               gunicorn masters under a supervisor that starts a master
                               again when it dies (fleet/ops/supervisor.py) and, for N > 1, an
                               nginx load balancer on GATEWAY_BIND (the supervisor starts
                               it again too); seed the demo and print
                               working curl lines. Returns once all answer.
    fleet down [--keep-services]   the supervisor and its masters, nginx, the services
    fleet restart              restart the masters one at a time: each stops taking
                               connections, finishes its calls, and the supervisor starts it
                               again; behind nginx (--instances 2+) no call is lost
    fleet status
    fleet seed --url URL       create the demo objects through the Management API
    fleet migrate [--wait S]   bring the store's schema up to this release's and exit
                               (a release's migration job: fleet/ops/migrate.py)
    fleet --version            the version (gateway.__version__, the one source)

The benchmark harness is not part of the product: from a checkout, `python -m loadtests.bench`.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from gateway import __version__
from gateway.settings import Settings

from . import local
from .local.demo import READER, WRITER
from .local.seed import WRITER_CONNECTION, Api, seed, update_login

ROOT = Path(__file__).resolve().parents[2]


def _home(settings: Settings) -> Path:
    return Path(settings.home).resolve()


def _host_port(bind: str) -> tuple[str, int]:
    host, _, port = bind.rpartition(":")
    return host or "127.0.0.1", int(port)


def instance_binds(settings: Settings, instances: int) -> list[str]:
    """One instance serves GATEWAY_BIND itself; more sit behind the load balancer on the
    ports just above it."""
    host, port = _host_port(settings.bind)
    if instances == 1:
        return [settings.bind]
    return [f"{host}:{port + 1 + i}" for i in range(instances)]


def _wait_http(url: str, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def _pid_alive(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def start_supervisor(settings: Settings, env: dict, binds: list[str], nginx_conf: Path | None = None) -> bool:
    """The supervisor of this home's masters and, with ``nginx_conf``, of nginx (it starts
    them), unless one already runs; whether it was started now."""
    home = _home(settings)
    run = home / "run"
    run.mkdir(parents=True, exist_ok=True)
    if _pid_alive(run / "supervisor.pid"):
        return False
    cmd = [sys.executable, "-m", "fleet.ops.supervisor", "--home", str(home),
           *[f"--instance=i{i}={bind}" for i, bind in enumerate(binds)]]
    if nginx_conf is not None:
        cmd += ["--nginx-conf", str(nginx_conf), "--nginx-prefix", str(home / "nginx")]
    with open(home / "supervisor.log", "ab") as log:
        subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    return True


def _supervises_nginx(pid: int) -> bool:
    try:
        return b"--nginx-conf" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def stop_supervisor(settings: Settings) -> None:
    """SIGTERM to the supervisor: it stops its masters gracefully, then itself."""
    pid = _pid_alive(_home(settings) / "run" / "supervisor.pid")
    if pid:
        os.kill(pid, signal.SIGTERM)
        _wait_gone(pid, 45)


NGINX_CONF = """\
worker_processes 1;
pid {home}/run/nginx.pid;
error_log {home}/nginx-error.log warn;
{user}
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {home}/nginx/body;
    proxy_temp_path {home}/nginx/proxy;
    fastcgi_temp_path {home}/nginx/fastcgi;
    uwsgi_temp_path {home}/nginx/uwsgi;
    scgi_temp_path {home}/nginx/scgi;
    upstream gateway {{
{servers}
        keepalive 64;
    }}
    server {{
        listen {bind};
        location / {{
            proxy_pass http://gateway;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header X-Forwarded-For $remote_addr;
            # An instance that is down (refused or timed-out connect) is skipped and the
            # request tried on another; an instance that answers, even a typed 503 with
            # Retry-After (its database is restarting), is up: its answer goes to the caller
            # and does not count against it, so the pool is never emptied by answers and
            # nginx never turns them into 502. A request that reached an instance is never
            # sent twice (non-idempotent methods are not retried).
            proxy_next_upstream error timeout;
            proxy_connect_timeout 1s;
            proxy_buffering off;
        }}
    }}
}}
"""


def upstream_server(bind: str) -> str:
    """nginx's line for one instance: three failed connects in a row take it out of the rotation
    for ``NGINX_FAIL_TIMEOUT_S`` (compose/nginx.conf says the same)."""
    return f"server {bind} max_fails=3 fail_timeout={NGINX_FAIL_TIMEOUT_S}s;"


def upstream_backup(bind: str) -> str:
    return f"server {bind} backup max_fails=0;"


def start_balancer(settings: Settings, binds: list[str], start: bool = True) -> Path:
    """nginx's configuration for ``binds``; with ``start``, nginx reloaded with it, or started
    (as a daemon, unsupervised: the supervisor that runs was started without it)."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    home = _home(settings)
    (home / "nginx").mkdir(parents=True, exist_ok=True)
    conf = home / "nginx.conf"
    # Down after 3 failed connects within 1 s, tried again 1 s later: one failure is not
    # enough to take an instance out. Each instance again as a backup that is never taken out:
    # when every instance is marked down (one restarting while nginx still skips another that
    # came back less than fail_timeout ago), calls try them all instead of answering 502.
    servers = "\n".join([f"        {upstream_server(b)}" for b in binds]
                         + [f"        {upstream_backup(b)}" for b in binds])
    conf.write_text(NGINX_CONF.format(home=home, servers=servers, bind=settings.bind,
                                      user="user root;" if os.geteuid() == 0 else ""))
    if not start:
        return conf
    pid = _pid_alive(home / "run" / "nginx.pid")
    if pid:
        subprocess.run([nginx, "-c", str(conf), "-p", str(home / "nginx"), "-s", "reload"], check=True)
    else:
        subprocess.run([nginx, "-c", str(conf), "-p", str(home / "nginx")], check=True)
    return conf


def up(settings: Settings, instances: int, seed_demo: bool = True) -> dict:
    home = _home(settings)
    embedded_store = not settings.database_url
    env = local.ensure_embedded(settings)
    os.environ.update(env)
    settings = Settings.from_env()
    binds = instance_binds(settings, instances)
    # With more than one instance the supervisor runs nginx too, and starts it again when it dies.
    conf = start_balancer(settings, binds, start=False) if instances > 1 else None
    nginx_before = _pid_alive(home / "run" / "nginx.pid")
    supervisor_started = start_supervisor(settings, env, binds, conf)
    for bind in binds:
        if not _wait_http(f"http://{bind}/health", 60):
            stop_supervisor(settings)
            raise SystemExit(f"the gateway on {bind} did not come up; see {home}/gunicorn-*.log "
                             f"and {home}/supervisor.log")
    # A supervisor already ran, or the new one adopted a running nginx: reload it with the conf.
    if instances > 1 and (not supervisor_started or nginx_before):
        start_balancer(settings, binds)
    base = f"http://{settings.bind}"
    if not _wait_http(base + "/health", 30):
        raise SystemExit(f"nothing answers on {base}")
    result = {"base_url": base, "admin_key": settings.admin_key, "metrics_token": settings.metrics_token,
              "instances": binds}
    # The demo lives on the embedded PostgreSQL; with your own database, seed with `fleet seed`.
    if seed_demo and embedded_store:
        result["demo_key"] = _seed_embedded(settings, base, home)
    return result


def _seed_embedded(settings: Settings, base: str, home: Path) -> str:
    """Demo data on the embedded PostgreSQL (a `demo` database beside the store), read by
    the demo connection as the role ``demo_reader``, never as the superuser; the
    demo_writer connection logs in as ``demo_writer``, which may only run the deposit."""
    from .local.demo import create_demo_data, create_demo_reader, create_demo_writer

    dsn = local.demo_database_url(settings)
    create_demo_data(dsn)
    at = {"host": "127.0.0.1", "port": settings.pg_port, "database": "demo"}
    password, fresh = local.demo_reader_password(settings)
    create_demo_reader(dsn, password)
    conn = {**at, "user": READER, "password": password}
    password, writer_fresh = local.demo_writer_password(settings)
    create_demo_writer(dsn, password)
    writer = {**at, "user": WRITER, "password": password}
    api = Api(base, settings.admin_key)
    # These demo connections are ours: keep their logins current.
    update_login(api, conn, force=fresh)
    update_login(api, writer, force=writer_fresh, name=WRITER_CONNECTION)
    return seed(api, conn, home / "demo_key", writer)


def down(settings: Settings, keep_services: bool) -> None:
    home = _home(settings)
    run = home / "run"
    nginx_pid = _pid_alive(run / "nginx.pid")
    supervisor = _pid_alive(run / "supervisor.pid")
    if nginx_pid and not (supervisor and _supervises_nginx(supervisor)):
        os.kill(nginx_pid, signal.SIGQUIT)       # else the supervisor stops it first, and does not restart it
    stop_supervisor(settings)     # first: else it would start again the masters stopped below
    for pid_file in sorted(run.glob("gunicorn-*.pid")):   # masters started without one
        pid = _pid_alive(pid_file)
        if pid:
            os.kill(pid, signal.SIGTERM)
            _wait_gone(pid, 30)
    if not keep_services:
        local.stop_embedded(settings)


RESTART_WAIT_S = 120.0    # a master's graceful stop (30 s at most) and its successor's boot
# nginx skips a server that failed for fail_timeout after its last failure: a restarted instance is
# back in its rotation that long after it answers. The next restart waits for it (and some): with
# neither this wait nor the backup entries (start_balancer), both were skipped at once and 174 of
# 9,851 calls answered 502 "no live upstreams".
NGINX_FAIL_TIMEOUT_S = 1
RESTART_SETTLE_S = NGINX_FAIL_TIMEOUT_S + 0.5


def restart(settings: Settings, say: Callable[[str], None] = print) -> list[float]:
    """A rolling restart of this home's masters (a new master process each: what a change of
    gunicorn, of the libraries the master preloads or of its settings needs; a SIGHUP reload
    replaces the workers only). One at a time: SIGTERM to its master, which stops taking
    connections at once and finishes what it holds while nginx sends new calls to the others
    (a refused connect is tried on another instance); the supervisor starts it again; the next
    goes once this one answers /ready with all its workers and nginx sends it calls again
    (``RESTART_SETTLE_S``). Seconds each took to serve again."""
    run = _home(settings) / "run"
    if not _pid_alive(run / "supervisor.pid"):
        raise SystemExit(f"no supervisor runs in {run.parent}: `fleet up` first")
    pid_files = sorted(run.glob("gunicorn-i*.pid"), key=lambda p: int(p.stem.removeprefix("gunicorn-i")))
    if len(pid_files) < 2:
        say("one instance: its clients are refused while it restarts (`fleet up --instances 2` or more "
            "restarts without that; `kill -HUP` the master to replace its workers only)")
    took = []
    for pid_file, bind in zip(pid_files, instance_binds(settings, len(pid_files)), strict=True):
        old = _pid_alive(pid_file)
        started = time.monotonic()
        if old:
            os.kill(old, signal.SIGTERM)
        new = _wait_restarted(pid_file, old, bind, settings.worker_count(), started + RESTART_WAIT_S)
        took.append(time.monotonic() - started)
        say(f"{pid_file.stem.removeprefix('gunicorn-')}: pid {old} -> {new}, serving on {bind} after {took[-1]:.1f}s")
        if len(took) < len(pid_files):
            time.sleep(RESTART_SETTLE_S)     # back in nginx's rotation before the next one goes
    return took


def _wait_restarted(pid_file: Path, old: int | None, bind: str, workers: int, deadline: float) -> int:
    while time.monotonic() < deadline:
        new = _pid_alive(pid_file)
        if new and new != old and _children(new) >= workers and _wait_http(f"http://{bind}/ready", 0.5):
            return new
        time.sleep(0.05)
    raise SystemExit(f"{pid_file.stem} did not come back serving on {bind}; see {pid_file.parent.parent}/"
                     f"{pid_file.stem}.log and supervisor.log")


def _children(pid: int) -> int:
    try:
        return len(Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
    except OSError:
        return 0


def _wait_gone(pid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.1)


def status(settings: Settings) -> int:
    home = _home(settings)
    run = home / "run"
    rows = [("nginx", _pid_alive(run / "nginx.pid")), ("supervisor", _pid_alive(run / "supervisor.pid"))]
    rows += [(p.stem, _pid_alive(p)) for p in sorted(run.glob("gunicorn-*.pid"))]
    for name, pid in rows:
        print(f"{name:20} {'running, pid ' + str(pid) if pid else 'stopped'}")
    return 0


def _print_welcome(result: dict) -> None:
    base, key = result["base_url"], result.get("demo_key")
    print(f"\ngateway-fleet is up at {base} ({len(result['instances'])} instance(s))\n")
    if key:
        print("Try the demo queries:")
        print(f"  curl -s -H 'X-API-Key: {key}' '{base}/q/account?aid=42'")
        print(f"  curl -s -H 'X-API-Key: {key}' '{base}/q/customers?country=FR&plan=pro&page_size=3'")
        print(f"  curl -s -H 'X-API-Key: {key}' '{base}/q/customers?country=US&format=csv'")
    print("Manage it (admin key in GATEWAY_ADMIN_KEY or the home folder):")
    print(f"  curl -s -H 'X-API-Key: {result['admin_key']}' {base}/api/v1/queries")
    if result.get("metrics_token"):
        print("Prometheus metrics (token in GATEWAY_METRICS_TOKEN or the home folder's metrics_token):")
        print(f"  curl -s -H 'Authorization: Bearer {result['metrics_token']}' {base}/metrics")
    print("Stop it: .venv/bin/fleet down")


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="fleet", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"fleet (gateway-fleet) {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start everything and seed the demo")
    p_up.add_argument("--instances", type=int, default=1)
    p_up.add_argument("--no-demo", action="store_true")
    p_down = sub.add_parser("down", help="stop everything")
    p_down.add_argument("--keep-services", action="store_true", help="leave PostgreSQL and Redis running")
    sub.add_parser("restart", help="restart the masters one at a time (behind nginx: no call lost)")
    sub.add_parser("status")
    p_seed = sub.add_parser("seed", help="create the demo objects through the Management API")
    p_seed.add_argument("--url", required=True)
    p_seed.add_argument("--admin-key", default=os.environ.get("GATEWAY_ADMIN_KEY", ""))
    p_seed.add_argument("--pg-host", default="postgres")
    p_seed.add_argument("--pg-port", type=int, default=5432)
    p_seed.add_argument("--pg-database", default="demo")
    p_seed.add_argument("--pg-user", default=READER)  # a read-only role, never the superuser
    p_seed.add_argument("--pg-password", default="${GATEWAY_DEMO_PG_PASSWORD}")
    # The demo_writer connection: a role that may only run the load tests' deposit UPDATE.
    p_seed.add_argument("--pg-writer-user", default=WRITER)
    p_seed.add_argument("--pg-writer-password", default="${GATEWAY_DEMO_WRITER_PG_PASSWORD}")
    p_seed.add_argument("--key-file", default=".fleet/demo_key")
    p_migrate = sub.add_parser("migrate", help="bring the store's schema up to this release's and exit")
    p_migrate.add_argument("--wait", type=float, default=60.0,
                           help="seconds to wait for the store to accept connections (default 60)")
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    if args.command == "up":
        _print_welcome(up(settings, args.instances, not args.no_demo))
        return 0
    if args.command == "down":
        down(settings, args.keep_services)
        return 0
    if args.command == "restart":
        restart(settings)
        return 0
    if args.command == "status":
        return status(settings)
    if args.command == "seed":
        if not _wait_http(args.url.rstrip("/") + "/health", 120):
            raise SystemExit(f"{args.url} does not answer")
        at = {"host": args.pg_host, "port": args.pg_port, "database": args.pg_database}
        pg = {**at, "user": args.pg_user, "password": args.pg_password}
        writer = {**at, "user": args.pg_writer_user, "password": args.pg_writer_password}
        print(seed(Api(args.url, args.admin_key), pg, Path(args.key_file), writer))
        return 0
    if args.command == "migrate":
        from .migrate import migrate_store  # not for the other commands: it loads the application's code
        migrate_store(settings, args.wait)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
