"""The oha block's output, turned into results.jsonl, meta.json, results.md and openloop.png:

    .venv/bin/python -m loadtests.bench oha /results/oha-20261130-101500 [--target gateway]

The oha block runs as loadtests/oha/run.sh (oha itself, in compose's `bench` profile or wherever oha is installed);
this reads its folder. One record per oha run (runs.tsv says which run each JSON file is), in the shape the rest of
the harness uses: kind (warmup, floor, closed, open), scenario, round, connections, offered_rps / offered_pct (open
loop), rps, latency_us {"50", "90", "99", "99.9"} (oha's own percentiles), status codes and errors. oha aborts the
requests still in flight when -z runs out ("aborted due to deadline"): they are counted apart, neither served nor
failed, as in the peer's method; any other error or a non-2xx answer makes the run `ok: false`.
"""
from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from ... import rundir
from . import render

ABORTED = 'aborted due to deadline'
PERCENTILES = {'50': 'p50', '90': 'p90', '99': 'p99', '99.9': 'p99.9'}


def read_settings(folder: Path) -> dict:
    out = {}
    path = folder / 'settings.env'
    if path.exists():
        for line in path.read_text().splitlines():
            if '=' in line:
                key, value = line.split('=', 1)
                try:
                    out[key] = ' '.join(shlex.split(value))
                except ValueError:
                    out[key] = value
    return out


def seconds(text: str) -> float:
    text = text.strip()
    for suffix, factor in (('ms', 0.001), ('s', 1), ('m', 60), ('h', 3600)):
        if text.endswith(suffix):
            return float(text[:-len(suffix)]) * factor
    return float(text)


def problems_of(status: dict, errors: dict) -> list[str]:
    """What went wrong in a run, in words: non-2xx answers by status, and errors by kind."""
    bad = {k: v for k, v in sorted(status.items()) if not k.startswith('2')}
    problems = [f'{sum(bad.values())} non-2xx answers ({", ".join(f"{k}: {v}" for k, v in bad.items())})'] if bad else []
    return problems + [f'{v} {k}' for k, v in errors.items()]


def record_of(row: dict, data: dict, target: str) -> dict:
    summary = data.get('summary', {})
    status = {str(k): int(v) for k, v in (data.get('statusCodeDistribution') or {}).items()}
    errors = {str(k): int(v) for k, v in (data.get('errorDistribution') or {}).items()}
    aborted = errors.pop(ABORTED, 0)
    ok_count = sum(v for k, v in status.items() if k.startswith('2'))
    percentiles = data.get('latencyPercentiles') or {}
    latency = {p: round(float(percentiles[key]) * 1e6, 1) for p, key in PERCENTILES.items()
               if percentiles.get(key) is not None}
    problems = problems_of(status, errors)
    record = {
        'block': 'oha', 'kind': row['mode'], 'target': target, 'scenario': row['scenario'],
        'round': row['round'], 'connections': int(row['connections']),
        'offered_rps': float(row['rate']) if row.get('rate') else None,
        'offered_pct': float(row['pct']) if row.get('pct') else None,
        'duration_s': float(summary.get('total') or seconds(row['duration'])),
        'rps': float(summary.get('requestsPerSec') or 0.0),
        'served_rps': ok_count / float(summary.get('total') or seconds(row['duration'])),
        'requests': sum(status.values()), 'ok_requests': ok_count, 'aborted_at_deadline': aborted,
        'latency_us': latency, 'status': status, 'errors': errors,
        'success_rate': summary.get('successRate'), 'ok': not problems, 'problems': problems,
        'file': row['file'], 'generator': 'oha',
    }
    return record


def collect(folder: Path, target: str = 'gateway') -> list[dict]:
    lines = (folder / 'runs.tsv').read_text().splitlines()
    header = lines[0].split('\t')
    records = []
    for line in lines[1:]:
        row = dict(zip(header, line.split('\t'), strict=False))
        path = folder / row['file']
        if not path.exists() or not path.stat().st_size:
            continue
        records.append(record_of(row, json.loads(path.read_text()), target))
    return records


def write(folder: Path, target: str = 'gateway') -> Path:
    """results.jsonl and meta.json from run.sh's output in `folder`, then results.md and the plot."""
    records = collect(folder, target)
    (folder / 'results.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
    rundir.write_meta(folder, {'block': 'oha', 'settings': read_settings(folder)})
    return render.write(folder)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog='python -m loadtests.bench oha', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('folder', type=Path)
    parser.add_argument('--target', default='gateway', help='the name to give the target in the records')
    args = parser.parse_args(argv)
    print(write(args.folder, args.target))
    return 0

