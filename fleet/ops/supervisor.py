"""``fleet up``'s supervisor: keeps the gunicorn masters of one home, and nginx in front of
them, running.

    python -m fleet.ops.supervisor --home H --instance i0=127.0.0.1:8001 [--instance ...]
                               [--nginx-conf H/nginx.conf --nginx-prefix H/nginx]

It starts each master as its child and starts it again whenever it exits without the
supervisor having asked (a SIGKILL, a crash, an OOM kill, any exit): at once, and, while it
keeps dying within 10 s of its start, after 1, 2, 4 ... up to 30 s, so a master that cannot
start does not spin. SIGTERM or SIGINT (``fleet down``): it stops every master
gracefully (SIGTERM, gunicorn's graceful timeout, then SIGKILL to what is left of its process
group) and exits. SIGHUP is passed to the masters (a reload).

One supervisor per home: it holds ``flock`` on ``<home>/run/supervisor.lock`` for its life, and
a second one exits at once. A master already running from its pid file (the supervisor itself
was killed and started again) is adopted: watched by its pid, started again when it is gone.
Its log is ``<home>/supervisor.log``.

nginx (``--nginx-conf``, ``fleet up --instances N`` with N > 1) is one more child, run in the
foreground (``daemon off``), started again the same way, stopped with SIGQUIT (graceful) before
the masters. nginx's workers outlive a killed nginx master and keep its port, so that a new
one could not bind it: the supervisor sends them SIGQUIT first (they close the port, finish
what they hold and exit; nginx retries its bind for 2.5 s meanwhile).
"""
from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.1
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
STABLE_S = 10.0          # a master that ran this long starts again at once when it exits
STOP_TIMEOUT_S = 40.0    # gunicorn's graceful timeout (30 s) and some


def master_command(run: Path, name: str, bind: str) -> list[str]:
    return [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "fleet" / "server" / "gunicorn_conf.py"),
            "--bind", bind, "--pid", str(run / f"gunicorn-{name}.pid"), "fleet.app:create_app()"]


def nginx_command(conf: Path, prefix: Path) -> list[str]:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    return [nginx, "-c", str(conf), "-p", str(prefix), "-g", "daemon off;"]


def _alive_as(pid: int, name: bytes) -> bool:
    """``pid`` is a live process whose command line names ``name`` (not a zombie, not a
    recycled pid of something else)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z" and name in cmdline


def _gunicorn_alive(pid: int) -> bool:
    return _alive_as(pid, b"gunicorn")


class Master:
    """One instance: its child process (or an adopted pid) and when it may start again."""

    __slots__ = ("name", "bind", "proc", "adopted", "started_at", "quick_deaths", "next_start", "starts")
    kind = "master"
    stop_signal = signal.SIGTERM

    def __init__(self, name: str, bind: str) -> None:
        self.name = name
        self.bind = bind
        self.proc: subprocess.Popen | None = None
        self.adopted: int | None = None
        self.started_at = 0.0
        self.quick_deaths = 0     # deaths in a row, each within STABLE_S of its start
        self.next_start = 0.0
        self.starts = 0

    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else self.adopted

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return self.adopted is not None and self.is_running(self.adopted)

    def how_it_ended(self) -> str:
        code = self.proc.returncode if self.proc is not None else None
        if code is None:
            return "is gone"
        return f"was killed by signal {-code}" if code < 0 else f"exited with {code}"

    # --- what differs between a master and nginx ---
    def command(self, run: Path) -> list[str]:
        return master_command(run, self.name, self.bind)

    def pid_file(self, run: Path) -> Path:
        return run / f"gunicorn-{self.name}.pid"

    def log_file(self, home: Path) -> Path:
        return home / f"gunicorn-{self.name}.log"

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        return {**env, "GATEWAY_INSTANCE": self.name}

    def is_running(self, pid: int) -> bool:
        return _gunicorn_alive(pid)

    def left_behind(self, pid: int) -> None:
        """Called once it is found gone. A master's workers stop by themselves (PR_SET_PDEATHSIG)."""


class Balancer(Master):
    """nginx in front of the masters, in the foreground: its master process is the child."""

    __slots__ = ("conf", "prefix")
    kind = "balancer"
    stop_signal = signal.SIGQUIT      # nginx's graceful stop (SIGTERM is its fast one)

    def __init__(self, conf: Path, prefix: Path) -> None:
        super().__init__("nginx", "")
        self.conf = conf
        self.prefix = prefix

    def command(self, run: Path) -> list[str]:
        return nginx_command(self.conf, self.prefix)

    def pid_file(self, run: Path) -> Path:
        return run / "nginx.pid"          # the conf's ``pid``: nginx writes it

    def log_file(self, home: Path) -> Path:
        return home / "nginx.log"

    def environment(self, env: dict[str, str]) -> dict[str, str]:
        return env

    def is_running(self, pid: int) -> bool:
        return _alive_as(pid, b"nginx")

    def left_behind(self, pid: int) -> None:
        """nginx's workers outlive their master and keep serving on its port, which a new
        nginx could then not bind: SIGQUIT to its process group (the child's own session, or
        a daemon's), so that they close the port now and finish what they hold."""
        try:
            os.killpg(pid, signal.SIGQUIT)
        except OSError:
            pass


