"""PNG plots of a block's results.jsonl (matplotlib, in the `load` and `dev` extras):

    .venv/bin/python -m loadtests.plots loadtests/results/scaleout-20261130-041500

- scaleout.png, when the runs carry a worker count: requests a second against workers (median, min-max bars) with
  the ideal line w x median(1) of each target, and requests a second per busy gateway core; cells whose workers
  shared a core with the load generator or PostgreSQL are ringed.
- openloop.png, when there are open-loop runs (kind "open": oha `-q R --latency-correction`, collected by
  loadtests/oha/collect.py, or loadtests/openloop.py): p50 and p99 against the offered rate.
"""
from __future__ import annotations

import sys
from pathlib import Path

from . import report
from .report import median_range


def _pyplot():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def scaleout(runs: list[dict], path: Path, title: str = '') -> Path | None:
    measured = [r for r in runs if r.get('kind') == 'run' and r.get('workers')]
    if not measured:
        return None
    plt = _pyplot()
    targets = sorted({r['target'] for r in measured}, key=lambda t: (t != 'gateway', t))
    fig, (ax, ax_core) = plt.subplots(1, 2, figsize=(11, 4.5))
    colors = {'gateway': 'tab:blue', 'peer': 'tab:orange'}
    for t in targets:
        color = colors.get(t)
        counts = sorted({r['workers'] for r in measured if r['target'] == t})
        cell = {w: [r for r in measured if r['target'] == t and r['workers'] == w] for w in counts}
        stats = {w: median_range([r['rps'] for r in cell[w]]) for w in counts}
        shared = {w: any(r.get('shared_cpus') for r in cell[w]) for w in counts}
        med = [stats[w][0] for w in counts]
        err = [[stats[w][0] - stats[w][1] for w in counts], [stats[w][2] - stats[w][0] for w in counts]]
        line = ax.errorbar(counts, med, yerr=err, marker='o', capsize=4, label=f'{t}', color=color)
        color = line[0].get_color()
        for w in counts:
            if shared[w]:
                ax.plot([w], [stats[w][0]], marker='o', markersize=11, markerfacecolor='white', color=color)
        if 1 in stats:
            ideal = [w * stats[1][0] for w in counts]
            ax.plot(counts, ideal, linestyle='--', color=color, alpha=0.6, label=f'{t}: linear (w × 1-worker)')
        per_core = {w: median_range([r['rps'] / r['target_cores'] for r in cell[w] if r.get('target_cores')])
                    for w in counts}
        points = [w for w in counts if per_core[w]]
        if points:
            ax_core.errorbar(points, [per_core[w][0] for w in points],
                             yerr=[[per_core[w][0] - per_core[w][1] for w in points],
                                   [per_core[w][2] - per_core[w][0] for w in points]],
                             marker='o', capsize=4, label=t, color=color)
    all_counts = sorted({r['workers'] for r in measured})
    for axis in (ax, ax_core):
        axis.set_xticks(all_counts)
        axis.set_xlabel('workers (one gunicorn master)')
        axis.grid(True, alpha=0.3)
        axis.set_ylim(bottom=0)
        axis.legend(fontsize=8)
    ax.set_ylabel('requests a second (median, min-max)')
    ax.set_title('Throughput against workers' + (' (ringed: shares a core with wrk/PostgreSQL)'
                                                  if any(r.get('shared_cpus') for r in measured) else ''),
                 fontsize=9)
    ax_core.set_ylabel('requests a second per busy gateway core')
    ax_core.set_title('Per core', fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def openloop(runs: list[dict], path: Path, title: str = '') -> Path | None:
    measured = [r for r in runs if r.get('kind') == 'open' and r.get('offered_rps')]
    if not measured:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    series = sorted({(r['target'], r.get('scenario', '')) for r in measured})
    for target, scenario in series:
        mine = [r for r in measured if r['target'] == target and r.get('scenario', '') == scenario]
        rates = sorted({r['offered_rps'] for r in mine})
        label = f'{target} {scenario}'.strip()
        for p, style in (('50', '-'), ('99', '--')):
            stats = [median_range([r['latency_us'].get(p) for r in mine if r['offered_rps'] == rate]) for rate in rates]
            xs = [rate for rate, s in zip(rates, stats) if s]
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


def write(run_dir: Path) -> list[Path]:
    """Every plot the block's data allows; returns the files written."""
    meta, runs = report.load(Path(run_dir))
    when = meta.get('started_at') or meta.get('settings', {}).get('STARTED', '')
    made = [scaleout(runs, Path(run_dir) / 'scaleout.png', f'scale-out, {when}'),
            openloop(runs, Path(run_dir) / 'openloop.png', f'open loop, {when}')]
    return [p for p in made if p]


if __name__ == '__main__':
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    for written in write(Path(sys.argv[1])):
        print(written)
