"""The scale-out block's results.md and scaleout.png: throughput against workers, per worker and per busy core,
efficiency against linear, ours against the peer, latency and the other parts' CPU, and every run."""
from __future__ import annotations

from pathlib import Path

from ... import rundir
from ...markdown import environment, table_head
from ...stats import (
    NOISY_CORES,
    Cell,
    cpu_per_call,
    false_clear_chance,
    fmt_ms,
    fmt_plain,
    fmt_rps,
    median_range,
    other_cores,
    overlap,
    paired_ratios,
    pct,
    pg_cores,
    rps,
    show,
    show_paired,
    target_cores,
    wrk_cores,
)


def write(run_dir: Path, plots: bool = True) -> Path:
    run_dir = Path(run_dir)
    meta, runs = rundir.load(run_dir)
    images = []
    if plots:
        try:
            when = meta.get('started_at') or meta.get('settings', {}).get('STARTED', '')
            images = [p for p in [plot(runs, run_dir / 'scaleout.png', f'scale-out, {when}')] if p]
        except Exception as error:  # matplotlib missing or a plot failed: the tables still matter
            meta.setdefault('notes', []).append(f'No plots: {error}')
    path = run_dir / 'results.md'
    path.write_text(render(meta, runs, images))
    return path


def _cells(runs: list[dict]) -> dict:
    cells: dict = {}
    for r in runs:
        if r.get('kind') == 'run':
            cells.setdefault((r['target'], r['workers']), []).append(r)
    return {k: Cell(v) for k, v in cells.items()}


