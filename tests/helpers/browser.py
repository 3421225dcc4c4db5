"""Headless Chromium (Debian's ``chromium``) driven over the DevTools protocol on a pipe
(``--remote-debugging-pipe``: JSON messages ending in NUL on file descriptors 3 and 4), with
the standard library only: for tests that must see a page as a browser renders it, its
scripts run, its Content-Security-Policy enforced.

    with Browser(tmp_path) as browser:
        browser.open("http://127.0.0.1:8000/docs")
        browser.evaluate("document.title")
        browser.wait_for("document.body.innerText.includes('x')")
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

# Recorded on every document before its own scripts run: what its CSP refused.
_RECORD_VIOLATIONS = ("window.__csp = []; document.addEventListener('securitypolicyviolation', "
                      "function (e) { window.__csp.push(e.violatedDirective + ' ' + e.blockedURI); });")


class Browser:
    def __init__(self, profile: Path, timeout: float = 30.0) -> None:
        assert CHROMIUM, "chromium is not installed"
        self.timeout = timeout
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def fds() -> None:   # the child's fd 3 reads our commands, fd 4 writes its answers
            read = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10)
            write = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)
            os.dup2(read, 3)
            os.dup2(write, 4)

        args = [CHROMIUM, "--headless=new", "--remote-debugging-pipe", "--disable-gpu", "--no-first-run",
                "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--metrics-recording-only",
                f"--user-data-dir={profile}", "about:blank"]
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")   # Chromium refuses to run its sandbox as root
        self.process = subprocess.Popen(args, preexec_fn=fds, pass_fds=(3, 4), stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []
        self.session: str | None = None

    # --- the protocol ---------------------------------------------------------------------
    def send(self, method: str, params: dict | None = None, session: bool = True) -> dict:
        self._next_id += 1
        message: dict = {"id": self._next_id, "method": method, "params": params or {}}
        if session and self.session:
            message["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not answer")
            chunk = os.read(self._from_chrome, 1 << 16)
            if not chunk:
                raise RuntimeError(f"chromium exited ({self.process.poll()})")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    # --- a page ---------------------------------------------------------------------------
    def open(self, url: str) -> None:
        """A fresh tab, recording CSP violations and every request it makes, at ``url``."""
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=False)["sessionId"]
        self.send("Page.enable")
        self.send("Network.enable")
        self.send("Page.addScriptToEvaluateOnNewDocument", {"source": _RECORD_VIOLATIONS})
        self.send("Page.navigate", {"url": url})

    def evaluate(self, expression: str):
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float | None = None):
        """Evaluate ``expression`` until it is truthy (its value), or fail after ``timeout``."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            try:
                value = self.evaluate(expression)
            except RuntimeError:   # the document is being replaced (a navigation): look again
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"never true: {expression}")
            time.sleep(0.2)

    def requested(self) -> list[str]:
        """Every URL the page asked for (the network log)."""
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def close(self) -> None:
        try:
            self.send("Browser.close", session=False)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
