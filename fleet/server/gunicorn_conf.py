"""gunicorn configuration: one worker per core, each pinned to its own core.

    gunicorn -c fleet/server/gunicorn_conf.py 'fleet.app:create_app()'

Everything comes from ``GATEWAY_*`` settings; a ``--bind`` on the command line wins.
With no ``GATEWAY_DATABASE_URL`` / ``GATEWAY_REDIS_URL`` the embedded default (a local
PostgreSQL and Redis under ``GATEWAY_HOME``) is started here, in the master, before any
worker forks, and the workers inherit its URLs.

Worker class: gthread. Behind a load balancer connections are kept alive; gthread keeps
idle keep-alive connections in a poller and hands only ready requests to its threads, so
a worker holds hundreds of connections with a handful of threads, and it needs no extra
dependency (docs/bench/ has the measurement against sync). ``gthread`` here means
fleet/server/worker.py's subclass of it: the workers share one listening socket and balance their
accepts through a table the master makes before forking (fleet/server/slots.py), and restart
without a client noticing.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gunicorn.arbiter import Arbiter
    from gunicorn.workers.base import Worker

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from fleet.server.boot import compile_own_code, preload_libraries  # noqa: E402
from fleet.server.listen import make_unlistened, start_listening  # noqa: E402
from fleet.server.slots import Slots  # noqa: E402
from fleet.server.worker import close_application  # noqa: E402
from gateway.settings import Settings  # noqa: E402

_settings = Settings.from_env()
if not (_settings.database_url and _settings.redis_url and _settings.admin_key and _settings.secret_key):
    from fleet.ops.local import ensure_embedded  # noqa: E402

    os.environ.update(ensure_embedded(_settings))
    _settings = Settings.from_env()

bind = [_settings.bind]
workers = _settings.worker_count()
# "gthread": gunicorn's gthread balanced across this master's workers (fleet/server/worker.py).
worker_class = ("fleet.server.worker.BalancedThreadWorker" if _settings.worker_class == "gthread"
                else _settings.worker_class)
threads = _settings.threads
keepalive = _settings.keepalive
# GATEWAY_REUSE_PORT=on: each worker its own listening socket, which the kernel spreads
# connections across; off by default: restarts then reset queued connections (settings).
reuse_port = _settings.reuse_port_enabled()
max_requests = _settings.max_requests
max_requests_jitter = _settings.max_requests // 10
timeout = 60
graceful_timeout = 30
# Worker heartbeat files in memory, never on a disk that can stall.
worker_tmp_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None
# One control socket per master (the default is one fixed path for every gunicorn).
_run_dir = os.path.join(os.path.abspath(_settings.home), "run")
os.makedirs(_run_dir, exist_ok=True)
control_socket = os.path.join(_run_dir, f"gunicorn-{_settings.instance or os.getpid()}.ctl")
# Metrics of every worker of this master, aggregated at scrape time (gateway/observe.py).
if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    _metrics_dir = os.path.join(_run_dir, f"metrics-{_settings.instance or os.getpid()}")
    shutil.rmtree(_metrics_dir, ignore_errors=True)
    os.makedirs(_metrics_dir)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = _metrics_dir
# The access log is written by each worker's history thread, off the hot path.
accesslog = None
# What a proxy may tell the gateway is GATEWAY_TRUST_PROXY's to decide (X-Forwarded-For, read by
# the gateway itself); gunicorn honours no forwarding header from anyone: no scheme headers, no
# SCRIPT_NAME/PATH_INFO from headers. With nothing left to trust, every peer may be "trusted",
# which spares each request gunicorn's parse of the peer's address (ipaddress, ~230 bytecodes).
forwarded_allow_ips = "*"
secure_scheme_headers: dict = {}
forwarder_headers = ""
loglevel = _settings.log_level
proc_name = f"gateway-fleet{'-' + _settings.instance if _settings.instance else ''}"

_CPUS = _settings.usable_cpus()

# Every worker forks with the third-party libraries imported, and finds our own code compiled
# (fleet/server/boot.py says why).
preload_libraries()
compile_own_code()


def _slots(server: Arbiter) -> Slots:
    """The master's table of its workers (fleet/server/slots.py), kept on the arbiter: a reload
    runs this file again, and old and new workers must share one table."""
    table = getattr(server, "gw_slots", None)
    if table is None:
        table = Slots(4 * max(1, server.num_workers) + 8)   # room for a reload's two generations
        server.gw_slots = table
    return table


def pre_fork(server: Arbiter, worker: Worker) -> None:
    """In the master: a slot in the workers' table (fleet/server/worker.py balances by it), and the
    first of the cores holding the fewest live workers, so a respawned worker takes the core
    its predecessor left (also with more workers than cores)."""
    table = _slots(server)
    worker.gw_slots = table
    worker.gw_slot = table.allocate(worker.age)
    if not _CPUS:
        worker.gw_cpu = None
        return
    load = dict.fromkeys(_CPUS, 0)
    for w in server.WORKERS.values():
        cpu = getattr(w, "gw_cpu", None)
        if cpu in load:
            load[cpu] += 1
    worker.gw_cpu = min(_CPUS, key=load.__getitem__)


def _stop_with_the_master(master_pid: int) -> None:
    """A worker whose master dies (SIGKILL, a crash) is told at once (PR_SET_PDEATHSIG) and
    stops gracefully: it finishes what it holds and releases the port, instead of noticing
    its new parent seconds later while new connections queue on a socket nobody will serve."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, signal.SIGTERM) != 0:     # 1: PR_SET_PDEATHSIG (Linux)
        return
    if os.getppid() != master_pid:              # the master died before the call: too late to be told
        os.kill(os.getpid(), signal.SIGTERM)


def post_fork(server: Arbiter, worker: Worker) -> None:
    if sys.platform.startswith("linux"):
        _stop_with_the_master(server.pid)
    cpu = getattr(worker, "gw_cpu", None)
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
        server.log.info("worker %s pinned to cpu %s", worker.pid, cpu)


def on_starting(server: Arbiter) -> None:
    """The port is bound here and listens only once a worker has loaded the application
    (fleet/server/listen.py): until then a balancer's connects are refused, not queued."""
    make_unlistened(server)


def post_worker_init(worker: Worker) -> None:
    """/ready answers 503 from the moment this worker starts draining (SIGTERM, reload), and
    its /events streams end (else each would hold the worker until the graceful timeout).
    The application is loaded: the port may take connections (fleet/server/listen.py)."""
    parts = getattr(worker.wsgi, "parts", None)   # None: gunicorn's error app, ours failed to load
    if parts is not None:
        parts.drain_when(lambda: not worker.alive)
    start_listening(worker)


def child_exit(server: Arbiter, worker: Worker) -> None:
    from prometheus_client import multiprocess

    _slots(server).free(getattr(worker, "gw_slot", None), worker.age)

    multiprocess.mark_process_dead(worker.pid)


def worker_exit(server: Arbiter, worker: Worker) -> None:
    if os.getpid() == server.pid:       # the master, for a worker gone before it was reaped
        _slots(server).free(getattr(worker, "gw_slot", None), worker.age)
    close_application(worker)
