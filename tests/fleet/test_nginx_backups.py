"""nginx's configuration (``fleet/ops/cli.py`` ``start_balancer``) never answers 502 while an instance
can serve. nginx skips an instance for ``fail_timeout`` after three failed connects; when the
other one goes down within that second (a rolling restart: the first instance back, the second
stopping), both were skipped and nginx answered 502 "no live upstreams" (174 of 9,851 calls in
tests/fleet/test_supervisor.py before). Each instance is listed again as a backup that is never
skipped. Here with two small HTTP servers standing for the instances."""
from __future__ import annotations

import http.server
import os
import shutil
import socket
import socketserver
import subprocess
import threading
import time

import pytest
import requests

from fleet.ops import cli
from gateway.settings import Settings
from helpers.ports import free_port

pytestmark = [pytest.mark.fleet,    # nginx in front of two instances
              pytest.mark.skipif(shutil.which("nginx") is None and not os.path.exists("/usr/sbin/nginx"),
                                 reason="no nginx")]


class Instance:
    """An HTTP server answering its name, started and stopped at will (stopped: refused)."""

    def __init__(self, name: str, port: int) -> None:
        self.name, self.port = name.encode(), port
        self.server: socketserver.ThreadingTCPServer | None = None
        self.open: set = set()     # its connections (nginx keeps some alive): a stop closes them too

    def start(self) -> None:
        body, open_ = self.name, self.open

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                open_.add(self.connection)

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        assert self.server is not None
        self.server.shutdown()
        self.server.server_close()
        self.server = None
        for conn in list(self.open):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.open.clear()


def test_one_instance_back_within_fail_timeout_and_the_other_down_is_no_502(tmp_path):
    front = free_port()
    a, b = Instance("a", free_port()), Instance("b", free_port())
    settings = Settings(home=str(tmp_path), bind=f"127.0.0.1:{front}")
    (tmp_path / "run").mkdir()
    conf = cli.start_balancer(settings, [f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"], start=False)
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    proc = subprocess.Popen([nginx, "-c", str(conf), "-p", str(tmp_path / "nginx"), "-g", "daemon off;"],
                            stderr=subprocess.DEVNULL)
    session = requests.Session()
    try:
        b.start()
        deadline = time.monotonic() + 10
        while True:
            try:
                if session.get(f"http://127.0.0.1:{front}/", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, "nginx did not answer"
            time.sleep(0.05)
        # a is down: nginx's connects to it fail, and after three it skips a for a second.
        assert {session.get(f"http://127.0.0.1:{front}/").content for _ in range(20)} == {b"b"}
        # a comes back, b goes down, within that second.
        a.start()
        b.stop()
        answers = [session.get(f"http://127.0.0.1:{front}/") for _ in range(50)]
        got = {(r.status_code, r.content) for r in answers}
        assert got == {(200, b"a")}, got
    finally:
        session.close()
        proc.terminate()
        proc.wait(10)
        for instance in (a, b):
            if instance.server is not None:
                instance.stop()
