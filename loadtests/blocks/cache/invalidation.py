"""The cache block's invalidation timings, on a master with several workers (4 by default), the entry cached on
them first:

- purges: ``DELETE /api/v1/cache/entries?query=<cached>`` timed from its call to the moment no worker can serve
  the old entry. The call returns once every live worker acknowledged it (``X-Cache-Invalidated: acked=N;
  pending=0``), so that moment is its answer; were a worker still pending, it is the moment the cache bus's
  acknowledgements in Redis show every live worker at the purge's number or past it (polled after the answer).
- writes: a saved write (``deposit``) into an account the cached lookup reads, timed from the write's answer to
  the same moment (0 when every live worker acknowledged before the answer: docs/cache.md, the bound).

Every call goes on a new connection (``Connection: close``): the master's listening socket hands it to any worker.
Checked, and failing the block when wrong: the entry was served from the cache before (some fill call hit); a
purge answers 204 and a write 200 with one row affected; right after a purge a call misses; after a write (and
after the acknowledgements) every call of the cached lookup answers the balance the writes made, which the harness
tracks from the account's balance read at the start.
"""
from __future__ import annotations

import http.client
import json
import random
import time
from urllib.parse import urlsplit

import redis

from ...targets import Target

CACHE_PREFIX = 'gw:{fleet}:cache:'       # fleet/shared/cache.py: the cache bus's keys
SEQ, ACKS, ALIVE = CACHE_PREFIX + 'seq', CACHE_PREFIX + 'acks', CACHE_PREFIX + 'alive'
DEPOSIT_SQL = 'UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid'


