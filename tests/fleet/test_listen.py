"""A master's port refuses connections until one of its workers has loaded the application
(``fleet/listen.py``), instead of queueing them where nothing can answer yet: a load balancer
then sends calls to another instance at once instead of letting them wait out the boot."""
from __future__ import annotations

import socket
import time

import pytest
import requests

from helpers.masters import Master

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("reuse_port", ["off", "on"])
def test_the_port_refuses_until_a_worker_serves(services, tmp_path_factory, reuse_port):
    """With ``reuse_port`` each worker makes its own socket after its fork: it too listens only
    once its worker has loaded the application (fleet/listen.py ``unlisten_worker_sockets``)."""
    master = Master(services, tmp_path_factory.mktemp("listen-home"), workers=2, reuse_port=reuse_port).spawn()
    try:
        # gunicorn forks its workers once the port is bound, seconds before one has loaded
        # the application.
        deadline = time.monotonic() + 30
        while not master.worker_pids():
            assert master.proc.poll() is None and time.monotonic() < deadline, master.log_tail()
            time.sleep(0.01)
        outcomes = []
        while True:
            with socket.socket() as probe:
                probe.settimeout(2)
                try:
                    probe.connect(("127.0.0.1", master.port))
                except ConnectionRefusedError:
                    outcomes.append("refused")
                    time.sleep(0.02)
                    continue
            break
        master.wait_ready(60)
        print(f"refused {len(outcomes)} times while the workers loaded the application")
        assert outcomes, "the port took a connection before any worker could serve it"
        # Once it listens, it serves at once: the connection that was let in is answered.
        assert requests.get(master.base + "/health", timeout=5).status_code == 200
    finally:
        master.stop()
