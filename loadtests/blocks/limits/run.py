"""The limits block's run: two targets with the same many keys, the cost rounds, then the runs at the limit."""
from __future__ import annotations

import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ... import targets
from ...harness import WorkerCpu, log, progress_line, record_variants, run_rounds, start_variant
from ..admission.run import RedisCommands
from . import CLIENT_IPS, IP_RATE, KEY_RATE, OFF, ON

KEY_LIMITS = {'rate_limit': f'{KEY_RATE}/second'}
FILL_S = 2.0                   # a bucket of burst 20 at 20/s is full again after 1 s


def run(block, args, work_dir, cleanup, meta, save_meta):
    live, probes = [], {}
    variants = ((ON, {'GATEWAY_ADMISSION': 'on', 'GATEWAY_RATE_LIMIT': IP_RATE, 'GATEWAY_TRUST_PROXY': '1'}),
                (OFF, {'GATEWAY_ADMISSION': 'off', 'GATEWAY_TRUST_PROXY': '1'}))
    for index, (name, extra) in enumerate(variants):
        target, redis_url = start_variant(args, work_dir, cleanup, index, name, extra,
                                          f'gwstore_lim_{"on" if name == ON else "off"}', key_extra=KEY_LIMITS)
        keys_file = work_dir / name / 'keys.txt'
        many_keys(target, args.keys, keys_file)
        target.wrk_env = {'KEYS_FILE': str(keys_file), 'CLIENT_IPS': str(CLIENT_IPS)}
        target.info.update(key_limits=KEY_LIMITS, keys=args.keys, client_ips=CLIENT_IPS, ip_rate_limit=IP_RATE)
        live.append(target)
        probes[name] = (WorkerCpu(target.pids[0]), RedisCommands(redis_url))
    meta['settings'].update(keys=args.keys, hot_keys=args.hot_keys, key_rate=KEY_RATE, ip_rate=IP_RATE,
                            client_ips=CLIENT_IPS)
    record_variants(meta, live, OFF, save_meta)

    run_rounds(block, live, args, probes, _extra)
    at_the_limit(block, live[0], args, probes[ON])


def many_keys(target: targets.Target, count: int, path: Path) -> None:
    """The target's key (provisioned already) and count - 1 more with the same limits, their secrets in `path`."""
    def create(i: int) -> str:
        body = {**targets.key_body(), **KEY_LIMITS, 'name': f'limits-{i}-{secrets.token_hex(3)}'}
        status, answer = targets.management(target, 'POST', '/api-keys', body)
        if status != 201 or not isinstance(answer, dict) or not answer.get('secret'):
            raise targets.TargetError(f'{target.name}: create key answered {status}: {str(answer)[:300]}')
        return answer['secret']
    with ThreadPoolExecutor(8) as pool:
        found = [target.api_key, *pool.map(create, range(1, count))]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('\n'.join(found) + '\n')
    log(f'{target.name}: {len(found)} keys with {KEY_LIMITS}')


def at_the_limit(block, target, args, probes):
    """Every call on the first --hot-keys keys, far above their limit: admitted against an exact bucket's count."""
    for r in range(args.rounds):
        time.sleep(FILL_S)    # the buckets full again, as the exact count assumes (the last run drained them)
        record = block.measure(target, kind='hot', round=r + 1, connections=args.connections[0],
                               duration_s=args.duration, probes=probes, limited_ok=True,
                               wrk_env={'KEYS_USED': str(args.hot_keys)}, hot_keys=args.hot_keys)
        log(progress_line(record, f'at the limit {r + 1}/{args.rounds}') + _extra(record))


def _extra(record: dict) -> str:
    statuses = record.get('statuses') or {}
    return (f'; {statuses.get("429", 0):,} x 429; workers {record.get("worker_cpu_us_per_call") or 0:,.0f} µs '
            f'CPU/call; Redis {record.get("redis_per_call")} commands/call')
