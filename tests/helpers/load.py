"""Load generators: keep-alive HTTP clients calling an endpoint in a loop from threads, each
call recorded (``Load``: timings, status, code, watched headers; ``Callers``: the request id
of each answer), and counting what they saw."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import requests

from helpers.util import wait_until


@dataclass
class Call:
    started: float        # time.monotonic() before the request was sent
    ended: float          # ... after the whole response was read
    status: int           # 0: no HTTP answer (socket error)
    code: str | None = None
    headers: dict = field(default_factory=dict)
    body: object = None
    target: str = ""


WATCHED_HEADERS = ("Retry-After", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset",
                   "X-Quota-Reset", "X-Quota-Remaining-Calls")


class Load:
    """``threads`` clients calling ``path`` with ``secret`` in a loop, each with its own
    keep-alive ``requests.Session`` (``close=True``: a new connection per call, which spreads
    calls over every worker of a master), until ``stop()``. Every call is recorded."""

    def __init__(self, bases, path: str, secret: str, threads: int = 8, close: bool = False,
                 keep_bodies: bool = False, pause_s: float = 0.0, until_refused: tuple | None = None):
        """``until_refused=(code, seconds)``: a client stops by itself once every call it made
        for ``seconds`` was refused with ``code`` (and it was refused at least once)."""
        self.bases = [bases] if isinstance(bases, str) else list(bases)
        self.until_refused = until_refused
        self.path = path
        self.secret = secret
        self.close = close
        self.keep_bodies = keep_bodies
        self.pause_s = pause_s
        self._stop = threading.Event()
        self._results: list[list[Call]] = [[] for _ in range(threads)]
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def __enter__(self) -> Load:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def join(self, timeout_s: float) -> list[Call]:
        """Wait for clients that stop by themselves (``until_refused``); then stop the rest."""
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return self.stop()

    def stop(self) -> list[Call]:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        return self.calls

    def made_since(self, since: float) -> int:
        """Calls begun after ``since`` (monotonic) and answered by now."""
        return sum(1 for r in self._results for c in list(r) if c.started > since)

    @property
    def calls(self) -> list[Call]:
        return sorted((c for r in self._results for c in list(r)), key=lambda c: c.started)

    def _run(self, index: int) -> None:
        out = self._results[index]
        session = requests.Session()
        headers = {"X-API-Key": self.secret}
        if self.close:
            headers["Connection"] = "close"
        n = index
        refused_since = None
        while not self._stop.is_set():
            base = self.bases[n % len(self.bases)]
            n += 1
            started = time.monotonic()
            try:
                reply = session.get(base + self.path, headers=headers, timeout=10)
            except requests.RequestException as error:
                out.append(Call(started, time.monotonic(), 0, code=type(error).__name__, target=base,
                                body=str(error)[:300]))
                session.close()
                session = requests.Session()
                continue
            ended = time.monotonic()
            body = code = None
            if reply.status_code != 200 or self.keep_bodies:
                try:
                    body = reply.json()
                except ValueError:
                    body = reply.text
                if isinstance(body, dict):
                    code = body.get("code")
            out.append(Call(started, ended, reply.status_code, code,
                            {h: reply.headers[h] for h in WATCHED_HEADERS if h in reply.headers}, body, base))
            if self.until_refused is not None:
                if code != self.until_refused[0]:
                    refused_since = None
                elif refused_since is None:
                    refused_since = started
                elif ended - refused_since > self.until_refused[1]:
                    break
            if self.pause_s:
                time.sleep(self.pause_s)      # paced clients
        session.close()


def statuses(calls) -> dict:
    counts: dict = {}
    for c in calls:
        key = (c.status, c.code)
        counts[key] = counts.get(key, 0) + 1
    return counts


def most_in_window(times: list[float], window_s: float) -> int:
    """The largest number of ``times`` (sorted) inside any closed window of length ``window_s``."""
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] > window_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


# --- calls that keep their request ids ------------------------------------------------------
@dataclass
class Answer:
    status: int                 # 0: no HTTP answer (connection refused, reset, timeout)
    request_id: str | None
    error: str | None = None


class Callers:
    """``threads`` clients calling ``url`` in a loop until ``stop()``, each on its own
    keep-alive ``requests.Session`` (``close=True``: a new connection per call). Every call
    is recorded with its ``X-Request-Id``; a connection error is an answer of status 0."""

    def __init__(self, url: str, secret: str, threads: int = 4, close: bool = False, pause_s: float = 0.0):
        self.url = url
        self.headers = {"X-API-Key": secret, **({"Connection": "close"} if close else {})}
        self.pause_s = pause_s
        self._stop = threading.Event()
        self._answers: list[list[Answer]] = [[] for _ in range(threads)]
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def __enter__(self) -> Callers:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> list[Answer]:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        return self.answers

    @property
    def answers(self) -> list[Answer]:
        return [a for out in self._answers for a in list(out)]

    def count(self, status: int | None = None) -> int:
        """Answers so far (``status``: of that status only; 0 is a connection error)."""
        return sum(1 for a in self.answers if status is None or a.status == status)

    def wait_for(self, count: int, timeout_s: float = 30, status: int | None = None) -> None:
        """Until ``count`` answers (of ``status``, if given) were recorded."""
        wait_until(lambda: self.count(status) >= count, timeout_s, 0.05,
                   lambda: f"{count} answers{'' if status is None else f' of status {status}'}: {self.count(status)}")

    def _run(self, index: int) -> None:
        out = self._answers[index]
        session = requests.Session()
        while not self._stop.is_set():
            try:
                reply = session.get(self.url, headers=self.headers, timeout=15)
                out.append(Answer(reply.status_code, reply.headers.get("X-Request-Id")))
            except requests.RequestException as exc:
                out.append(Answer(0, None, type(exc).__name__))
                session.close()
                session = requests.Session()
            if self.pause_s:
                time.sleep(self.pause_s)      # paced clients
        session.close()


def until_each_made(loads, calls: int, since: float = 0.0, timeout_s: float = 30.0) -> None:
    """Until every load has made ``calls`` calls begun after ``since``: a phase of a test lasts
    until it has the calls its assertions count, not a fixed time that a slow machine's
    clients fill with fewer (a CI run here made 3 calls in a second where 20 were counted on)."""
    loads = list(loads)
    wait_until(lambda: all(load.made_since(since) >= calls for load in loads), timeout_s, 0.02,
               lambda: f"{calls} calls from each load: {[load.made_since(since) for load in loads]}")
