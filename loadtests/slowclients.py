"""Slow clients held open against a server, and a prober that times one path meanwhile.

- ``Holder``: a child process (``python -m loadtests.slowclients hold ...``, pinned with taskset) that opens N
  TCP connections, sends each the first lines of a request head and then nothing, and holds them until told to
  let go. It says how many connected (a server whose accept queue is full leaves the rest pending), and, at the
  release, what the server did with them meanwhile: still open, closed, answered (a 408 or 400 for a head that
  took too long), reset. A process of its own: its file descriptors are not the harness's, and its work is not
  in the harness's CPU.
- ``probe``: one client, one keep-alive connection, GETs one after another for a while, each timed from its
  send to the last byte of its body; a request without an answer within the timeout counts as a timeout (and
  the connection is opened again), never as a fast answer. Percentiles rank timeouts above every answer, so a
  stalled server shows as ``p99 > timeout`` rather than as the few calls that got through.

Standard library only.
"""
from __future__ import annotations

import json
import math
import resource
import selectors
import socket
import subprocess
import sys
import time

from .system import REPO, taskset_prefix

# The head every held connection sends: a request line and one field, without the blank line that would end it.
PARTIAL_HEAD = b'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n'


class Holder:
    """N partial heads held open against host:port by a child process, for a ``with`` block."""

    def __init__(self, host: str, port: int, count: int, *, cpu: str | None, connect_s: float = 3.0):
        self.cmd = [*taskset_prefix(cpu), sys.executable, '-m', 'loadtests.slowclients', 'hold', host, str(port),
                    str(count), str(connect_s)]
        self.count = count
        self.connect_s = connect_s
        self.process: subprocess.Popen | None = None
        self.held: dict = {}
        self.released: dict = {}

    def __enter__(self) -> Holder:
        self.process = subprocess.Popen(self.cmd, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, bufsize=1)
        line = self.process.stdout.readline() if self.process.stdout else ''
        if not line:
            self.process.wait(timeout=10)
            raise RuntimeError(f'the slow-client holder exited ({self.process.returncode}) before holding')
        self.held = json.loads(line)
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def release(self) -> dict:
        """Let go of every connection; what the server had done with them (the child's last line)."""
        process = self.process
        if process is None:
            return self.released
        self.process = None
        try:
            if process.stdin:
                process.stdin.write('release\n')
                process.stdin.close()
            line = process.stdout.readline() if process.stdout else ''
            self.released = json.loads(line) if line else {}
            process.wait(timeout=30)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()
        return self.released