def render(meta: dict, runs: list[dict], images: list[Path] | None = None) -> str:
    settings = meta.get('settings', {})
    cells = _cells(runs)
    target_names = [t for t in settings.get('targets', []) if any(k[0] == t for k in cells)] or \
        sorted({k[0] for k in cells})
    counts = sorted({k[1] for k in cells})
    rounds_done = max((len(c.runs) for c in cells.values()), default=0)
    out = [f'# Block `scaleout`: {meta.get("started_at", "?")}', '']
    if meta.get('finished_at') is None:
        out += ['**Incomplete: the block did not finish**; the numbers below are what it recorded.', '']
    out += [f'- Method: {rounds_done} round(s) per cell, {settings.get("grouping", "")}; wrk '
            f'`-t{settings.get("wrk_threads", 1)} -c '
            f'{settings.get("conns_per_worker", 32)}×w -d {settings.get("duration_s")}s`, closed loop, GET '
            f'/q/account?aid=<random 1..{settings.get("max_id", 0):,}>; a {settings.get("warmup_s")} s warm-up per '
            f'server; /health floors on the 1-worker servers before and after.',
            f'- Rule: a difference counts only when ranges do not overlap (with {rounds_done} round(s), equal '
            f'targets get clear ranges by chance {false_clear_chance(rounds_done) * 100:.1f}% of the time'
            + ('; use 5 rounds' if rounds_done < 5 else '') + ').',
            f'- Admission: {settings.get("admission", "?")}.',
            f'- Cores: {settings.get("cores_note", "?")}. {settings.get("pinning_note", "")}', '']
    notes = list(meta.get('notes') or [])
    noisy = [r for r in runs if r.get('kind') == 'run' and (r.get('other_cores') or 0) > NOISY_CORES]
    if noisy:
        notes.append(f'{len(noisy)} of {sum(1 for r in runs if r.get("kind") == "run")} runs shared the machine '
                     f'with other processes (over {NOISY_CORES} core, up to '
                     f'{max(r["other_cores"] for r in noisy):.2f}; "Other cores" below): their numbers are suspect.')
    if notes:
        out += ['Notes:', ''] + [f'- {n}' for n in notes] + ['']

    # -- throughput
    out += ['## Throughput against workers', '',
            'Requests a second, median [min-max]; per worker = req/s ÷ w; per core = req/s ÷ the target\'s busy '
            'cores (its CPU seconds ÷ run time); efficiency = median(w) ÷ (w × median(1)), 100% is linear.', '']
    out += table_head(['Workers', 'Target', 'Gateway CPUs', 'req/s', 'per worker', 'per busy core', 'Efficiency',
                        'Target cores', 'CPU µs/call'])
    base = {t: cells[t, 1].stat(rps) for t in target_names if (t, 1) in cells}
    for w in counts:
        for t in target_names:
            cell = cells.get((t, w))
            if cell is None:
                continue
            stat = cell.stat(rps)
            per_core = cell.stat(lambda r: r['rps'] / r['target_cores'] if r.get('target_cores') else None)
            eff = f'{stat[0] / (w * base[t][0]) * 100:.0f}%' if stat and base.get(t) else '-'
            first = cell.runs[0]
            shared = first.get('shared_cpus')
            cpus = first.get('cpus', '?') + (f' (shares {shared} with wrk/PG)' if shared else '')
            out.append(f'| {w} | {t} | {cpus} | {show(stat, fmt_rps)} | '
                       f'{fmt_rps(stat[0] / w) if stat else "-"} | {show(per_core, fmt_rps)} | {eff} | '
                       f'{show(cell.stat(target_cores))} | {show(cell.stat(cpu_per_call))} |')
    out.append('')
    out += _paired_efficiency(cells, target_names, counts)
    if 'gateway' in target_names and 'peer' in target_names:
        out += ['Ours against the peer at the same worker count (ratio of medians; "clear" only when the ranges do '
                'not overlap; paired: ratio of the two runs of each round):', '']
        out += table_head(['Workers', 'gateway / peer req/s', 'paired per round', 'gateway / peer CPU per call'])
        for w in counts:
            g, p = cells.get(('gateway', w)), cells.get(('peer', w))
            if g is None or p is None:
                continue
            n = min(len(g.runs), len(p.runs))
            ratio = _ratio(g.stat(rps), p.stat(rps), n)
            cpu = _ratio(g.stat(cpu_per_call), p.stat(cpu_per_call), n)
            paired = show_paired(paired_ratios(g.runs, p.runs, rps))
            out.append(f'| {w} | {ratio} | {paired} | {cpu} |')
        out.append('')
    for image in images or []:
        out += [f'![{image.stem}]({image.name})', '']

    # -- latency and CPU of the other parts
    out += ['## Latency and the other parts\' CPU', '',
            'Closed loop at 32×w connections: latency here is queueing at saturation, not latency against an '
            'offered rate (that is the open-loop block, with oha). Other cores: the machine\'s busy CPU less the '
            'target, PostgreSQL and wrk; "of which idle servers" is the part this block\'s other servers used '
            '(their bus, history and lease threads) while they waited their turn.', '']
    out += table_head(['Workers', 'Target', 'Connections', 'p50 ms', 'p99 ms', 'PostgreSQL cores', 'wrk cores',
                        'Other cores', 'of which idle servers', 'Errors'])
    for w in counts:
        for t in target_names:
            cell = cells.get((t, w))
            if cell is None:
                continue
            errors = sum(sum(r['errors'].values()) for r in cell.runs)
            out.append(f'| {w} | {t} | {cell.runs[0]["connections"]} | {show(cell.stat(pct("50")), fmt_ms)} | '
                       f'{show(cell.stat(pct("99")), fmt_ms)} | {show(cell.stat(pg_cores))} | '
                       f'{show(cell.stat(wrk_cores))} | {show(cell.stat(other_cores))} | '
                       f'{show(cell.stat(lambda r: r.get("idle_servers_cores")))} | {errors} |')
    out.append('')

    # -- floors and every run
    floors = [r for r in runs if r.get('kind') == 'floor']
    if floors:
        out += ['## /health floor', '']
        out += table_head(['Target', 'Phase', 'req/s', 'Errors'])
        for r in floors:
            out.append(f'| {r["target"]} w={r.get("workers")} | {r.get("phase")} | {fmt_rps(r["rps"])} | '
                       f'{sum(r["errors"].values())} |')
        out.append('')
    out += ['## Every run', '']
    out += table_head(['Round', 'Pos', 'Target', 'Workers', 'CPUs', 'Conns', 'req/s', 'p50 ms', 'p99 ms',
                        'CPU µs/call', 'Target cores', 'Other cores', 'Errors', 'Started'])
    for r in runs:
        if r.get('kind') != 'run':
            continue
        cpu = r.get('cpu_us_per_call')
        out.append(f'| {r["round"]} | {r["position"]} | {r["target"]} | {r["workers"]} | {r.get("cpus")} | '
                   f'{r["connections"]} | {fmt_rps(r["rps"])} | {fmt_ms(r["latency_us"]["50"] / 1000)} | '
                   f'{fmt_ms(r["latency_us"]["99"] / 1000)} | {"-" if cpu is None else fmt_plain(cpu)} | '
                   f'{r.get("target_cores") or 0:.2f} | {r.get("other_cores", 0):.2f} | '
                   f'{sum(r["errors"].values())} | {r.get("started_at", "")[11:19]} |')
    out.append('')
    out += environment(meta)
    return '\n'.join(out) + '\n'


