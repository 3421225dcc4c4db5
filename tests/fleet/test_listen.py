"""A master's port refuses connections until one of its workers has loaded the application
(``fleet/server/listen.py``), instead of queueing them where nothing can answer yet: a load balancer
then sends calls to another instance at once instead of letting them wait out the boot."""
from __future__ import annotations

import socket
import time

import pytest
import requests

from helpers.masters import Master
from helpers.util import unique, wait_until

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("reuse_port", ["off", "on"])
def test_the_port_refuses_until_a_worker_serves(services, tmp_path_factory, reuse_port):
    """With ``reuse_port`` each worker makes its own socket after its fork: it too listens only
    once its worker has loaded the application (fleet/server/listen.py ``unlisten_worker_sockets``).

    A worker loads the application in about 0.3 s of CPU, a window a busy test process could
    miss; so here the workers cannot load it until the test lets them: the master's store role
    may not log in (a worker waits for its store: fleet/app.py ``wait_for_store``), and the
    port must refuse for as long as that lasts."""
    role, password = unique("listen_gate").replace("-", "_"), "gate-" + unique("pw")
    services.sql(f"CREATE ROLE {role} NOLOGIN SUPERUSER PASSWORD %s", (password,))
    store_url = f"postgresql://{role}:{password}@127.0.0.1:{services.pg.port}/gateway"
    master = Master(services, tmp_path_factory.mktemp("listen-home"), workers=2, reuse_port=reuse_port,
                    database_url=store_url).spawn()
    try:
        # gunicorn forks its workers once the port is bound.
        deadline = time.monotonic() + 30
        while not master.worker_pids():
            assert master.proc.poll() is None and time.monotonic() < deadline, master.log_tail()
            time.sleep(0.01)
        # The workers are up, waiting for the store: a worker has met the role that may not log in.
        refused_login = f'role "{role}" is not permitted to log in'
        wait_until(lambda: refused_login in services.pg.log_file.read_text(errors="replace"), 30, 0.05,
                   "a worker waiting for its store")
        for _ in range(10):
            with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
                probe.settimeout(2)
                probe.connect(("127.0.0.1", master.port))
            time.sleep(0.05)      # probes spread over the wait: the port refuses all along
        services.sql(f"ALTER ROLE {role} LOGIN")
        master.wait_ready(60)
        # Once it listens, it serves at once.
        assert requests.get(master.base + "/health", timeout=5).status_code == 200
    finally:
        master.stop()
        services.sql(f"ALTER ROLE {role} NOLOGIN")
