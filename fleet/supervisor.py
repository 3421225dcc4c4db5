"""``fleet up``'s supervisor: keeps the gunicorn masters of one home running.

    python -m fleet.supervisor --home H --instance i0=127.0.0.1:8001 [--instance ...]

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
"""
from __future__ import annotations

import argparse
import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POLL_S = 0.1
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
STABLE_S = 10.0          # a master that ran this long starts again at once when it exits
STOP_TIMEOUT_S = 40.0    # gunicorn's graceful timeout (30 s) and some


def master_command(run: Path, name: str, bind: str) -> list[str]:
    return [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "fleet" / "gunicorn_conf.py"),
            "--bind", bind, "--pid", str(run / f"gunicorn-{name}.pid"), "fleet.app:create_app()"]


def _gunicorn_alive(pid: int) -> bool:
    """``pid`` is a live gunicorn (not a zombie, not a recycled pid of something else)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z" and b"gunicorn" in cmdline


class Master:
    """One instance: its child process (or an adopted pid) and when it may start again."""

    __slots__ = ("name", "bind", "proc", "adopted", "started_at", "quick_deaths", "next_start", "starts")

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
        return self.adopted is not None and _gunicorn_alive(self.adopted)

    def how_it_ended(self) -> str:
        code = self.proc.returncode if self.proc is not None else None
        if code is None:
            return "is gone"
        return f"was killed by signal {-code}" if code < 0 else f"exited with {code}"


class Supervisor:
    def __init__(self, home: Path, instances: Sequence[tuple[str, str]], env: dict[str, str],
                 clock: Callable[[], float] = time.monotonic, log: Callable[[str], None] | None = None) -> None:
        self.home = home
        self.run = home / "run"
        self.masters = [Master(name, bind) for name, bind in instances]
        self.env = env
        self.clock = clock
        self.log = log or (lambda text: print(text, flush=True))
        self.stopping = threading.Event()

    def adopt(self) -> None:
        for master in self.masters:
            try:
                pid = int((self.run / f"gunicorn-{master.name}.pid").read_text().strip())
            except (OSError, ValueError):
                continue
            if _gunicorn_alive(pid):
                master.adopted = pid
                master.started_at = self.clock()
                self.log(f"master {master.name} already running (pid {pid}): adopted")

    def start(self, master: Master) -> None:
        pid_file = self.run / f"gunicorn-{master.name}.pid"
        try:   # left by a killed master; gunicorn refuses to start while its pid is alive (reused)
            if not _gunicorn_alive(int(pid_file.read_text().strip())):
                pid_file.unlink()
        except (OSError, ValueError):
            pass
        log = open(self.home / f"gunicorn-{master.name}.log", "ab")
        try:
            master.proc = subprocess.Popen(
                master_command(self.run, master.name, master.bind), cwd=ROOT,
                env={**self.env, "GATEWAY_INSTANCE": master.name}, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()
        master.adopted = None
        master.started_at = self.clock()
        master.starts += 1
        self.log(f"master {master.name} started (pid {master.proc.pid}) on {master.bind}")

    def tick(self) -> None:
        """Start what is not running and may start now; note when what died may start again."""
        now = self.clock()
        for master in self.masters:
            if master.alive():
                continue
            if master.next_start == 0.0:           # just found gone: when may it start again?
                delay = 0.0
                if master.starts or master.adopted is not None:
                    ran = now - master.started_at
                    master.quick_deaths = master.quick_deaths + 1 if ran < STABLE_S else 0
                    if master.quick_deaths > 1:
                        delay = min(BACKOFF_FIRST_S * 2 ** (master.quick_deaths - 2), BACKOFF_MAX_S)
                    self.log(f"master {master.name} (pid {master.pid()}) {master.how_it_ended()} after "
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
        self.signal_all(signal.SIGTERM)
        deadline = self.clock() + STOP_TIMEOUT_S
        while any(m.alive() for m in self.masters) and self.clock() < deadline:
            time.sleep(POLL_S)
        for master in self.masters:
            pid = master.pid()
            if pid is not None and master.alive():
                self.log(f"master {master.name} (pid {pid}) did not stop in {STOP_TIMEOUT_S:.0f}s: SIGKILL")
                try:
                    os.killpg(pid, signal.SIGKILL)     # with its group (start_new_session): its workers
                except OSError:
                    pass
            if master.proc is not None:
                master.proc.wait(10)
        self.log("stopped")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fleet.supervisor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", required=True)
    parser.add_argument("--instance", action="append", required=True, help="name=host:port")
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
    supervisor = Supervisor(home, instances, env)
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
