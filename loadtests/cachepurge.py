"""How long a purge of the response cache takes to reach every worker: one gunicorn master
with ``--workers`` workers (its own embedded PostgreSQL with the demo data and its own Redis),
the cached lookup warmed on every worker, then ``--purges`` times ``DELETE
/api/v1/cache/entries?query=account_cached`` timed on the client. The call returns once every live
worker has dropped the entries (``gateway.cache``), so its duration is the time from the
purge's call to "no worker serves the old entry"; the reply's ``X-Cache-Invalidated`` ``ms``
is the part spent purging (store counter, Redis, the bus's acknowledgements). After each purge, calls on new connections (any worker) must all miss.

    .venv/bin/python -m loadtests.cachepurge [--purges 1000] [--workers 4] [--home /tmp/cachecost]
"""
from __future__ import annotations

import argparse
import http.client
import json
import time
from pathlib import Path

from fleet.local.demo import create_demo_data
from fleet.local.embedded import LocalPostgres

from . import system, targets
from .cachecost import CACHED, _port
from .stats import percentile


def _get(target: targets.Target, path: str, method: str = 'GET', admin: bool = False) -> tuple[int, dict, bytes]:
    host = target.base_url.split('//', 1)[1]
    conn = http.client.HTTPConnection(host, timeout=30)   # a new connection: any worker of the master
    try:
        key = target.admin_key if admin else target.api_key
        conn.request(method, path, headers={'X-API-Key': key, 'Connection': 'close'})
        reply = conn.getresponse()
        return reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog='python -m loadtests.cachepurge', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--purges', type=int, default=1000)
    parser.add_argument('--workers', type=int, default=4)
    parser.add_argument('--home', type=Path, default=Path('/tmp/cachecost'))
    args = parser.parse_args(argv)
    run_dir = args.home / ('purge-' + time.strftime('%Y%m%d-%H%M%S'))
    run_dir.mkdir(parents=True, exist_ok=True)
    pg = LocalPostgres(args.home / 'pg', _port())
    pg.start()
    redis_process = target = None
    try:
        system.recreate_database(pg.url('postgres'), 'gateway')   # a fresh store (a new secret key each run)
        pg.ensure_database('demo')
        create_demo_data(pg.url('demo'))
        redis_process, redis_url = targets.start_redis(port=_port(), cpu=None, run_dir=run_dir)
        target = targets.start_gateway(port=_port(), cpu='0-1', store_url=pg.url('gateway'), redis_url=redis_url,
                                       run_dir=run_dir, extra_env={'GATEWAY_WORKERS': str(args.workers),
                                                                   'GATEWAY_CPUS': 'off'})
        targets.wait_healthy(target)
        targets.provision(target, pg.url('demo'))
        status, answer = targets.management(target, 'POST', '/queries', dict(targets.query_body(CACHED), cache_ttl=60))
        assert status in (201, 409), answer
        status, answer = targets.management(target, 'PATCH', f'/api-keys/{targets.KEY}',
                                            {'queries': [targets.QUERY, CACHED]})
        assert status == 200, answer
        path = f'/q/{CACHED}?aid=42'
        call_ms, bus_ms, wrong = [], [], 0
        for n in range(args.purges):
            hits = 0
            for _ in range(4 * args.workers):    # fill the entry on the workers, until calls hit
                status, headers, _ = _get(target, path)
                hits += headers.get('x-cache') == 'hit'
            started = time.perf_counter()
            status, headers, body = _get(target, f'/api/v1/cache/entries?query={CACHED}', 'DELETE', admin=True)
            call_ms.append((time.perf_counter() - started) * 1000)
            assert status == 204, body
            sync = dict(part.strip().split('=') for part in headers['x-cache-invalidated'].split(';')
                        if '=' in part)   # acked=N; pending=M; ms=T (or "degraded")
            bus_ms.append(float(sync['ms']))
            if sync.get('pending') != '0' or hits == 0:
                wrong += 1
            status, headers, _ = _get(target, path)
            if headers.get('x-cache') != 'miss':
                wrong += 1
            if n % 100 == 0:
                print(f'{n} purges, last {call_ms[-1]:.1f} ms (hits before it: {hits})', flush=True)
        (run_dir / 'purges.json').write_text(json.dumps({'call_ms': call_ms, 'bus_ms': bus_ms}))
        print(f'{args.purges} purges, {args.workers} workers: the DELETE call p50 {percentile(call_ms, 50):.1f} ms, '
              f'p99 {percentile(call_ms, 99):.1f} ms, max {max(call_ms):.1f} ms; of it the purge itself p50 '
              f'{percentile(bus_ms, 50):.1f} ms, p99 {percentile(bus_ms, 99):.1f} ms; '
              f'{wrong} purges with a worker pending or a hit right after; raw: {run_dir / "purges.json"}')
    finally:
        if target is not None:
            targets.stop_process(target.process)
        if redis_process is not None:
            targets.stop_process(redis_process)
        pg.stop()


if __name__ == '__main__':
    main()
