"""The accuracy phase's load: a few keys driven at a multiple of their rate limit, open loop, every call recorded.

    python -m loadtests.blocks.limits.drive --url http://127.0.0.1:27010 --keys-file keys.txt --keys 4 \\
        --rate 20 --multiple 2 --duration 5 --seed 1 --out calls.json

Each key gets its own Poisson arrivals at multiple x rate (reference.poisson_schedule), sent at their scheduled
times over --connections keep-alive connections (asyncio, one process: the block runs it pinned to the load core);
each call comes from an address of its own block (X-Forwarded-For 10.250.x.y, 10,000 of them in turn), so the
client address limit never decides. A call waits for a free connection when all are busy: its *send* time is what
is recorded (and what the exact limiter is computed on, reference.py), with how late it was sent (`lag`), so a
generator that fell behind shows it instead of hiding it.

Out: {"calls": [[key, monotonic, wall, status], ...], "lag_ms": {p50, p99, max}, "cpu_s", "errors": {...}}.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import time
from pathlib import Path
from urllib.parse import urlsplit

from ...stats import percentile
from .reference import poisson_schedule

IPS = 10_000


def address(n: int) -> str:
    n %= IPS
    return f'10.250.{n // 256}.{n % 256}'


async def _send(reader, writer, host: str, path: str, key: str, ip: str, timeout_s: float) -> tuple[int, bool]:
    writer.write(f'GET {path} HTTP/1.1\r\nHost: {host}\r\nX-API-Key: {key}\r\nX-Forwarded-For: {ip}\r\n\r\n'
                 .encode())
    head = await asyncio.wait_for(reader.readuntil(b'\r\n\r\n'), timeout_s)
    lines = head.decode('latin-1').split('\r\n')
    status = int(lines[0].split(' ', 2)[1])
    length, close = 0, False
    for line in lines[1:]:
        name, _, value = line.partition(':')
        name = name.strip().lower()
        if name == 'content-length':
            length = int(value)
        elif name == 'connection' and value.strip().lower() == 'close':
            close = True
    if length:
        await asyncio.wait_for(reader.readexactly(length), timeout_s)
    return status, close


async def _connection(url: str, queue: asyncio.Queue, out: list, lags: list, errors: dict, timeout_s: float):
    parts = urlsplit(url)
    host, port = parts.hostname or '127.0.0.1', parts.port or 80
    loop = asyncio.get_running_loop()
    reader = writer = None
    while True:
        scheduled, key_index, secret, ip, path = await queue.get()
        try:
            if writer is None:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
            mono, wall = loop.time(), time.time()
            status, close = await _send(reader, writer, host, path, secret, ip, timeout_s)
            out.append((key_index, mono, wall, status))
            lags.append(mono - scheduled)
            if close:
                writer.close()
                reader = writer = None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError,
                IndexError) as error:
            errors[type(error).__name__] = errors.get(type(error).__name__, 0) + 1
            if writer is not None:
                writer.close()
            reader = writer = None
        finally:
            queue.task_done()


async def drive(url: str, secrets: list[str], schedule: list[tuple[float, int]], connections: int,
                query: str, max_id: int, timeout_s: float = 5.0) -> dict:
    loop = asyncio.get_running_loop()   # its clock is time.monotonic()
    queue: asyncio.Queue = asyncio.Queue()
    out: list = []
    lags: list = []
    errors: dict = {}
    workers = [asyncio.create_task(_connection(url, queue, out, lags, errors, timeout_s)) for _ in range(connections)]
    start = loop.time() + 0.2
    for n, (offset, key_index) in enumerate(schedule):
        delay = start + offset - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        path = f'{query}?aid={random.randint(1, max_id)}'
        queue.put_nowait((start + offset, key_index, secrets[key_index], address(n), path))
    await asyncio.wait_for(queue.join(), timeout_s + 5)
    for worker in workers:
        worker.cancel()
    lags_ms = [lag * 1000 for lag in lags]
    return {'calls': sorted(out, key=lambda c: c[1]), 'errors': errors,
            'lag_ms': {'p50': percentile(lags_ms, 50), 'p99': percentile(lags_ms, 99),
                       'max': max(lags_ms, default=None)}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog='python -m loadtests.blocks.limits.drive', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--url', required=True)
    parser.add_argument('--keys-file', type=Path, required=True, help='secrets, one a line: the first --keys')
    parser.add_argument('--keys', type=int, default=4)
    parser.add_argument('--rate', type=float, default=20, help='the keys\' rate limit, calls a second')
    parser.add_argument('--multiple', type=float, required=True, help='offered rate per key / --rate')
    parser.add_argument('--duration', type=float, default=5)
    parser.add_argument('--connections', type=int, default=32)
    parser.add_argument('--seed', type=int, default=1)
    parser.add_argument('--query', default='/q/account')
    parser.add_argument('--max-id', type=int, default=1_000_000)
    parser.add_argument('--out', type=Path, required=True)
    args = parser.parse_args(argv)
    secrets = [line for line in args.keys_file.read_text().splitlines() if line][:args.keys]
    schedule = poisson_schedule(len(secrets), args.rate * args.multiple, args.duration, args.seed)
    before = resource.getrusage(resource.RUSAGE_SELF)
    result = asyncio.run(drive(args.url, secrets, schedule, args.connections, args.query, args.max_id))
    after = resource.getrusage(resource.RUSAGE_SELF)
    result['cpu_s'] = round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 3)
    result['scheduled'] = len(schedule)
    args.out.write_text(json.dumps(result))
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
