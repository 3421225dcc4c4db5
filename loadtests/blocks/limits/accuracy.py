"""The accuracy phase: a few keys of a mix driven at 1x, 2x and 10x their rate limit (drive.py, open loop), every
call kept, and what each target admitted compared offline with an exact limiter on the same arrivals
(reference.py): the token bucket the mix asks for (20/second, the mix's burst, full at the start) and each
design's own rule (ours: the same bucket; QueryAPIGate: a bucket of 20, it has no burst; envoy: 20 per fixed
second)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from ... import system
from ...harness import log, now_iso, rotated
from ...system import REPO
from . import ENVOY, KEY_RATE, QAG
from .mixes import Mix
from .reference import Call, bucket_rule, compare, window_rule


def own_rule(target: str, mix: Mix):
    """The rule the target's design claims for the mix's keys."""
    if target == ENVOY:
        return window_rule(KEY_RATE, 1.0), f'fixed window, {KEY_RATE} per second'
    if target == QAG:
        return bucket_rule(KEY_RATE, KEY_RATE), f'token bucket {KEY_RATE}/s, burst {KEY_RATE} (no burst setting)'
    return bucket_rule(KEY_RATE, mix.burst), f'token bucket {KEY_RATE}/s, burst {mix.burst}'


def fill_s(mix: Mix) -> float:
    """Idle time before a run, so that every bucket is full again (burst / rate) and a new window has begun."""
    return mix.burst / KEY_RATE + 0.5


def run_phase(block, live: list, mix: Mix, keys_files: dict, args) -> None:
    multiples = [float(m) for m in args.accuracy_multiples.split(',') if m.strip()]
    measured = [t for t in live if t.name in keys_files and not t.name.endswith('-off')]
    if not multiples or not measured:
        return
    raw = block.run_dir / 'accuracy'
    raw.mkdir(exist_ok=True)
    for r in range(args.rounds):
        for multiple in rotated(multiples, r):
            for target in rotated(measured, r):
                time.sleep(fill_s(mix))
                record = one_run(target, mix, keys_files[target.name], multiple, r + 1, args, raw)
                block.write(record)
                log(progress(record))


def one_run(target, mix: Mix, keys_file: Path, multiple: float, round_no: int, args, raw: Path) -> dict:
    out = raw / f'{mix.name}-{target.name}-{multiple:g}x-{round_no}.json'
    cmd = [*system.taskset_prefix(args.load_cpu), sys.executable, '-m', 'loadtests.blocks.limits.drive',
           '--url', target.base_url, '--keys-file', str(keys_file), '--keys', str(args.accuracy_keys),
           '--rate', str(KEY_RATE), '--multiple', f'{multiple:g}', '--duration', f'{args.accuracy_duration:g}',
           '--seed', str(round_no * 1000 + int(multiple * 10)), '--query', target.query_path,
           '--max-id', str(args.max_id), '--out', str(out)]
    started_at = now_iso()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=args.accuracy_duration + 120)
    if done.returncode != 0:
        raise RuntimeError(f'drive.py failed ({done.returncode}): {done.stderr[-1000:]}')
    data = json.loads(out.read_text())
    return summarise(data, target.name, mix, multiple, round_no, args, started_at)


def summarise(data: dict, target: str, mix: Mix, multiple: float, round_no: int, args, started_at: str) -> dict:
    calls = [Call(*c) for c in data['calls']]
    statuses: dict[str, int] = {}
    for c in calls:
        statuses[str(c.status)] = statuses.get(str(c.status), 0) + 1
    rule, rule_text = own_rule(target, mix)
    return {'block': 'limits', 'kind': 'accuracy', 'mix': mix.name, 'target': target, 'round': round_no,
            'multiple': multiple, 'keys': args.accuracy_keys, 'rate': KEY_RATE, 'burst': mix.burst,
            'duration_s': args.accuracy_duration, 'scheduled': data.get('scheduled'), 'calls': len(calls),
            'statuses': statuses, 'errors': data.get('errors', {}), 'lag_ms': data.get('lag_ms'),
            'drive_cpu_s': data.get('cpu_s'),
            'vs_mix': compare(calls, bucket_rule(KEY_RATE, mix.burst)), 'own_rule': rule_text,
            'vs_own': compare(calls, rule), 'started_at': started_at}


def progress(record: dict) -> str:
    mix, own = record['vs_mix'], record['vs_own']
    lag = record.get('lag_ms') or {}
    return (f'accuracy {record["round"]} {record["target"]} {record["multiple"]:g}x: {record["calls"]:,} calls, '
            f'admitted {mix["admitted"]:,}, exact {mix["exact"]:,} ({mix["ratio"]}), over {mix["over"]}, '
            f'refused that exact admits {mix["missed"]}; own rule {own["ratio"]}; send lag p99 '
            f'{lag.get("p99") or 0:.2f} ms')
