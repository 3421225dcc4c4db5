"""What one call costs the shared store: the run history's rows, measured on their own (docs/capacity.md).

    .venv/bin/python -m loadtests.capacity --local-pg /tmp/bench-pg [--rows 200000] [--batch 500]

Writes `--rows` runs into a fresh store database (every migration applied) exactly as a worker's history thread
does (gateway.store.history: batches of `--batch` runs made into COPY lines and sent through one COPY each, one
commit a batch), and reads the CPU of the PostgreSQL backend that served them (psutil), so the figure is the store's
own work per row and not the client's. Then reads it back the way a quota rebuild does (AdmittedUsage, one key's
admitted calls and rows since a time). Prints one JSON line; --out writes it to a file too.
"""
from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from pathlib import Path

from . import system
from .harness import local_postgres, log, now_iso


def measure(database_url: str, rows: int, batch: int) -> dict:
    from gateway.store.history import AdmittedUsage, HistoryWriter
    from gateway.store.schema import migrate
    store_url = system.dsn_with_db(database_url, 'gwstore_capacity')
    system.recreate_database(database_url, 'gwstore_capacity')
    conn = system.pg_connect(store_url)
    migrate(conn)
    conn.commit()
    with conn.cursor() as cur:
        cur.execute('SELECT pg_backend_pid()')
        backend = cur.fetchone()[0]
    keys = 1000
    started = time.time() - 3600
    runs = [(started + i * 0.001, secrets.token_hex(5), i % keys + 1, 'account', 1, 200, None, 1, 0.8, 'bench:1',
             True) for i in range(rows)]
    with conn.cursor() as cur:
        cur.execute('SELECT pg_current_wal_lsn()')
        wal0 = cur.fetchone()[0]
    conn.commit()
    cpu0, wall0 = system.cpu_seconds(backend), time.monotonic()
    for i in range(0, rows, batch):
        HistoryWriter._store(conn, runs[i:i + batch])
        conn.commit()
    write_cpu, write_wall = system.cpu_seconds(backend) - cpu0, time.monotonic() - wall0
    with conn.cursor() as cur:
        cur.execute("SELECT pg_total_relation_size('gw_run_history'), pg_current_wal_lsn() - %s::pg_lsn", (wal0,))
        table_bytes, wal_bytes = cur.fetchone()
    conn.close()
    usage = AdmittedUsage(lambda: system.pg_connect(store_url))
    reads, t0 = 50, time.monotonic()
    for k in range(reads):
        usage(k + 1, started)
    read_ms = (time.monotonic() - t0) / reads * 1000
    usage.close()
    return {'rows': rows, 'batch': batch, 'store_cpu_s': round(write_cpu, 3), 'wall_s': round(write_wall, 3),
            'store_cpu_us_per_row': round(write_cpu / rows * 1e6, 2),
            'rows_per_store_core_s': round(rows / write_cpu) if write_cpu else None,
            'bytes_per_row': round(table_bytes / rows, 1), 'wal_bytes_per_row': round(float(wal_bytes) / rows, 1),
            'commit_wall_ms_per_batch': round(write_wall / -(-rows // batch) * 1000, 2),
            'quota_rebuild_read_ms': round(read_ms, 2), 'rows_per_key_read': rows // keys}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog='python -m loadtests.capacity', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--database-url')
    parser.add_argument('--local-pg', type=Path, metavar='HOME')
    parser.add_argument('--local-pg-port', type=int, default=54520)
    parser.add_argument('--rows', type=int, default=200_000)
    parser.add_argument('--batch', type=int, default=500)
    parser.add_argument('--out', type=Path)
    args = parser.parse_args(argv)
    if bool(args.database_url) == bool(args.local_pg):
        parser.error('give one of --database-url and --local-pg')
    with local_postgres(args):
        log(f'writing {args.rows:,} runs in batches of {args.batch}')
        result = {'at': now_iso(), 'git': system.git_state(), **measure(args.database_url, args.rows, args.batch)}
    line = json.dumps(result)
    print(line)
    if args.out:
        args.out.write_text(line + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