EFFICIENCY_GOAL = 0.90      # of linear, up to 8 workers (the scale-out issue)
SPREAD_GOAL = 0.15          # each worker within 15% of an even share, every round


def _paired_efficiency(cells: dict, target_names: list[str], counts: list[int]) -> list[str]:
    """Efficiency against linear round by round (req/s at w ÷ (w × req/s at 1 worker, same round)), judged on the
    worst round, and how evenly the workers shared the load (each worker's CPU against the mean, worst round)."""
    out = ['Paired per round: efficiency = req/s(w) ÷ (w × req/s(1)) of the same round, median [min-max], the goal '
           f'({EFFICIENCY_GOAL:.0%} of linear up to 8 workers) judged on the worst round. Worker spread: the largest '
           'distance of one worker\'s busy CPU from the workers\' mean, in the round where it was largest (goal: '
           f'within {SPREAD_GOAL:.0%}).', '']
    out += table_head(['Workers', 'Target', 'Efficiency, paired per round', 'Worker spread, worst round',
                       'Worker cores, that round'])
    for t in target_names:
        one = cells.get((t, 1))
        for w in counts:
            cell = cells.get((t, w))
            if cell is None:
                continue
            eff = '-' if one is None or w == 1 else show_paired(
                paired_ratios(cell.runs, one.runs, rps, scale=w), goal=EFFICIENCY_GOAL if w <= 8 else None,
                percent=True)
            spreads = [r for r in cell.runs if r.get('worker_spread') is not None]
            worst = max(spreads, key=lambda r: r['worker_spread'], default=None)
            if worst is None or w == 1:
                spread, cores = '-', '-'
            else:
                verdict = 'meets' if worst['worker_spread'] <= SPREAD_GOAL else 'misses'
                spread = f'{worst["worker_spread"]:.0%} (round {worst.get("round")}: {verdict} {SPREAD_GOAL:.0%})'
                cores = ' + '.join(f'{c:.2f}' for c in worst.get('worker_cores', []))
            out.append(f'| {w} | {t} | {eff} | {spread} | {cores} |')
    return out + ['']


def _ratio(ours, base, rounds: int) -> str:
    if not ours or not base or not base[0]:
        return '-'
    if rounds < 3:
        return f'{ours[0] / base[0]:.2f}× (no verdict: {rounds} round(s))'
    return f'{ours[0] / base[0]:.2f}× ({"overlap" if overlap(ours, base) else "clear"})'


def plot(runs: list[dict], path: Path, title: str = '') -> Path | None:
    """scaleout.png: requests a second against workers (median, min-max bars) with the ideal line w x median(1) of
    each target, and requests a second per busy gateway core; cells whose workers shared a core with the load
    generator or PostgreSQL are ringed. None when no run carries a worker count."""
    measured = [r for r in runs if r.get('kind') == 'run' and r.get('workers')]
    if not measured:
        return None
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
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
