"""The scale-out block's results.md and scaleout.png: throughput against workers, per worker and per busy core,
efficiency against linear, ours against the peer, latency and the other parts' CPU, and every run."""
from __future__ import annotations

from pathlib import Path

from ... import rundir
from ... import stats as st
from ...markdown import environment, notes, table

EFFICIENCY_GOAL = 0.90      # of linear, up to 8 workers (the scale-out issue)
SPREAD_GOAL = 0.15          # each worker within 15% of an even share, every round


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


def render(meta: dict, runs: list[dict], images: list[Path] | None = None) -> str:
    settings = meta.get('settings', {})
    measured = [r for r in runs if r.get('kind') == 'run']
    cells: dict = {}
    for r in measured:
        cells.setdefault((r['target'], r['workers']), st.Cell([])).runs.append(r)
    names = [t for t in settings.get('targets', []) if any(k[0] == t for k in cells)] or sorted({k[0] for k in cells})
    counts = sorted({k[1] for k in cells})
    grid = [(w, t, cells[t, w]) for w in counts for t in names if (t, w) in cells]
    rounds = max((len(c.runs) for c in cells.values()), default=0)
    base = {t: cells[t, 1].stat(st.rps) for t in names if (t, 1) in cells}
    noisy = [r for r in measured if (r.get('other_cores') or 0) > st.NOISY_CORES]
    out = [f'# Block `scaleout`: {meta.get("started_at", "?")}', '']
    if meta.get('finished_at') is None:
        out += ['**Incomplete: the block did not finish**; the numbers below are what it recorded.', '']
    out += [f'- Method: {rounds} round(s) per cell, {settings.get("grouping", "")}; wrk '
            f'`-t{settings.get("wrk_threads", 1)} -c {settings.get("conns_per_worker", 32)}×w -d '
            f'{settings.get("duration_s")}s`, closed loop, GET /q/account?aid=<random 1..{settings.get("max_id", 0):,}>; '
            f'a {settings.get("warmup_s")} s warm-up per server; /health floors on the 1-worker servers before and '
            'after.',
            f'- Rule: a difference counts only when ranges do not overlap (with {rounds} round(s), equal targets get '
            f'clear ranges by chance {st.false_clear_chance(rounds) * 100:.1f}% of the time'
            + ('; use 5 rounds' if rounds < 5 else '') + ').',
            f'- Admission: {settings.get("admission", "?")}.',
            f'- Cores: {settings.get("cores_note", "?")}. {settings.get("pinning_note", "")}', '',
            *notes(meta, [f'{len(noisy)} of {len(measured)} runs shared the machine with other processes (over '
                          f'{st.NOISY_CORES} core, up to {max(r["other_cores"] for r in noisy):.2f}; "Other cores" '
                          'below): their numbers are suspect.'] if noisy else []),
            '## Throughput against workers', '',
            'Requests a second, median [min-max]; per worker = req/s ÷ w; per core = req/s ÷ the target\'s busy '
            'cores (its CPU seconds ÷ run time); efficiency = median(w) ÷ (w × median(1)), 100% is linear.', '']

    def throughput(w, t, cell):
        stat = cell.stat(st.rps)
        first = cell.runs[0]
        shared = first.get('shared_cpus')
        return [w, t, first.get('cpus', '?') + (f' (shares {shared} with wrk/PG)' if shared else ''),
                st.show(stat, st.fmt_rps), st.fmt_rps(stat[0] / w) if stat else '-',
                st.show(cell.stat(lambda r: r['rps'] / r['target_cores'] if r.get('target_cores') else None),
                        st.fmt_rps),
                f'{stat[0] / (w * base[t][0]) * 100:.0f}%' if stat and base.get(t) else '-',
                st.show(cell.stat(st.target_cores)), st.show(cell.stat(st.cpu_per_call))]
    out += table(['Workers', 'Target', 'Gateway CPUs', 'req/s', 'per worker', 'per busy core', 'Efficiency',
                  'Target cores', 'CPU µs/call'], [throughput(*g) for g in grid], blank=False)
    out += ['', *_paired_efficiency(cells, names, counts)]
    if 'gateway' in names and 'peer' in names:
        pairs = [(w, cells[('gateway', w)], cells[('peer', w)]) for w in counts
                 if ('gateway', w) in cells and ('peer', w) in cells]
        out += ['Ours against the peer at the same worker count (ratio of medians; "clear" only when the ranges do '
                'not overlap; paired: ratio of the two runs of each round):', '',
                *table(['Workers', 'gateway / peer req/s', 'paired per round', 'gateway / peer CPU per call'],
                       [[w, _ratio(g.stat(st.rps), p.stat(st.rps), min(len(g.runs), len(p.runs))),
                         st.show_paired(st.paired_ratios(g.runs, p.runs, st.rps)),
                         _ratio(g.stat(st.cpu_per_call), p.stat(st.cpu_per_call), min(len(g.runs), len(p.runs)))]
                        for w, g, p in pairs])]
    out += [line for image in images or [] for line in (f'![{image.stem}]({image.name})', '')]
    out += ['## Latency and the other parts\' CPU', '',
            'Closed loop at 32×w connections: latency here is queueing at saturation, not latency against an '
            'offered rate (that is the open-loop block, with oha). Other cores: the machine\'s busy CPU less the '
            'target, PostgreSQL and wrk; "of which idle servers" is the part this block\'s other servers used '
            '(their bus, history and lease threads) while they waited their turn.', '',
            *table(['Workers', 'Target', 'Connections', 'p50 ms', 'p99 ms', 'PostgreSQL cores', 'wrk cores',
                    'Other cores', 'of which idle servers', 'Errors'],
                   [[w, t, cell.runs[0]['connections'], st.show(cell.stat(st.pct('50')), st.fmt_ms),
                     st.show(cell.stat(st.pct('99')), st.fmt_ms),
                     *[st.show(cell.stat(f)) for f in (st.pg_cores, st.wrk_cores, st.other_cores,
                                                       lambda r: r.get('idle_servers_cores'))],
                     sum(sum(r['errors'].values()) for r in cell.runs)] for w, t, cell in grid])]
    floors = [r for r in runs if r.get('kind') == 'floor']
    if floors:
        out += ['## /health floor', '', *table(['Target', 'Phase', 'req/s', 'Errors'], [
            [f'{r["target"]} w={r.get("workers")}', r.get('phase'), st.fmt_rps(r['rps']), sum(r['errors'].values())]
            for r in floors])]
    out += ['## Every run', '', *table(
        ['Round', 'Pos', 'Target', 'Workers', 'CPUs', 'Conns', 'req/s', 'p50 ms', 'p99 ms', 'CPU µs/call',
         'Target cores', 'Other cores', 'Errors', 'Started'],
        [[r['round'], r['position'], r['target'], r['workers'], r.get('cpus'), r['connections'], st.fmt_rps(r['rps']),
          st.fmt_ms(r['latency_us']['50'] / 1000), st.fmt_ms(r['latency_us']['99'] / 1000),
          '-' if r.get('cpu_us_per_call') is None else st.fmt_plain(r['cpu_us_per_call']),
          f'{r.get("target_cores") or 0:.2f}', f'{r.get("other_cores", 0):.2f}', sum(r['errors'].values()),
          r.get('started_at', '')[11:19]] for r in measured])]
    return '\n'.join(out + environment(meta)) + '\n'


