"""The oha block's results.md and openloop.png (p50 and p99 against the offered rate), from the records run.py
collected out of loadtests/oha/run.sh's folder."""
from __future__ import annotations

import sys
from pathlib import Path

from ... import rundir
from ...markdown import table
from ...stats import median_range, show_range


def write(run_dir: Path) -> Path:
    run_dir = Path(run_dir)
    meta, records = rundir.load(run_dir)
    try:
        images = [p for p in [plot(records, run_dir / 'openloop.png',
                                   f'open loop, {meta.get("settings", {}).get("STARTED", "")}')] if p]
    except Exception as error:  # matplotlib missing: the tables still stand
        print(f'no plots: {error}', file=sys.stderr)
        images = []
    path = run_dir / 'results.md'
    path.write_text(render(meta.get('settings', {}), records, images))
    return path


def render(settings: dict, records: list[dict], images: list[Path]) -> str:
    closed = [r for r in records if r['kind'] == 'closed']
    opened = [r for r in records if r['kind'] == 'open']
    floors = [r for r in records if r['kind'] == 'floor']
    out = [f'# Open and closed loop (oha): {settings.get("STARTED", "")}', '',
           f'- Target: {settings.get("TARGET", "?")}; generator: {settings.get("OHA_VERSION") or "?"}.',
           f'- Closed loop: -c {settings.get("CONNECTIONS")} for {settings.get("DURATION")}, {settings.get("ROUNDS")} '
           'round(s), scenarios rotated each round: throughput (closed-loop latency under-reports at saturation).',
           f'- Open loop: {settings.get("OPEN_PCTS")} % of each scenario\'s capacity (the median of its closed-loop '
           f'rounds, or CAPACITY), {settings.get("OPEN_DURATION")} per rate, {settings.get("OPEN_CONNECTIONS")} '
           f'connections, {settings.get("OPEN_ROUNDS")} round(s); latency measured from each request\'s intended send '
           'time (no coordinated omission). Requests still in flight at the end are counted neither way.', '']
    if closed:
        out += ['## Closed loop', '', *table(
            ['Scenario', 'Connections', 'req/s', 'p50 ms', 'p99 ms', 'p99.9 ms', 'Errors'],
            [[s, mine[0]['connections'], _per_s([r['rps'] for r in mine]), *_latency(mine),
              f'{sum(0 if r["ok"] else 1 for r in mine)} run(s) with errors']
             for s in sorted({r['scenario'] for r in closed}) if (mine := [r for r in closed if r['scenario'] == s])])]
    if opened:
        cells = [[r for r in opened if r['scenario'] == s and r['offered_pct'] == pct]
                 for s in sorted({r['scenario'] for r in opened})
                 for pct in sorted({r['offered_pct'] for r in opened if r['scenario'] == s})]
        out += ['## Latency against offered load (open loop)', '', *table(
            ['Scenario', 'Offered', 'Offered req/s', 'Served req/s', 'p50 ms', 'p99 ms', 'p99.9 ms',
             'Unfinished at the end', 'Errors'],
            [[mine[0]['scenario'], f'{mine[0]["offered_pct"]:.0f}%', f'{mine[0]["offered_rps"]:,.0f}',
              _per_s([r['served_rps'] for r in mine]), *_latency(mine),
              f'{sum(r.get("aborted_at_deadline", 0) for r in mine):,}',
              '; '.join(p for r in mine for p in r['problems']) or 'none'] for mine in cells])]
    if floors:
        out += ['## /health floor', '', *table(['Phase', 'req/s'], [[r['round'], f'{r["rps"]:,.0f}'] for r in floors])]
    return '\n'.join(out + [f'![{p.stem}]({p.name})' for p in images] + ['']) + '\n'


def _per_s(values) -> str:
    return show_range(median_range(values), 0)


def _latency(mine: list[dict]) -> list[str]:
    return [show_range(median_range([r['latency_us'].get(p) for r in mine]), 2, scale=0.001)
            for p in ('50', '99', '99.9')]


def plot(runs: list[dict], path: Path, title: str) -> Path | None:
    """openloop.png: p50 and p99 against the offered rate, per target and scenario; None without open-loop runs."""
    measured = [r for r in runs if r.get('kind') == 'open' and r.get('offered_rps')]
    if not measured:
        return None
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for target, scenario in sorted({(r['target'], r.get('scenario', '')) for r in measured}):
        mine = [r for r in measured if r['target'] == target and r.get('scenario', '') == scenario]
        rates = sorted({r['offered_rps'] for r in mine})
        for p, style in (('50', '-'), ('99', '--')):
            stats = {rate: median_range([r['latency_us'].get(p) for r in mine if r['offered_rps'] == rate])
                     for rate in rates}
            ax.plot([x for x, s in stats.items() if s], [s[0] / 1000 for s in stats.values() if s], linestyle=style,
                    marker='o', label=f'{target} {scenario}'.strip() + f' p{p}')
    ax.set_yscale('log')
    ax.set_xlabel('offered requests a second (open loop, latency-corrected)')
    ax.set_ylabel('latency, ms (log)')
    ax.grid(True, which='both', alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