class Caller:
    """Calls on new connections to one master, and the cache bus's state in its Redis."""

    def __init__(self, target: Target, redis_url: str, cached_path: str, write_path: str):
        parts = urlsplit(target.base_url)
        self.host, self.port = parts.hostname, parts.port
        self.target = target
        self.cached_path = cached_path
        self.write_path = write_path
        self.redis = redis.Redis.from_url(redis_url, socket_timeout=5)

    def call(self, method: str, path: str, admin: bool = False) -> tuple[int, dict, bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            key = self.target.admin_key if admin else self.target.api_key
            conn.request(method, path, headers={'X-API-Key': key, 'Connection': 'close'})
            reply = conn.getresponse()
            return reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()
        finally:
            conn.close()

    def read(self, aid: int) -> tuple[int, str, int | None]:
        """(status, X-Cache, the balance answered) of the cached lookup of `aid`."""
        status, headers, body = self.call('GET', f'{self.cached_path}?aid={aid}')
        balance = None
        if status == 200:
            doc = json.loads(body)
            rows = doc if isinstance(doc, list) else doc.get('rows') or doc.get('data') or []
            if len(rows) == 1 and rows[0].get('aid') == aid:
                balance = rows[0].get('abalance')
        return status, headers.get('x-cache', ''), balance

    def pending(self, seq: int) -> tuple[int, int]:
        """(live workers, of them those not yet at `seq`), as fleet.shared.bus's pending script counts them."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.time()
        pipe.hgetall(ALIVE)
        pipe.hgetall(ACKS)
        (secs, micros), alive, acks = pipe.execute()
        now_ms = secs * 1000 + micros // 1000
        live = [w for w, expiry in alive.items() if int(expiry) > now_ms]
        return len(live), sum(1 for w in live if int(acks.get(w, 0)) < seq)

    def live_workers(self) -> int:
        return self.pending(0)[0]

    def seq(self) -> int:
        return int(self.redis.get(SEQ) or 0)

    def until_acknowledged(self, seq: int, since: float, limit_s: float = 10.0) -> float | None:
        """Seconds from `since` until every live worker acknowledged `seq` (0 if they had by the first look);
        None if they had not within `limit_s`."""
        first = True
        while True:
            _, pending = self.pending(seq)
            now = time.perf_counter()
            if not pending:
                return 0.0 if first else now - since
            if now - since > limit_s:
                return None
            first = False
            time.sleep(0.0002)


def invalidated(headers: dict) -> dict:
    """X-Cache-Invalidated (``acked=N; pending=M; ms=T``, or ``degraded``) as a dict of strings."""
    text = headers.get('x-cache-invalidated', '')
    out = dict(part.strip().split('=', 1) for part in text.split(';') if '=' in part)
    if 'degraded' in text:
        out['degraded'] = '1'
    return out


def fill(caller: Caller, aid: int, calls: int) -> tuple[int, list[str]]:
    """`calls` cached lookups of `aid` on new connections: (how many hit, what was wrong)."""
    hits, wrong = 0, []
    for _ in range(calls):
        status, state, _ = caller.read(aid)
        if status != 200:
            wrong.append(f'fill answered {status}')
        hits += state == 'hit'
    return hits, wrong


def cached(caller: Caller, aid: int, calls: int) -> list[str]:
    """Fill `aid`'s entry on the workers (fill); what was wrong, including no call having hit (a worker just back
    from a pause serves no memory until its lease is renewed: it is given a second fill)."""
    hits, wrong = fill(caller, aid, calls)
    if not hits:
        hits, more = fill(caller, aid, calls)
        wrong += more
    if not hits:
        wrong.append(f'aid {aid}: no fill call hit in {2 * calls}')
    return wrong


def wait_live(caller: Caller, workers: int, timeout_s: float = 15.0) -> int:
    """Wait until every worker beats on the cache bus again (after a pause); the live count."""
    deadline = time.monotonic() + timeout_s
    live = caller.live_workers()
    while live < workers and time.monotonic() < deadline:
        time.sleep(0.05)
        live = caller.live_workers()
    return live


def purges(caller: Caller, count: int, hot: int, fill_calls: int, workers: int) -> dict:
    """`count` purges of the cached query, each after the entry of a random hot account was cached."""
    query = caller.cached_path.rsplit('/', 1)[-1]
    live = wait_live(caller, workers)
    call_ms, purge_ms, wrong, pending_at_answer = [], [], [], 0
    for _ in range(count):
        aid = random.randint(1, hot)
        wrong += cached(caller, aid, fill_calls)
        started = time.perf_counter()
        status, headers, body = caller.call('DELETE', f'/api/v1/cache/entries?query={query}', admin=True)
        answered = time.perf_counter()
        sync = invalidated(headers)
        if status != 204 or sync.get('degraded'):
            wrong.append(f'purge answered {status} {sync or body[:200]!r}')
            continue
        extra = 0.0
        if sync.get('pending') != '0':
            pending_at_answer += 1
            later = caller.until_acknowledged(caller.seq(), answered)
            if later is None:
                wrong.append(f'purge: a worker still pending 10 s after the answer ({sync})')
                continue
            extra = later
        call_ms.append((answered - started) * 1000)
        purge_ms.append((answered - started + extra) * 1000)
        status, state, _ = caller.read(aid)
        if status != 200 or state == 'hit':
            wrong.append(f'after a purge the call answered {status} X-Cache {state or "-"}')
    return {'samples_ms': purge_ms, 'call_ms': call_ms, 'pending_at_answer': pending_at_answer, 'wrong': wrong,
            'live_workers': live}


def writes(caller: Caller, count: int, hot: int, fill_calls: int, workers: int, balances: dict[int, list[int]],
           checks: int) -> dict:
    """`count` deposits of +1 or -1 into random hot accounts, each after the account's entry was cached; after each
    answer, the time until every live worker acknowledged its purge, then `checks` calls on new connections that must
    all answer the new balance. `balances`: per account written, [its balance before the first write, now] (the
    block puts the first back at its end)."""
    live = wait_live(caller, workers)
    bound_ms, write_ms, waited_ms, wrong, pending_at_answer, stale = [], [], [], [], 0, 0
    for n in range(count):
        aid = random.randint(1, hot)
        if aid not in balances:
            status, _, balance = caller.read(aid)   # a miss or a hit: the balance no write of ours has changed
            if status != 200 or balance is None:
                wrong.append(f'aid {aid}: the first read answered {status}')
                continue
            balances[aid] = [balance, balance]
        wrong += cached(caller, aid, fill_calls)
        delta = 1 if n % 2 == 0 else -1
        started = time.perf_counter()
        status, headers, body = caller.call('GET', f'{caller.write_path}?aid={aid}&delta={delta}')
        answered = time.perf_counter()
        sync = invalidated(headers)
        if status != 200 or headers.get('x-rows-affected') not in (None, '1') or sync.get('degraded'):
            wrong.append(f'write answered {status} {sync or body[:200]!r}')
            continue
        balances[aid][1] += delta
        seq = caller.seq()    # this write's purge: no other purge runs meanwhile on this master's Redis
        if sync.get('pending') == '0':
            after = 0.0
        else:
            pending_at_answer += 1
            after = caller.until_acknowledged(seq, answered)
            if after is None:
                wrong.append(f'write: a worker still pending 10 s after the answer ({sync})')
                continue
        bound_ms.append(after * 1000)
        write_ms.append((answered - started) * 1000)
        waited_ms.append(float(sync.get('ms', 'nan')))
        for _ in range(checks):
            status, _, balance = caller.read(aid)
            if status != 200 or balance != balances[aid][1]:
                stale += status == 200
                wrong.append(f'aid {aid}: after the write answered {status}, balance {balance} '
                             f'(the database: {balances[aid][1]})')
    return {'samples_ms': bound_ms, 'write_ms': write_ms, 'waited_ms': waited_ms,
            'pending_at_answer': pending_at_answer, 'stale': stale, 'wrong': wrong, 'live_workers': live}
