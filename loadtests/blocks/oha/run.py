"""The oha block's output, turned into results.jsonl, meta.json, results.md and openloop.png:

    .venv/bin/python -m loadtests.bench oha /results/oha-20261130-101500 [--target gateway]

The oha block runs as loadtests/oha/run.sh (oha itself, in compose's `bench` profile or wherever oha is installed);
this reads its folder: one record per oha run (runs.tsv says which run each JSON file is), in the harness's shape
(kind closed/open/floor/warmup, scenario, round, connections, offered rate, req/s, oha's percentiles in
latency_us, status codes and errors). Requests oha aborts when -z runs out ("aborted due to deadline") are counted
apart, neither served nor failed, as in the peer's method; any other error or a non-2xx makes the run `ok: false`.
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
    path = folder / 'settings.env'
    lines = path.read_text().splitlines() if path.exists() else []
    return {key: _words(value) for key, _, value in (line.partition('=') for line in lines if '=' in line)}


def _words(value: str) -> str:
    try:
        return ' '.join(shlex.split(value))
    except ValueError:
        return value


def seconds(text: str) -> float:
    text = text.strip()
    for suffix, factor in (('ms', 0.001), ('s', 1), ('m', 60), ('h', 3600)):
        if text.endswith(suffix):
            return float(text[:-len(suffix)]) * factor
    return float(text)


def record_of(row: dict, data: dict, target: str) -> dict:
    summary = data.get('summary', {})
    status = {str(k): int(v) for k, v in (data.get('statusCodeDistribution') or {}).items()}
    errors = {str(k): int(v) for k, v in (data.get('errorDistribution') or {}).items()}
    aborted = errors.pop(ABORTED, 0)
    served = sum(v for k, v in status.items() if k.startswith('2'))
    bad = {k: v for k, v in sorted(status.items()) if not k.startswith('2')}
    problems = ([f'{sum(bad.values())} non-2xx answers ({", ".join(f"{k}: {v}" for k, v in bad.items())})']
                if bad else []) + [f'{v} {k}' for k, v in errors.items()]
    percentiles = data.get('latencyPercentiles') or {}
    duration = float(summary.get('total') or seconds(row['duration']))
    return {'block': 'oha', 'kind': row['mode'], 'target': target, 'scenario': row['scenario'], 'round': row['round'],
            'connections': int(row['connections']), 'offered_rps': float(row['rate']) if row.get('rate') else None,
            'offered_pct': float(row['pct']) if row.get('pct') else None, 'duration_s': duration,
            'rps': float(summary.get('requestsPerSec') or 0.0), 'served_rps': served / duration,
            'requests': sum(status.values()), 'ok_requests': served, 'aborted_at_deadline': aborted,
            'latency_us': {p: round(float(percentiles[key]) * 1e6, 1) for p, key in PERCENTILES.items()
                           if percentiles.get(key) is not None},
            'status': status, 'errors': errors, 'success_rate': summary.get('successRate'), 'ok': not problems,
            'problems': problems, 'file': row['file'], 'generator': 'oha'}


def collect(folder: Path, target: str = 'gateway') -> list[dict]:
    header, *lines = (folder / 'runs.tsv').read_text().splitlines()
    rows = [dict(zip(header.split('\t'), line.split('\t'), strict=False)) for line in lines]
    return [record_of(row, json.loads((folder / row['file']).read_text()), target) for row in rows
            if (folder / row['file']).exists() and (folder / row['file']).stat().st_size]


def write(folder: Path, target: str = 'gateway') -> Path:
    """results.jsonl and meta.json from run.sh's output in `folder`, then results.md and the plot."""
    (folder / 'results.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in collect(folder, target)))
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
