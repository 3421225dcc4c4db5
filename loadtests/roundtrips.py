"""Count the statements a call costs on the data database and on the store.

    python -m loadtests.roundtrips --gateway http://127.0.0.1:8000 --key gw_... \
        --data-url postgresql://.../demo --store-url postgresql://.../gateway [--calls 100]

Warms up (so every pooled session has prepared its statement), resets
``pg_stat_statements``, makes N calls of ``/q/account`` with random ids, waits for the
history batch, and reads per database how many statements ran. The store's history batch
(one ``COPY`` per batch) is reported on its own line.
"""
from __future__ import annotations

import argparse
import json
import random
import time
import urllib.request

import psycopg2


def _call(base: str, key: str, aid: int) -> int:
    req = urllib.request.Request(f"{base}/q/account?aid={aid}", headers={"X-API-Key": key})
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()
        return resp.status


def _statements(conn, dbname: str) -> list[tuple[str, int]]:
    with conn.cursor() as cur:
        cur.execute("""SELECT query, calls FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
                        WHERE d.datname = %s AND query NOT ILIKE '%%pg_stat_statements%%'
                        ORDER BY calls DESC""", (dbname,))
        return cur.fetchall()


def measure(base: str, key: str, data_url: str, store_url: str, calls: int, warmup: int = 200) -> dict:
    admin = psycopg2.connect(data_url)
    admin.autocommit = True
    data_db = admin.info.dbname
    store_db = psycopg2.connect(store_url).info.dbname
    with admin.cursor() as cur:
        cur.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    for _ in range(warmup):
        _call(base, key, random.randint(1, 1_000_000))
    time.sleep(1.0)  # let the warm-up's history batch land before the reset
    with admin.cursor() as cur:
        cur.execute("SELECT pg_stat_statements_reset()")
    statuses = [_call(base, key, random.randint(1, 1_000_000)) for _ in range(calls)]
    time.sleep(1.0)  # one history flush interval and more
    data = _statements(admin, data_db)
    store = _statements(admin, store_db)
    history = [(q, n) for q, n in store if q.lstrip().upper().startswith("COPY")]
    other_store = [(q, n) for q, n in store if (q, n) not in history]
    return {
        "calls": calls, "ok": statuses.count(200),
        "data_statements": sum(n for _, n in data), "data_detail": data,
        "store_statements": sum(n for _, n in other_store), "store_detail": other_store,
        "history_batches": sum(n for _, n in history),
        "per_call_data": sum(n for _, n in data) / calls,
        "per_call_store": sum(n for _, n in other_store) / calls,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--data-url", required=True)
    parser.add_argument("--store-url", required=True)
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    print(json.dumps(measure(args.gateway, args.key, args.data_url, args.store_url, args.calls), indent=2))


if __name__ == "__main__":
    main()