class Supervisor:
    def __init__(self, home: Path, instances: Sequence[tuple[str, str]], env: dict[str, str],
                 clock: Callable[[], float] = time.monotonic, log: Callable[[str], None] | None = None,
                 balancer: Balancer | None = None) -> None:
        self.home = home
        self.run = home / "run"
        # nginx first: stopped first (fleet down), so that no call is sent to a stopping master.
        self.masters = ([balancer] if balancer is not None else []) + [Master(name, bind) for name, bind in instances]
        self.env = env
        self.clock = clock
        self.log = log or (lambda text: print(text, flush=True))
        self.stopping = threading.Event()

    def adopt(self) -> None:
        for master in self.masters:
            try:
                pid = int(master.pid_file(self.run).read_text().strip())
            except (OSError, ValueError):
                continue
            if master.is_running(pid):
                master.adopted = pid
                master.started_at = self.clock()
                self.log(f"{master.kind} {master.name} already running (pid {pid}): adopted")

    def start(self, master: Master) -> None:
        pid_file = master.pid_file(self.run)
        try:   # left by a killed master; gunicorn refuses to start while its pid is alive (reused)
            if not master.is_running(int(pid_file.read_text().strip())):
                pid_file.unlink()
        except (OSError, ValueError):
            pass
        log = open(master.log_file(self.home), "ab")
        try:
            master.proc = subprocess.Popen(
                master.command(self.run), cwd=ROOT, env=master.environment(self.env), stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()
        master.adopted = None
        master.started_at = self.clock()
        master.starts += 1
        self.log(f"{master.kind} {master.name} started (pid {master.proc.pid})"
                 + (f" on {master.bind}" if master.bind else ""))

    def tick(self) -> None:
        """Start what is not running and may start now; note when what died may start again."""
        now = self.clock()
        for master in self.masters:
            if master.alive():
                continue
            if master.next_start == 0.0:           # just found gone: when may it start again?
                delay = 0.0
                gone = master.pid()
                if gone is not None:
                    master.left_behind(gone)
                if master.starts or master.adopted is not None:
                    ran = now - master.started_at
                    master.quick_deaths = master.quick_deaths + 1 if ran < STABLE_S else 0
                    if master.quick_deaths > 1:
                        delay = min(BACKOFF_FIRST_S * 2 ** (master.quick_deaths - 2), BACKOFF_MAX_S)
                    self.log(f"{master.kind} {master.name} (pid {master.pid()}) {master.how_it_ended()} after "
                             f"{ran:.1f}s; starting it again in {delay:.1f}s")
                master.next_start = now + delay
            if now >= master.next_start:
                master.next_start = 0.0
                self.start(master)

    def serve(self) -> None:
        self.adopt()
        while not self.stopping.is_set():
            self.tick()
            self.stopping.wait(POLL_S)
        self.stop_all()

    def signal_all(self, signum: int) -> None:
        for master in self.masters:
            pid = master.pid()
            if pid is not None and master.alive():
                try:
                    os.kill(pid, signum)
                except OSError:
                    pass

    def stop_all(self) -> None:
        self.log("stopping the masters")
        for master in self.masters:
            pid = master.pid()
            if pid is not None and master.alive():
                try:
                    os.kill(pid, master.stop_signal)
                except OSError:
                    pass
        deadline = self.clock() + STOP_TIMEOUT_S
        while any(m.alive() for m in self.masters) and self.clock() < deadline:
            time.sleep(POLL_S)
        for master in self.masters:
            pid = master.pid()
            if pid is not None and master.alive():
                self.log(f"{master.kind} {master.name} (pid {pid}) did not stop in {STOP_TIMEOUT_S:.0f}s: SIGKILL")
                try:
                    os.killpg(pid, signal.SIGKILL)     # with its group (start_new_session): its workers
                except OSError:
                    pass
            if master.proc is not None:
                master.proc.wait(10)
        self.log("stopped")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fleet.ops.supervisor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", required=True)
    parser.add_argument("--instance", action="append", required=True, help="name=host:port")
    parser.add_argument("--nginx-conf", help="run nginx with this configuration too")
    parser.add_argument("--nginx-prefix", help="nginx's prefix (-p)")
    args = parser.parse_args(argv)
    home = Path(args.home).resolve()
    run = home / "run"
    run.mkdir(parents=True, exist_ok=True)
    lock = os.open(run / "supervisor.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print("another supervisor runs for this home", flush=True)
        return 0
    instances = [(name, bind) for name, _, bind in (spec.partition("=") for spec in args.instance)]
    env = {**os.environ, "GATEWAY_HOME": str(home)}    # the masters run in the checkout: no relative home
    balancer = None
    if args.nginx_conf:
        balancer = Balancer(Path(args.nginx_conf).resolve(), Path(args.nginx_prefix or home / "nginx").resolve())
    supervisor = Supervisor(home, instances, env, balancer=balancer)
    signal.signal(signal.SIGTERM, lambda *_: supervisor.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: supervisor.stopping.set())
    signal.signal(signal.SIGHUP, lambda *_: supervisor.signal_all(signal.SIGHUP))
    pid_file = run / "supervisor.pid"
    pid_file.write_text(f"{os.getpid()}\n")
    try:
        supervisor.serve()
    finally:
        try:
            if pid_file.read_text().strip() == str(os.getpid()):
                pid_file.unlink()
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
