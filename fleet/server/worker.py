"""gunicorn's threaded worker (gthread), balanced across the workers of its master, and
restarted without a client noticing.

Why: every worker waits on one shared listening socket, and whichever wakes first accepts a
burst of keep-alive connections that stay with it for their life (shares of 0.00+0.94 were
measured with two workers). One socket per worker (``SO_REUSEPORT``) spreads them, but then a
worker that leaves resets the connections queued on its socket. So the socket stays shared,
and (like nginx's ``accept_mutex``/``accept_disabled``) a worker stops polling it while it
holds more connections than the least loaded of its serving siblings plus ``SLACK``; the
least loaded one is always polling, so the socket is never left unwatched. gthread accepts
one connection per wake-up and this worker re-reads the table after each accept, so one
wake-up cannot swallow a burst. Connections that are already unevenly spread (a sibling
restarted, was killed, or came up late) are moved by answering a request on each excess
connection with ``Connection: close``: the client reconnects, and only under-loaded workers
are accepting.

Restarts:
- SIGHUP reload: gunicorn forks the new workers and stops the old ones at once, while the new
  ones still load the application (about a second: every call stalled that long). An old
  worker told to stop keeps serving while a younger sibling is still booting, at most
  ``HANDOVER_MAX_S``.
- ``max_requests`` recycling: a worker leaves only while every sibling is serving, and not
  within ``RECYCLE_SPACING_S`` of one being away (one at a time, under the table's lock): the
  others carry the load while its replacement boots, and a replacement that just started is
  not left alone with every client at once.
- A worker killed (SIGKILL) loses the calls it had in flight; connections queued on the shared
  socket are served by the others, and the replacement is given its share by shedding.
- Leaving (any reason): gthread stops polling the socket, finishes what it holds and answers
  a request arriving on a kept-alive connection with ``Connection: close``. Connections still
  queued on the shared socket are served by the siblings, or by the replacement.
- Stopping the master: the master closes its copy of the socket first; a worker that sees
  that accepts what is queued, then shuts the socket down, so later clients are refused (they
  sent nothing) instead of being queued and reset when the last copy closes. (A USR2 binary
  upgrade would share the socket with a new master: the fleet does not use it.)
- The master killed (SIGKILL, a crash): PR_SET_PDEATHSIG sends each worker SIGTERM
  (fleet/server/gunicorn_conf.py). An orphan hands over to nobody, shuts the socket down as above,
  closes its idle kept-alive connections at once (not after gunicorn's 2 s stop linger: nginx
  retries a GET that meets a closed upstream keep-alive connection on another server), finishes
  the calls it holds (answered with ``Connection: close``) and exits.
- Closing a connection never blocks the loop (``_close_gently``).

With ``reuse_port`` (a socket per worker) the kernel spreads connections: no balancing, and a
leaving worker drains and shuts its own socket.
"""
from __future__ import annotations

import errno
import logging
import math
import os
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from gunicorn import util
from gunicorn.http import wsgi
from gunicorn.workers.gthread import ThreadWorker

from fleet.server.front_worker import ReadingThreadWorker
from fleet.server.lean import LeanResponse, nothing_to_drain
from fleet.server.lean_request import LeanParser, plain_environ, replayable
from fleet.server.slots import BOOTING, LEAVING, SERVING, Slots

# environ: time.monotonic() when the request was whole (fleet/server/front.py): gateway.http.common.ARRIVED,
# copied (this module is loaded by the master, which must not load the application; a test holds them equal).
ARRIVED = "gateway.arrived"

SLACK = 1                 # connections a worker may hold above the least loaded sibling
EVALUATE_EVERY_S = 0.005  # re-read the table at least this often while serving
IDLE_POLL_S = 0.005       # while not accepting: look again this soon (a sibling may have caught up)
HANDOVER_MAX_S = 30.0     # an old worker waits at most this long for its replacements to serve
RECYCLE_SPACING_S = 2.0   # a worker recycles no sooner than this after a sibling was away
NOTIFY_EVERY_S = 1.0      # the heartbeat to the master at most this often (its timeout: 60 s)