def hold(host: str, port: int, count: int, connect_s: float) -> None:
    """The child: connect `count` sockets without blocking, send each PARTIAL_HEAD once connected, print one
    JSON line, wait for a line on stdin, report what the server did, close them all."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    selector = selectors.DefaultSelector()
    sockets: list[socket.socket] = []
    failed = 0
    started = time.monotonic()
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            code = sock.connect_ex((host, port))
        except OSError:            # out of descriptors or ports: what was opened is held
            sock.close()
            failed += 1
            continue
        if code not in (0, 115):   # 115: EINPROGRESS
            sock.close()
            failed += 1
            continue
        sockets.append(sock)
        selector.register(sock, selectors.EVENT_WRITE)
    connected = []
    deadline = started + connect_s
    while selector.get_map() and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=max(0.0, deadline - time.monotonic())):
            sock = key.fileobj
            selector.unregister(sock)
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                failed += 1
                continue
            try:
                sock.send(PARTIAL_HEAD)
                connected.append(sock)
            except OSError:
                failed += 1
    pending = len(selector.get_map())
    print(json.dumps({'asked': count, 'connected': len(connected), 'pending': pending, 'failed': failed,
                      'connect_s': round(time.monotonic() - started, 3)}), flush=True)
    sys.stdin.readline()
    held_s = time.monotonic() - started
    fate = {'open': 0, 'closed': 0, 'answered': 0, 'reset': 0}
    answers: dict[str, int] = {}
    for sock in connected:
        try:
            data = sock.recv(4096)
        except BlockingIOError:
            fate['open'] += 1
            continue
        except OSError:
            fate['reset'] += 1
            continue
        if not data:
            fate['closed'] += 1
        else:
            fate['answered'] += 1
            status = data.split(b'\r\n', 1)[0].decode('latin-1')[:40]
            answers[status] = answers.get(status, 0) + 1
    for sock in sockets:
        sock.close()
    print(json.dumps({**fate, 'answers': answers, 'held_s': round(held_s, 3)}), flush=True)


def probe(host: str, port: int, path: str, *, duration_s: float, timeout_s: float,
          headers: dict | None = None) -> dict:
    """GET `path` back to back on one keep-alive connection for `duration_s`; each answer's latency (ms), the
    timeouts (ranked above every answer), the statuses and the errors."""
    head = f'GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n'
    head += ''.join(f'{k}: {v}\r\n' for k, v in (headers or {}).items())
    request = (head + '\r\n').encode('latin-1')
    latencies: list[float] = []
    timeouts = errors = 0
    statuses: dict[str, int] = {}
    sock: socket.socket | None = None
    deadline = time.monotonic() + duration_s
    while time.monotonic() < deadline:
        started = time.perf_counter()
        try:
            if sock is None:
                sock = socket.create_connection((host, port), timeout=timeout_s)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(timeout_s)
            sock.sendall(request)
            status, keep = _read_response(sock, started + timeout_s)
        except TimeoutError:
            timeouts += 1
            sock = _close(sock)
            continue
        except OSError:
            errors += 1
            sock = _close(sock)
            time.sleep(0.01)
            continue
        latencies.append((time.perf_counter() - started) * 1000)
        statuses[status] = statuses.get(status, 0) + 1
        if not keep:
            sock = _close(sock)
    _close(sock)
    return {'answers': len(latencies), 'timeouts': timeouts, 'errors': errors, 'statuses': statuses,
            'timeout_ms': timeout_s * 1000, **ranked(latencies, timeouts)}


def ranked(latencies: list[float], timeouts: int) -> dict:
    """p50, p99 and max of the answers' latencies (ms), the timeouts ranked above them: a percentile that falls
    on a timeout is None (more than the timeout)."""
    ordered = sorted(latencies) + [math.inf] * timeouts
    if not ordered:
        return {'p50_ms': None, 'p99_ms': None, 'max_ms': None}

    def at(q: float):
        value = ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]
        return None if math.isinf(value) else round(value, 3)
    return {'p50_ms': at(50), 'p99_ms': at(99), 'max_ms': at(100)}


def _read_response(sock: socket.socket, deadline: float) -> tuple[str, bool]:
    """(status code, whether the connection stays open) of one response with a Content-Length body."""
    buf = b''
    while b'\r\n\r\n' not in buf:
        buf += _recv(sock, deadline)
    head, _, body = buf.partition(b'\r\n\r\n')
    lines = head.decode('latin-1').split('\r\n')
    fields = {name.strip().lower(): value.strip() for name, _, value in (line.partition(':') for line in lines[1:])}
    length = int(fields.get('content-length', '0'))
    while len(body) < length:
        body += _recv(sock, deadline)
    return lines[0].split(' ')[1], fields.get('connection', '').lower() != 'close'


def _recv(sock: socket.socket, deadline: float) -> bytes:
    left = deadline - time.perf_counter()
    if left <= 0:
        raise TimeoutError()
    sock.settimeout(left)
    data = sock.recv(65536)
    if not data:
        raise ConnectionResetError('closed by the server')
    return data


def _close(sock: socket.socket | None) -> None:
    if sock is not None:
        sock.close()
    return None


def main(argv: list[str]) -> None:
    if len(argv) == 5 and argv[0] == 'hold':
        hold(argv[1], int(argv[2]), int(argv[3]), float(argv[4]))
        return
    raise SystemExit('usage: python -m loadtests.slowclients hold HOST PORT COUNT CONNECT_S')


if __name__ == '__main__':
    main(sys.argv[1:])