def _paired_efficiency(cells: dict, names: list[str], counts: list[int]) -> list[str]:
    """Efficiency against linear round by round (req/s at w ÷ (w × req/s at 1 worker, same round)), judged on the
    worst round, and how evenly the workers shared the load (each worker's CPU against the mean, worst round)."""
    rows = []
    for t in names:
        one = cells.get((t, 1))
        for w in counts:
            cell = cells.get((t, w))
            if cell is None:
                continue
            eff = '-' if one is None or w == 1 else st.show_paired(
                st.paired_ratios(cell.runs, one.runs, st.rps, scale=w), goal=EFFICIENCY_GOAL if w <= 8 else None,
                percent=True)
            worst = max((r for r in cell.runs if r.get('worker_spread') is not None),
                        key=lambda r: r['worker_spread'], default=None)
            if worst is None or w == 1:
                rows.append([w, t, eff, '-', '-'])
                continue
            verdict = 'meets' if worst['worker_spread'] <= SPREAD_GOAL else 'misses'
            rows.append([w, t, eff, f'{worst["worker_spread"]:.0%} (round {worst.get("round")}: {verdict} '
                         f'{SPREAD_GOAL:.0%})', ' + '.join(f'{c:.2f}' for c in worst.get('worker_cores', []))])
    return ['Paired per round: efficiency = req/s(w) ÷ (w × req/s(1)) of the same round, median [min-max], the goal '
            f'({EFFICIENCY_GOAL:.0%} of linear up to 8 workers) judged on the worst round. Worker spread: the largest '
            'distance of one worker\'s busy CPU from the workers\' mean, in the round where it was largest (goal: '
            f'within {SPREAD_GOAL:.0%}).', '',
            *table(['Workers', 'Target', 'Efficiency, paired per round', 'Worker spread, worst round',
                    'Worker cores, that round'], rows, blank=False), '']


