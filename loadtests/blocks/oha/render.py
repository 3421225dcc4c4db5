"""The results.md of an open- and closed-loop folder (the oha block's, and the openloop block's tables) and
openloop.png: p50 and p99 against the offered rate."""
from __future__ import annotations

import sys
from pathlib import Path

from ... import rundir
from ...stats import median_range, show_range


def write(run_dir: Path) -> Path:
    """results.md and openloop.png of a folder whose results.jsonl the oha block has collected (run.py)."""
    run_dir = Path(run_dir)
    meta, records = rundir.load(run_dir)
    images = plots(meta, records, run_dir)
    path = run_dir / 'results.md'
    path.write_text(render(meta.get('settings', {}), records, images))
    return path


def plots(meta: dict, records: list[dict], run_dir: Path) -> list[Path]:
    """openloop.png when there are open-loop runs; [] without them, or without matplotlib (said on stderr)."""
    when = meta.get('started_at') or meta.get('settings', {}).get('STARTED', '')
    try:
        made = plot(records, run_dir / 'openloop.png', f'open loop, {when}')
    except Exception as error:  # matplotlib missing: the tables still stand
        print(f'no plots: {error}', file=sys.stderr)
        return []
    return [made] if made else []


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
            out.append(f'| {scenario} | {mine[0]["connections"]} | {_per_s([r["rps"] for r in mine])} | '
                       + ' | '.join(_ms([r['latency_us'].get(p) for r in mine])
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
                           f'{_per_s([r["served_rps"] for r in mine])} | '
                           + ' | '.join(_ms([r['latency_us'].get(p) for r in mine])
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


def _per_s(values) -> str:
    return show_range(median_range(values), 0)


def _ms(microseconds) -> str:
    return show_range(median_range(microseconds), 2, scale=0.001)


def plot(runs: list[dict], path: Path, title: str = '') -> Path | None:
    """openloop.png: p50 and p99 against the offered rate, per target and scenario; None without open-loop runs."""
    measured = [r for r in runs if r.get('kind') == 'open' and r.get('offered_rps')]
    if not measured:
        return None
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    series = sorted({(r['target'], r.get('scenario', '')) for r in measured})
    for target, scenario in series:
        mine = [r for r in measured if r['target'] == target and r.get('scenario', '') == scenario]
        rates = sorted({r['offered_rps'] for r in mine})
        label = f'{target} {scenario}'.strip()
        for p, style in (('50', '-'), ('99', '--')):
            stats = [median_range([r['latency_us'].get(p) for r in mine if r['offered_rps'] == rate]) for rate in rates]
            xs = [rate for rate, s in zip(rates, stats, strict=True) if s]
            ys = [s[0] / 1000 for s in stats if s]
            ax.plot(xs, ys, linestyle=style, marker='o', label=f'{label} p{p}')
    ax.set_yscale('log')
    ax.set_xlabel('offered requests a second (open loop, latency-corrected)')
    ax.set_ylabel('latency, ms (log)')
    ax.grid(True, which='both', alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or 'Latency against offered load', fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