def close_application(worker: Any) -> None:
    """Close what the worker's application holds (gateway.app.Parts: the history's last batch
    stored, the sessions closed, the log's queue drained); nothing when it did not load."""
    parts = getattr(getattr(worker, "wsgi", None), "parts", None)
    if parts is not None:
        parts.close()


class BalancedThreadWorker(ReadingThreadWorker):
    """gthread with balanced accepts, connection shedding and handover (module docstring).

    The master hands it ``gw_slots`` (the shared table) and ``gw_slot`` (its slot) in
    ``pre_fork`` (fleet/server/gunicorn_conf.py); without them it behaves as plain gthread."""

    gw_slots: Slots | None = None
    gw_slot: int | None = None
    alive: bool            # gunicorn's (untyped) attributes this class reads and writes
    max_requests: int
    cfg: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # gunicorn's own max_requests check would stop this worker at once, whatever its
        # siblings are doing; this worker leaves at that count when a sibling can take over.
        self._recycle_at = self.max_requests
        self.max_requests = sys.maxsize
        self._fair = True
        self._next_evaluation = 0.0
        self._handover_until = 0.0
        self._left = False
        self._shed = 0             # responses still to be sent with Connection: close
        self._marked = 0           # connections marked for it and not yet closed
        self._shed_lock = threading.Lock()
        self._sibling_away_at = 0.0
        self._socket_gone = False
        self._one_socket_each = bool(self.cfg.reuse_port)
        self._notified_at = -math.inf
        self._errors = wsgi.WSGIErrorsWrapper(self.cfg)   # what wsgi.create makes per request
        self._from_memory: Callable[[str, tuple, str, str | None], Any] | None = None   # set in run()
    def notify(self) -> None:
        """gunicorn's heartbeat, a utime(2) of the worker's temporary file, ran on every turn of
        gthread's loop: one or two system calls per request. The master only compares its time
        with the worker timeout, so once a second (a quarter of the timeout, if that is shorter)
        says as much."""
        now = time.monotonic()
        if now - self._notified_at >= min(NOTIFY_EVERY_S, self.timeout / 4):
            self._notified_at = now
            super().notify()

    # --- the table ---------------------------------------------------------------------------
    @property
    def _balanced(self) -> bool:
        return self.gw_slots is not None and self.gw_slot is not None and not self._one_socket_each

    def run(self) -> None:
        if self.gw_slots is not None and self.gw_slot is not None:
            self.gw_slots.set_state(self.gw_slot, SERVING, os.getpid())
        # A process-wide signal (SIGTERM from PR_SET_PDEATHSIG or a kill) may be taken by any
        # thread; Python runs its handler on the main thread only, and gthread's loop slept on
        # in its poll until its timeout (up to 1 s: an orphan kept its idle connections that
        # long). Python writes every signal to the wakeup fd gunicorn set: the loop watches it.
        self.poller.register(self.PIPE[0], selectors.EVENT_READ, self._signalled)
        # Calls the application answers from memory are answered on this loop (below); not with
        # gunicorn's access log on (its lock and writes would be the loop's).
        if self._plain_heads and not self.log.access_log_enabled:
            self._from_memory = getattr(self.wsgi, "loop_answers", None)
            serve = getattr(self._from_memory, "serve_on_loop", None)
            if serve is not None:
                serve()     # /ready's watcher starts looking: the loop answers /ready from its looks
        metrics = getattr(self.wsgi, "metrics", None)
        if metrics is not None:
            self._closed_counter = lambda reason: metrics.front_closed.labels(reason).inc()
        try:
            super().run()
        finally:
            self._expire_closing(0.0, everything=True)
        if self.nr_conns == 0:
            self._exit_now()

    def _exit_now(self) -> None:
        """Every call this worker took is answered (past gunicorn's graceful timeout it is not:
        then the usual way): close the application as fleet/server/gunicorn_conf.py's ``worker_exit``
        does (``close_application``), flush, and leave without the interpreter's teardown, which
        only frees memory the kernel frees anyway: 25 ms of CPU measured, spent next to the
        workers that take over, at every reload, recycle and restart."""
        self.log.info("Worker exiting (pid: %s): every call answered, the application closed", self.pid)
        close_application(self)
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(0)

    def _signalled(self, pipe: int) -> None:
        """Empty the wakeup fd; the handler itself runs on the main thread's next bytecode."""
        try:
            while os.read(pipe, 4096):
                pass
        except OSError:      # drained (non-blocking), or closed during the stop
            pass

    def _younger_booting(self) -> bool:
        assert self.gw_slots is not None and self.gw_slot is not None
        return any(state == BOOTING and age > self.age for state, age, _ in self.gw_slots.others(self.gw_slot))

    def _may_leave(self) -> bool:
        """Whether siblings carry the load while this worker and its replacement are away: none
        of them is away itself (booting, leaving), and one serves (with a single worker the
        socket has nobody else, and its queue waits for the replacement)."""
        assert self.gw_slots is not None and self.gw_slot is not None
        states = [state for state, _, _ in self.gw_slots.others(self.gw_slot)]
        now = time.monotonic()
        if not all(state == SERVING for state in states):
            self._sibling_away_at = now
            return False
        # Not at once when a replacement starts serving either: the clients of the worker that
        # left would follow this one's out again, and one worker would hold them all.
        return now - self._sibling_away_at >= RECYCLE_SPACING_S and (bool(states) or self.cfg.workers == 1)

    # --- accepting -----------------------------------------------------------------------------
    def set_accept_enabled(self, enabled: bool) -> None:
        if not self.alive and not self._left and self.gw_slots is not None and self.gw_slot is not None:
            self._leave()      # gthread's loop ended (SIGTERM, parent gone): before it drains
        super().set_accept_enabled(enabled and self._fair and not self._socket_gone)

    def accept(self, listener: socket.socket) -> None:
        try:
            super().accept(listener)
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
            # A sibling shut the socket down (the master is stopping): nothing more to accept;
            # this worker's own SIGTERM is on its way.
            self._socket_gone = True
            ThreadWorker.set_accept_enabled(self, False)
            return
        if self._balanced and self.alive:
            self._evaluate(time.monotonic())

    def _evaluate(self, now: float) -> None:
        """Publish this worker's connections; accept only while at most SLACK above the least
        loaded serving sibling; shed what exceeds an even share (rounded up) by more than SLACK."""
        slots, slot = self.gw_slots, self.gw_slot
        assert slots is not None and slot is not None
        self._next_evaluation = now + EVALUATE_EVERY_S
        mine = self.nr_conns
        slots.set_connections(slot, mine)
        least, total, serving = None, mine, 1
        for state, _, conns in slots.others(slot):
            if state == SERVING:
                least = conns if least is None else min(least, conns)
                total += conns
                serving += 1
            else:
                self._sibling_away_at = now      # for _may_leave's spacing
        self._fair = least is None or mine <= least + SLACK
        even = -(-total // serving)
        with self._shed_lock:
            self._shed = max(0, mine - even - self._marked) if mine > even + SLACK else 0
        self.set_accept_enabled(self.alive and self.nr_conns < self.worker_connections)

    # --- the loop ------------------------------------------------------------------------------
    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        if self.gw_slots is not None and self.gw_slot is not None:
            timeout = self._tend(timeout)
        super().wait_for_and_dispatch_events(timeout)

    def _tend(self, timeout: float) -> float:
        """Once per turn of gthread's loop (serving and draining): hand over, recycle, balance."""
        now = time.monotonic()
        if self.alive and self._handover_until:
            if now < self._handover_until and self._younger_booting():
                pass
            else:
                self._handover_until = 0.0
                self.alive = False
        if self.alive and self.nr >= self._recycle_at:
            self._recycle()
        if not self.alive:
            if not self._left:
                self._leave()
            if self._orphaned():
                self._close_idle()
                if self.nr_conns == 0:
                    return 0.0      # nothing left to finish: out of the loop at once
            return timeout
        if self._one_socket_each:
            return timeout
        if now >= self._next_evaluation or not self._accepting:
            self._evaluate(now)
        return timeout if self._accepting else min(timeout, IDLE_POLL_S)

    def _recycle(self) -> None:
        """Leave after ``max_requests``, when ``_may_leave``: one worker at a time."""
        slots = self.gw_slots
        assert slots is not None and self.gw_slot is not None
        if not slots.leave_lock.acquire(False):
            return
        try:
            if not self._may_leave():
                return
            self.log.info("Autorestarting worker after %s requests.", self.nr)
            self.alive = False
            self._leave()
        finally:
            slots.leave_lock.release()

    def _leave(self) -> None:
        assert self.gw_slots is not None and self.gw_slot is not None
        self._left = True
        self._cap_reading()
        self.gw_slots.set_state(self.gw_slot, LEAVING)
        ThreadWorker.set_accept_enabled(self, False)
        if self._orphaned():
            # Idle connections hold nothing to finish: closed before the queue is drained below
            # (behind nginx new connections keep arriving until the socket is shut down), so
            # that a balancer's retry is not kept waiting behind that drain.
            self._close_idle()
        if self._one_socket_each or not self._master_holds_socket():
            self._close_listeners()

    # --- stopping the master -------------------------------------------------------------------
    def _master_holds_socket(self) -> bool:
        """Whether the master still has the listening socket open (it closes it first when it
        stops; it keeps it for a reload and a worker's restart)."""
        try:
            inodes = {os.fstat(s.fileno()).st_ino for s in self.sockets}
            fd_dir = f"/proc/{self.ppid}/fd"
            if os.getppid() != self.ppid:
                return False
            for fd in os.listdir(fd_dir):
                try:
                    link = os.readlink(f"{fd_dir}/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:[") and int(link[8:-1]) in inodes:
                    return True
        except OSError:
            return True    # cannot tell (no /proc): leave the socket to the last close, as gunicorn does
        return False

    def _close_listeners(self) -> None:
        """Serve what is queued, then stop the socket taking connections (Linux: a listening
        socket shut down refuses new ones), so that none is queued to be reset later. (A connection
        queued between the last accept and the shutdown is still reset, unless
        ``net.ipv4.tcp_migrate_req=1`` moves it to a sibling's socket.)"""
        for listener in self.sockets:
            try:
                listener.setblocking(False)
                while True:
                    before = self.nr_conns
                    self._accept_one(listener)
                    if self.nr_conns == before:
                        break
                listener.shutdown(socket.SHUT_RD)
            except OSError as error:
                if error.errno not in (errno.ENOTCONN, errno.EINVAL, errno.EBADF):
                    self.log.warning("closing the listening socket: %s", error)

    def _accept_one(self, listener: socket.socket) -> None:
        ThreadWorker.accept(self, listener)

    # --- the master gone ------------------------------------------------------------------------
    def _orphaned(self) -> bool:
        """The master is gone (SIGKILL, a crash): this worker was re-parented, and its SIGTERM
        came from PR_SET_PDEATHSIG (fleet/server/gunicorn_conf.py)."""
        return os.getppid() != self.ppid

    def _close_idle(self) -> None:
        """An orphan closes its idle kept-alive (and not yet used) connections at once instead
        of gunicorn's stop linger (2 s): nobody restarts it, the supervisor's new master needs the
        port, and a balancer retries an idempotent request that meets a closed upstream
        keep-alive connection (nginx: ``proxy_next_upstream error``). A live master's workers keep
        the linger, which answers a request already on its way with ``Connection: close``."""
        self.murder_keepalived(force=True)
        while self.pending_conns:
            conn = self.pending_conns.popleft()
            try:
                self.poller.unregister(conn.sock)
            except (OSError, KeyError, ValueError):
                pass
            self.nr_conns -= 1
            conn.close()

    # --- signals -------------------------------------------------------------------------------
    def handle_exit(self, sig: int, frame: Any) -> None:
        """SIGTERM: during a reload (a younger sibling still booting) keep serving until it
        serves, instead of leaving the socket to nobody while the application loads. An orphan
        (the master gone) hands over to nobody: its siblings are orphans too."""
        if self._orphaned():
            super().handle_exit(sig, frame)
            return
        if (self.alive and not self._handover_until and self.gw_slots is not None
                and self.gw_slot is not None and self._younger_booting()):
            self._handover_until = time.monotonic() + HANDOVER_MAX_S
            self.method_queue.defer(lambda: None)      # wake the loop
            return
        super().handle_exit(sig, frame)

    def _answered_here(self, conn: Any) -> bool:
        """A request that arrived whole and alone, answered on this loop instead of a thread
        when the application answers it from memory alone (gateway/pipeline/from_memory.py;
        ``/health``): a thread would only add its hand-offs. The request must be plain
        (``LeanParser.read_ready``; what was read otherwise goes to a thread as usual) and be a
        GET the application may have seen before (``replayable``). The answer goes out as
        ``_serve`` sends one (``LeanResponse``, the same keep-alive rules), written without
        waiting: what the socket does not take at once is sent by a thread (``_LoopWriter``)."""
        parser = conn.parser
        if self._from_memory is None or type(parser) is not LeanParser:
            return False
        req = parser.read_ready()
        if req is None:
            return False
        head = replayable(req)
        if head is None:
            return False
        assert self._from_memory is not None
        try:
            answer = self._from_memory(req.uri, head[0], conn.client[0], head[1])
        except Exception:   # a defect there must not stop the loop: a thread answers the call
            self.log.exception("answering from memory")
            return False
        if answer is None:
            return False
        parser.ready = None                       # answered here: not a thread's next request
        self._mark_for_shedding(req, conn)
        self.nr += 1
        writer = _LoopWriter(conn.sock)
        resp = LeanResponse(req, writer, self.cfg)
        keep = False
        try:
            self.cfg.pre_request(self, req)
            if not self.alive or not self.cfg.keepalive or len(self.keepalived_conns) >= self.max_keepalived:
                resp.force_close()
            resp.start_response(answer.status, answer.headers)
            if answer.body:
                resp.write(answer.body)
            resp.close()
            keep = not resp.should_close()
            self.cfg.post_request(self, req, {}, resp)
        except Exception:
            self.log.exception("Error handling request")
        if writer.pending:
            future = self.tpool.submit(writer.send_rest, keep)
            future.add_done_callback(lambda done: self.method_queue.defer(self.finish_request, conn, done))
        else:
            self.finish_request(conn, _Answered(keep))
        return True

    # --- moving connections --------------------------------------------------------------------
    def handle_request(self, req: Any, conn: Any) -> bool:
        self._mark_for_shedding(req, conn)
        return self._serve(req, conn)

    def _mark_for_shedding(self, req: Any, conn: Any) -> None:
        if self._shed > 0 and not getattr(conn, "gw_shed", False):
            with self._shed_lock:
                if self._shed > 0:
                    self._shed -= 1
                    self._marked += 1
                    conn.gw_shed = True
                    req.must_close = True         # this answer says Connection: close

    def _keepalive_after(self, conn: Any, keepalive: bool) -> bool:
        """gthread drains the rest of a request's body before keeping its connection, under a
        deadline that costs two ``settimeout`` system calls per call; a request whose body was
        empty, or read to its end, leaves nothing to drain (what gthread's drain would find)."""
        if keepalive and nothing_to_drain(conn.parser.mesg):
            return True
        return bool(super()._keepalive_after(conn, keepalive))

    def _serve(self, req: Any, conn: Any) -> bool:
        """gthread's ``handle_request`` (gunicorn 27.0.1), answering through ``LeanResponse``
        (fleet/server/lean.py) and timing the call only when there is an access log to write it to.
        Whether to keep the connection: gunicorn's rules, unchanged."""
        environ: dict = {}
        resp = None
        if getattr(conn, "gw_continued", False):
            conn.gw_continued = False
            req._expected_100_continue = False    # the front told the client to go on already
        try:
            self.cfg.pre_request(self, req)
            logged = self.log.access_log_enabled
            started = time.monotonic() if logged else 0.0
            if getattr(req, "plain", False) and type(conn.client) is tuple and type(conn.server) is tuple:
                resp = LeanResponse(req, conn.sock, self.cfg)
                environ = plain_environ(req, conn.sock, conn.client, conn.server, self.cfg, resp, self._errors)
            else:
                resp, environ = wsgi.create(req, conn.sock, conn.client, conn.server, self.cfg,
                                            response_class=LeanResponse)
            environ["wsgi.multithread"] = True
            environ[ARRIVED] = getattr(conn, "gw_arrived", None) or time.monotonic()
            self.nr += 1
            if not self.alive or not self.cfg.keepalive or len(self.keepalived_conns) >= self.max_keepalived:
                resp.force_close()
            respiter = self.wsgi(environ, resp.start_response)
            try:
                if isinstance(respiter, environ["wsgi.file_wrapper"]):
                    resp.write_file(respiter)
                else:
                    for item in respiter:
                        resp.write(item)
                resp.close()
            finally:
                if logged:
                    self.log.access(resp, req, environ, timedelta(seconds=time.monotonic() - started))
                if hasattr(respiter, "close"):
                    respiter.close()
            if resp.should_close():
                return False
        except OSError:
            raise
        except (Exception, SystemExit):
            if resp and resp.headers_sent:
                # an answer already begun cannot become a 500 on the same socket
                self.log.exception("Error handling request")
                util.close_graceful(conn.sock)
                raise StopIteration() from None
            raise
        finally:
            try:
                self.cfg.post_request(self, req, environ, resp)
            except Exception:
                self.log.exception("Exception in post_request hook")
        return True

    def finish_request(self, conn: Any, fs: Any) -> None:
        if getattr(conn, "gw_shed", False):
            conn.gw_shed = False
            with self._shed_lock:
                self._marked -= 1
        if fs.done() and not fs.cancelled() and fs.exception() is None and fs.result() is False:
            conn.close = lambda graceful=False: self._close_gently(conn.sock)
        super().finish_request(conn, fs)

class _LoopWriter:
    """A connection's socket while the loop answers on it: a send never waits. What the kernel
    does not take at once (a client that does not read) is kept, and sent by a thread
    (``send_rest``) before the connection goes back to the loop."""

    __slots__ = ("sock", "pending")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pending: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        if not self.pending:
            try:
                sent = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            if sent == len(data):
                return
            data = data[sent:]
        self.pending.append(bytes(data))

    def send_rest(self, keep: bool) -> bool:
        """On a thread: what the kernel did not take; then whether to keep the connection."""
        try:
            self.sock.setblocking(True)
            for data in self.pending:
                self.sock.sendall(data)
        except OSError:
            return False
        return keep

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


class _Answered:
    """``finish_request``'s future for an answer made on the loop: done, with ``keep``."""

    __slots__ = ("_keep",)

    def __init__(self, keep: bool) -> None:
        self._keep = keep

    def done(self) -> bool:
        return True

    def cancelled(self) -> bool:
        return False

    def exception(self) -> None:
        return None

    def result(self) -> bool:
        return self._keep