def _ratio(ours, base, rounds: int) -> str:
    if not ours or not base or not base[0]:
        return '-'
    if rounds < 3:
        return f'{ours[0] / base[0]:.2f}× (no verdict: {rounds} round(s))'
    return f'{ours[0] / base[0]:.2f}× ({"overlap" if st.overlap(ours, base) else "clear"})'


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
    fig, (ax, ax_core) = plt.subplots(1, 2, figsize=(11, 4.5))
    colors = {'gateway': 'tab:blue', 'peer': 'tab:orange'}

    def bars(stats: dict, points: list) -> list:
        return [[stats[w][0] - stats[w][1] for w in points], [stats[w][2] - stats[w][0] for w in points]]
    for t in sorted({r['target'] for r in measured}, key=lambda t: (t != 'gateway', t)):
        counts = sorted({r['workers'] for r in measured if r['target'] == t})
        cell = {w: [r for r in measured if r['target'] == t and r['workers'] == w] for w in counts}
        stats = {w: st.median_range([r['rps'] for r in cell[w]]) for w in counts}
        line = ax.errorbar(counts, [stats[w][0] for w in counts], yerr=bars(stats, counts), marker='o', capsize=4,
                           label=f'{t}', color=colors.get(t))
        color = line[0].get_color()
        for w in counts:
            if any(r.get('shared_cpus') for r in cell[w]):
                ax.plot([w], [stats[w][0]], marker='o', markersize=11, markerfacecolor='white', color=color)
        if 1 in stats:
            ax.plot(counts, [w * stats[1][0] for w in counts], linestyle='--', color=color, alpha=0.6,
                    label=f'{t}: linear (w × 1-worker)')
        per_core = {w: st.median_range([r['rps'] / r['target_cores'] for r in cell[w] if r.get('target_cores')])
                    for w in counts}
        points = [w for w in counts if per_core[w]]
        if points:
            ax_core.errorbar(points, [per_core[w][0] for w in points], yerr=bars(per_core, points), marker='o',
                             capsize=4, label=t, color=color)
    for axis in (ax, ax_core):
        axis.set_xticks(sorted({r['workers'] for r in measured}))
        axis.set_xlabel('workers (one gunicorn master)')
        axis.grid(True, alpha=0.3)
        axis.set_ylim(bottom=0)
        axis.legend(fontsize=8)
    ax.set_ylabel('requests a second (median, min-max)')
    ax.set_title('Throughput against workers' + (' (ringed: shares a core with wrk/PostgreSQL)'
                                                  if any(r.get('shared_cpus') for r in measured) else ''), fontsize=9)
    ax_core.set_ylabel('requests a second per busy gateway core')
    ax_core.set_title('Per core', fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
