"""The limits block's targets and their keys: our gateway with admission on and off, the gateway with envoy's fixed
windows (loadtests/peers/), QueryAPIGate 0.43.0 with its Redis backend, each with its own store database and its
own Redis server (the same build, settings and core: one server per target keeps each one's INFO counters its
own), and each mix's keys created through the target's own Management API."""
from __future__ import annotations

import json
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ... import peer, system, targets
from ...harness import WorkerCpu, log, start_variant
from ...system import REPO
from ..admission.run import RedisCommands
from . import ENVOY, OFF, ON, QAG
from .mixes import IP_RATE, Mix

ENVOY_APP = 'loadtests.peers.envoy_app:create_app()'
KEY_THREADS = 16         # Management API calls in flight while keys are created (the target is one worker)
KEY_BATCH = 1000         # keys created between two saves of the secrets
GATEWAY_VARIANTS = {
    ON: {'GATEWAY_ADMISSION': 'on', 'GATEWAY_RATE_LIMIT': IP_RATE, 'GATEWAY_TRUST_PROXY': '1'},
    OFF: {'GATEWAY_ADMISSION': 'off', 'GATEWAY_TRUST_PROXY': '1'},
    # GATEWAY_ADMISSION is not read by envoy_app: it builds the ports as for "off", then sets its own admission
    ENVOY: {'GATEWAY_ADMISSION': 'on', 'GATEWAY_RATE_LIMIT': IP_RATE, 'GATEWAY_TRUST_PROXY': '1'},
}
INDEX = {ON: 0, OFF: 1, ENVOY: 2, QAG: 3}   # port offsets
# The secrets of the last runs' keys, by target and mix (gitignored): with --keep-stores a run reuses them
# instead of creating them again. QueryAPIGate 0.43.0 reads every key twice to create one
# (services/access.py create_key: apikeys.list_keys() for the name check and for the audit entry), so n keys
# take a time in n squared: about 100 a second at first, a few a second past 2,000 on this machine.
KEYS_CACHE = REPO / '.bench' / 'limits-keys'


def start_targets(run, names: list[str]) -> tuple[list, dict]:
    """The targets named, started and provisioned (connection, saved query, one key without limits); returns
    them and their probes (worker CPU, Redis commands) by name."""
    live, probes = [], {}
    for name in names:
        if name == QAG:
            target, redis_url = start_qag(run)
        else:
            target, redis_url = start_variant(run, INDEX[name], name, GATEWAY_VARIANTS[name],
                                              f'gwstore_lim_{name.split("-")[1]}',
                                              wsgi=ENVOY_APP if name == ENVOY else None)
        if name == ENVOY:
            target.description = ('gateway-fleet, 1 worker, admission: envoyproxy/ratelimit\'s fixed windows '
                                  '(loadtests/peers/fixed_window.py, a faithful reimplementation, not envoy)')
        live.append(target)
        probes[name] = (WorkerCpu(target.pids[0]), RedisCommands(redis_url))
    return live, probes


def start_qag(run):
    """QueryAPIGate 0.43.0 as its image runs it, with its shared rate limits in Redis: QUERYAPIGATE_REDIS_URL
    (counts rate limits and quotas there, ratelimit.py / quotas.py), QUERYAPIGATE_RATE_LIMIT (per client address)
    and QUERYAPIGATE_TRUST_PROXY=1 (the address from X-Forwarded-For, as our gateway's GATEWAY_TRUST_PROXY)."""
    if not peer.GUNICORN.exists():
        raise targets.TargetError(f'{QAG}: QueryAPIGate is not installed: run `.venv/bin/python -m loadtests.peer '
                                  f'setup` ({peer.VENV}), or leave qag out of --limits-targets')
    args, run_dir = run.args, run.work_dir / QAG
    process, redis_url = targets.start_redis(port=args.redis_port + INDEX[QAG], cpu=args.pg_cpu, run_dir=run_dir)
    run.cleanup.append(process)
    store_db = 'qagstore_lim'
    system.recreate_database(args.database_url, store_db, drop=not args.keep_stores)
    extra = {'QUERYAPIGATE_REDIS_URL': redis_url, 'QUERYAPIGATE_RATE_LIMIT': IP_RATE,
             'QUERYAPIGATE_TRUST_PROXY': '1'}
    target = peer.start(port=args.peer_port, cpu=args.target_cpu, run_dir=run_dir,
                        store_url=system.dsn_with_db(args.database_url, store_db), extra_env=extra)
    run.cleanup.append(target.process)
    target.name = QAG
    target.description = (f'QueryAPIGate {peer.VERSION}, 1 worker, 8 threads, rate limits and quotas in Redis '
                          '(QUERYAPIGATE_REDIS_URL)')
    target.info['provisioned'] = targets.provision(target, args.database_url)
    target.info['redis'] = system.redact(redis_url)
    log(f'{QAG} ready at {target.base_url} (pid {target.pids[0]}), Redis {redis_url}')
    return target, redis_url


def mix_keys(target: targets.Target, mix: Mix, count: int, path: Path, server: str, reuse: bool) -> float:
    """The mix's `count` keys on `target`, their secrets written to `path` (the first ones are the hot set): with
    `reuse` (--keep-stores) the last runs' that still answer, topped up; else created anew. The seconds it took.
    Made once per run and used by every round, phase and cell of the mix. The secrets are saved after every batch
    of KEY_BATCH, so an interrupted creation is not lost."""
    cache = KEYS_CACHE / f'{target.name}-{mix.name}.json'
    limits = mix.key_limits('qag' if target.name == QAG else 'gateway')
    found = (_cached(cache, target, server, limits) if reuse else [])[:count]
    reused, started = len(found), time.monotonic()
    while len(found) < count:
        found += create_keys(target, limits, mix.name, min(KEY_BATCH, count - len(found)))
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({'server': server, 'limits': limits, 'secrets': found}))
    took = time.monotonic() - started
    made = count - reused
    log(f'{target.name}: {count:,} {mix.name} keys with {limits}: {reused:,} of the last run reused, {made:,} made'
        + (f' in {took:.1f} s ({made / took:,.0f} a second)' if made else ''))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('\n'.join(found) + '\n')
    return took


def _cached(cache: Path, target: targets.Target, server: str, limits: dict) -> list[str]:
    """The last runs' secrets for this target and mix, if they were made on this server with these limits and
    the first and last still answer (the store was kept); else none."""
    try:
        doc = json.loads(cache.read_text())
    except (OSError, ValueError):
        return []
    found = doc.get('secrets') or []
    if doc.get('server') != server or doc.get('limits') != limits or not found:
        return []
    for secret in (found[0], found[-1]):
        status, _ = targets.http('GET', target.url(f'{target.query_path}?{target.param}=1'),
                                 headers={'X-API-Key': secret})
        if status not in (200, 429):
            return []
    return found


def create_keys(target: targets.Target, limits: dict, prefix: str, count: int) -> list[str]:
    """`count` keys with `limits` through the target's Management API, KEY_THREADS at a time; their secrets, in
    creation order."""
    tag = secrets.token_hex(3)

    def create(i: int) -> str:
        body = {**targets.key_body(), **limits, 'name': f'{prefix}-{i}-{tag}'}
        status, answer = targets.management(target, 'POST', '/api-keys', body)
        if status != 201 or not isinstance(answer, dict) or not answer.get('secret'):
            raise targets.TargetError(f'{target.name}: create key answered {status}: {str(answer)[:300]}')
        return answer['secret']
    with ThreadPoolExecutor(KEY_THREADS) as pool:
        return list(pool.map(create, range(count)))
