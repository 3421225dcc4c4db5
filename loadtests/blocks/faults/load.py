"""The faults block's load: a closed loop of keep-alive HTTP/1.1 clients that checks every body.

    python -m loadtests.blocks.faults.load --url http://127.0.0.1:55110 --key KEY --expected rows.json \\
        --out calls.txt [--clients 16] [--rate 0] [--path /q/account] [--url ANOTHER ...]

Each client sends GET <path>?aid=<random aid of the expected rows> with X-API-Key, reads the whole answer and sends
the next at once (no pause), on one keep-alive connection; it runs until SIGTERM or SIGINT. A 200 is checked against
the row PostgreSQL holds for that aid (read by the block before the load, `--expected`): any other body is a wrong
body. A connection error (refused, reset, timed out after `--timeout` s, a malformed answer) closes the connection;
the client waits 10 ms and opens a new one, so a refused port is counted about a hundred times a second a client
rather than as fast as the loop could spin.

`--rate R` (calls a second, all clients together) paces the load instead: each client sends on a fixed schedule,
one call every clients/R seconds, and a call's `sent` is the time it was due, not the time it went out. A stall then
shows in the latency of every call that was due during it (no coordinated omission), and the latency of a load
below the fleet's capacity is the fleet's own, not the queue a saturating closed loop builds (the closed loop's
max latency on a small machine is mostly that queue).

One line a call, in `--out` (flushed every 0.2 s, read by the block as it runs):

    <sent> <ended> <status> <verdict> <code> <request id>

times from time.monotonic() (CLOCK_MONOTONIC: the same clock in the block's process), status 0 for a connection
error, verdict `ok` (a 2xx with the expected row), `wrong` (a 2xx with anything else) or `-` (not a 2xx), code the
JSON body's "code" of a non-2xx answer (`-` when it has none), or the error's kind for status 0, and the
X-Request-Id the gateway gave the answer (`-`: none, e.g. nginx's own 502).

One asyncio process: at a few thousand calls a second it uses most of a core, which on a small machine it shares
with the fleet (the report says so).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import time
from pathlib import Path

ERROR_PAUSE_S = 0.01


def expected_bodies(rows: list[list[int]]) -> dict[int, tuple[bytes, list[dict]]]:
    """aid -> (the body as the gateway writes it, the parsed form compared when the bytes differ)."""
    out = {}
    for aid, bid, abalance in rows:
        doc = [{'aid': aid, 'bid': bid, 'abalance': abalance}]
        out[aid] = (json.dumps(doc, separators=(',', ':')).encode(), doc)
    return out


def verdict(body: bytes, expected: tuple[bytes, list[dict]]) -> str:
    if body == expected[0]:
        return 'ok'
    try:
        return 'ok' if json.loads(body) == expected[1] else 'wrong'
    except ValueError:
        return 'wrong'


def error_code(body: bytes) -> str:
    try:
        doc = json.loads(body)
    except ValueError:
        return '-'
    code = doc.get('code') if isinstance(doc, dict) else None
    return str(code).replace(' ', '_') if code else '-'


class Protocol(Exception):
    pass


async def _read_answer(reader: asyncio.StreamReader, timeout_s: float) -> tuple[int, dict, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b'\r\n\r\n'), timeout_s)
    lines = head.decode('latin-1').split('\r\n')
    parts = lines[0].split(' ', 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise Protocol('bad status line')
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(':')
        if name:
            headers[name.strip().lower()] = value.strip()
    if 'content-length' in headers:
        body = await asyncio.wait_for(reader.readexactly(int(headers['content-length'])), timeout_s)
    elif headers.get('transfer-encoding', '').lower() == 'chunked':
        chunks = []
        while True:
            size = int((await asyncio.wait_for(reader.readuntil(b'\r\n'), timeout_s)).split(b';')[0], 16)
            data = await asyncio.wait_for(reader.readexactly(size + 2), timeout_s)
            if size == 0:
                break
            chunks.append(data[:-2])
        body = b''.join(chunks)
    else:
        raise Protocol('no length')
    return int(parts[1]), headers, body


class Pace:
    """When a paced client's next call is due: every `interval` seconds from a random start within the first
    interval (so that clients do not send in step); a closed loop (interval 0) is always due now."""

    __slots__ = ('interval', 'due')

    def __init__(self, interval: float):
        self.interval = interval
        self.due = time.monotonic() + random.random() * interval

    async def next(self) -> float:
        if not self.interval:
            return time.monotonic()
        due, self.due = self.due, self.due + self.interval
        wait = due - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        return due


async def client(host: str, port: int, path: str, key: str, aids: list[int], expected: dict, out: list,
                 stop: asyncio.Event, timeout_s: float, interval: float = 0.0):
    reader = writer = None
    prefix = f'GET {path}?aid='.encode()
    suffix = f' HTTP/1.1\r\nHost: {host}:{port}\r\nX-API-Key: {key}\r\n\r\n'.encode()
    clock = time.monotonic
    pace = Pace(interval)
    while not stop.is_set():
        aid = random.choice(aids)
        sent = await pace.next()
        if stop.is_set():
            break
        try:
            if writer is None:
                # the connect is part of the call's time: a port nobody accepts on shows as latency
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
            writer.write(prefix + str(aid).encode() + suffix)
            status, headers, body = await _read_answer(reader, timeout_s)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, Protocol,
                ValueError) as error:
            out.append(f'{sent:.6f} {clock():.6f} 0 - {type(error).__name__} -\n')
            if writer is not None:
                writer.close()
            reader = writer = None
            if not interval:
                await asyncio.sleep(ERROR_PAUSE_S)
            continue
        ended = clock()
        if 200 <= status < 300:
            mark, code = verdict(body, expected[aid]), '-'
        else:
            mark, code = '-', error_code(body)
        out.append(f'{sent:.6f} {ended:.6f} {status} {mark} {code} {headers.get("x-request-id") or "-"}\n')
        if headers.get('connection', '').lower() == 'close':
            writer.close()
            reader = writer = None


def host_port(url: str) -> tuple[str, int]:
    host, port = url.split('//', 1)[1].rstrip('/').rsplit(':', 1)
    return host, int(port)


async def run(args) -> None:
    targets = [host_port(u) for u in args.url]
    rows = json.loads(Path(args.expected).read_text())
    expected = expected_bodies(rows)
    aids = sorted(expected)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    out: list[str] = []
    with open(args.out, 'a') as sink:
        # client i calls target i mod n: with --url given once per master, each master gets its share of clients
        interval = args.clients / args.rate if args.rate > 0 else 0.0
        tasks = [asyncio.create_task(client(*targets[i % len(targets)], args.path, args.key, aids, expected, out,
                                            stop, args.timeout, interval)) for i in range(args.clients)]
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), 0.2)
            except TimeoutError:
                pass
            lines, out[:] = out[:], []
            sink.writelines(lines)
            sink.flush()
        # Let each client finish the call it holds (bounded by its timeout), so nothing is cut off half-read.
        await asyncio.wait(tasks, timeout=args.timeout + 1)
        for task in tasks:
            task.cancel()
        sink.writelines(out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--url', required=True, action='append', help='base URL; repeat it to share the clients')
    parser.add_argument('--key', required=True)
    parser.add_argument('--expected', required=True, help='JSON list of [aid, bid, abalance]')
    parser.add_argument('--out', required=True)
    parser.add_argument('--path', default='/q/account')
    parser.add_argument('--clients', type=int, default=16)
    parser.add_argument('--rate', type=float, default=0.0,
                        help='calls a second, all clients together, on a fixed schedule (default 0: a closed loop)')
    parser.add_argument('--timeout', type=float, default=10.0)
    asyncio.run(run(parser.parse_args(argv)))


if __name__ == '__main__':
    main()
