"""Turn a loadtests/oha/run.sh output folder into results.jsonl, results.md and plots:

    .venv/bin/python -m loadtests.oha.collect /results/oha-20261130-101500 [--target gateway]

One record per oha run (runs.tsv says which run each JSON file is), in the shape the rest of the harness uses:
kind (warmup, floor, closed, open), scenario, round, connections, offered_rps / offered_pct (open loop), rps,
latency_us {"50", "90", "99", "99.9"} (oha's own percentiles), status codes and errors. oha aborts the requests
still in flight when -z runs out ("aborted due to deadline"): they are counted apart, neither served nor failed,
as in the peer's method; any other error or a non-2xx answer makes the run `ok: false`.
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

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
        row = dict(zip(header, line.split('\t')))
        path = folder / row['file']
        if not path.exists() or not path.stat().st_size:
            continue
        records.append(record_of(row, json.loads(path.read_text()), target))
    return records


def _stat(values):
    values = [v for v in values if v is not None]
    return (statistics.median(values), min(values), max(values)) if values else None


def _show(stat, scale=1.0, digits=0) -> str:
    if not stat:
        return '-'
    fmt = f'{{:,.{digits}f}}'
    return f'{fmt.format(stat[0] * scale)} [{fmt.format(stat[1] * scale)}-{fmt.format(stat[2] * scale)}]'


def render(settings: dict, records: list[dict], images: list[Path], title: str = 'oha') -> str:
    out = [f'# Open and closed loop ({title}): {settings.get("STARTED", "")}', '',
           f'- Target: {settings.get("TARGET", "?")}; generator: '
           f'{settings.get("OHA_VERSION") or settings.get("GENERATOR", "?")}.',
           f'- Closed loop: -c {settings.get("CONNECTIONS")} for {settings.get("DURATION")}, {settings.get("ROUNDS")} '
           'round(s), scenarios rotated each round: throughput (closed-loop latency under-reports at saturation).',
           f'- Open loop: {settings.get("OPEN_PCTS")} % of each scenario\'s capacity (the median of its closed-loop '
           f'rounds, or CAPACITY), {settings.get("OPEN_DURATION")} per rate, {settings.get("OPEN_CONNECTIONS")} '
           f'connections, {settings.get("OPEN_ROUNDS")} round(s); latency measured from each request\'s intended send '
           'time (no coordinated omission). Requests still in flight at the end are counted neither way.', '']
    closed = [r for r in records if r['kind'] == 'closed']
    if closed:
        out += ['## Closed loop', '', '| Scenario | Connections | req/s | p50 ms | p99 ms | p99.9 ms | Errors |',
                '|---|---|---|---|---|---|---|']
        for scenario in sorted({r['scenario'] for r in closed}):
            mine = [r for r in closed if r['scenario'] == scenario]
            out.append(f'| {scenario} | {mine[0]["connections"]} | {_show(_stat([r["rps"] for r in mine]))} | '
                       + ' | '.join(_show(_stat([r['latency_us'].get(p) for r in mine]), 0.001, 2)
                                    for p in ('50', '99', '99.9'))
                       + f' | {sum(0 if r["ok"] else 1 for r in mine)} run(s) with errors |')
        out.append('')
    opened = [r for r in records if r['kind'] == 'open']
    if opened:
        out += ['## Latency against offered load (open loop)', '',
                '| Scenario | Offered | Offered req/s | Served req/s | p50 ms | p99 ms | p99.9 ms | Unfinished at the end '
                '| Errors |',
                '|---|---|---|---|---|---|---|---|---|']
        for scenario in sorted({r['scenario'] for r in opened}):
            for pct in sorted({r['offered_pct'] for r in opened if r['scenario'] == scenario}):
                mine = [r for r in opened if r['scenario'] == scenario and r['offered_pct'] == pct]
                out.append(f'| {scenario} | {pct:.0f}% | {mine[0]["offered_rps"]:,.0f} | '
                           f'{_show(_stat([r["served_rps"] for r in mine]))} | '
                           + ' | '.join(_show(_stat([r['latency_us'].get(p) for r in mine]), 0.001, 2)
                                        for p in ('50', '99', '99.9'))
                           + f' | {sum(r.get("aborted_at_deadline", 0) for r in mine):,} | '
                           f'{"; ".join(p for r in mine for p in r["problems"]) or "none"} |')
        out.append('')
    floors = [r for r in records if r['kind'] == 'floor']
    if floors:
        out += ['## /health floor', '', '| Phase | req/s |', '|---|---|']
        out += [f'| {r["round"]} | {r["rps"]:,.0f} |' for r in floors] + ['']
    out += [f'![{p.stem}]({p.name})' for p in images] + ['']
    return '\n'.join(out) + '\n'


def write(folder: Path, target: str = 'gateway') -> Path:
    from .. import plots
    records = collect(folder, target)
    (folder / 'results.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
    (folder / 'meta.json').write_text(json.dumps({'block': 'oha', 'settings': read_settings(folder)}, indent=2) + '\n')
    try:
        images = plots.write(folder)
    except Exception as error:  # matplotlib missing: the tables still stand
        print(f'no plots: {error}', file=sys.stderr)
        images = []
    path = folder / 'results.md'
    path.write_text(render(read_settings(folder), records, images))
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog='python -m loadtests.oha.collect', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('folder', type=Path)
    parser.add_argument('--target', default='gateway', help='the name to give the target in the records')
    args = parser.parse_args(argv)
    print(write(args.folder, args.target))
    return 0


if __name__ == '__main__':
    sys.exit(main())
