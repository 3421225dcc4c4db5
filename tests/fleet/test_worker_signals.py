"""A signal taken by one of the balanced worker's threads other than the main one (``fleet/server/worker.py``
``_signalled``). The kernel may hand a process-wide signal (SIGTERM from PR_SET_PDEATHSIG when the
master is killed, or a ``kill``) to any thread; Python runs the handler on the main thread only,
and gthread's loop slept on in its poll until its 1 s timeout. An orphan then kept its idle
kept-alive connections that long (1.0-1.1 s twice in CI against
``test_orphaned_workers``' 0.5 s bound). Here the signal is sent to a pool thread on purpose
(tgkill), right after a call, when the loop has just gone back to its poll for a whole second."""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
APP = '''
def app(environ, start_response):
    start_response("200 OK", [("Content-Length", "2")])
    return [b"ok"]
'''
STOPPED_WITHIN_S = 0.4   # the fix: ~0.02 s; before it, the rest of the poll's second (~0.95 s)
SYS_TGKILL = 234         # x86_64


def call(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200"), reply


def worker_of(master: int) -> int:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        kids = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True).stdout.split()
        if kids:
            return int(kids[0])
        time.sleep(0.05)
    raise AssertionError("no worker started")


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] in ("Z", "X")
    except OSError:
        return True


@pytest.mark.integration     # a gunicorn master of its own
def test_a_sigterm_taken_by_a_pool_thread_stops_the_worker_at_once(tmp_path):
    if not sys.platform.startswith("linux") or os.uname().machine != "x86_64":
        pytest.skip("tgkill's system call number is x86_64's")
    (tmp_path / "tinyapp.py").write_text(APP)
    port = free_port()
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{tmp_path}")
    master = subprocess.Popen([sys.executable, "-m", "gunicorn", "-k", "fleet.server.worker.BalancedThreadWorker",
                               "-w", "1", "--threads", "2", "-b", f"127.0.0.1:{port}", "--no-control-socket",
                               "tinyapp:app"], cwd=tmp_path, env=env, stderr=subprocess.DEVNULL)
    try:
        worker = worker_of(master.pid)
        deadline = time.monotonic() + 20
        while True:
            try:
                call(port)      # also starts the pool's thread
                break
            except OSError:
                assert time.monotonic() < deadline, "the worker never answered"
                time.sleep(0.05)
        threads = [int(t) for t in os.listdir(f"/proc/{worker}/task") if int(t) != worker]
        assert threads, "no thread besides the main one"
        call(port)              # the loop goes back to a whole second's poll
        sent = time.monotonic()
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.syscall(SYS_TGKILL, worker, threads[0], signal.SIGTERM) == 0, ctypes.get_errno()
        while not gone(worker) and time.monotonic() - sent < 5:
            time.sleep(0.002)
        stopped = time.monotonic() - sent
        assert gone(worker)
        assert stopped <= STOPPED_WITHIN_S, f"the worker stopped {stopped:.3f} s after its SIGTERM"
    finally:
        master.terminate()
        master.wait(10)
