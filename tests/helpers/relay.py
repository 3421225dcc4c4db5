"""A TCP relay in front of a server (Redis, here) that can hold its replies: what a loaded
server looks like from a client, whose command ran but whose answer came after its socket
timeout. Requests are passed on at once; each reply chunk waits ``reply_delay_s`` (set it
at any time) before it is sent on. Bound to 127.0.0.1; ``close()`` it."""
from __future__ import annotations

import socket
import threading
import time

from helpers.ports import free_port


class DelayingRelay:
    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = free_port()
        self.reply_delay_s = 0.0
        self.held = 0                      # reply chunks that were held (a delay was on)
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._closed = False
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()

    def url(self, redis_url: str) -> str:
        """``redis_url`` (of the target) with the relay's port instead."""
        head, _, tail = redis_url.rpartition(f":{self.target[1]}/")
        assert head, redis_url
        return f"{head}:{self.port}/{tail}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, replies: bool) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                delay = self.reply_delay_s if replies else 0.0
                if delay:
                    self.held += 1
                    time.sleep(delay)      # the slow Redis this relay stands for
                sink.sendall(data)
        except OSError:
            pass
        finally:   # either side gone: the pair is done (the client sees its connection closed)
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets, self._sockets = self._sockets, []
        self._listener.close()
        for sock in sockets:
            try:
                sock.close()
            except OSError:
                pass
