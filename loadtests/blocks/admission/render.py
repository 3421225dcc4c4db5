"""The admission block's results.md: the closed-loop report (loadtests/blocks/oltp/render.py) with, first, what
admission costs: worker CPU and Redis commands per call, and the verdicts against the targets."""
from __future__ import annotations

from ...markdown import table
from ...stats import false_clear_chance, median_range, overlap, paired_ratios, show_paired, spread
from ..oltp.render import render as closed_loop
from . import CPU_TARGET, OFF, ON, REDIS_TARGET

REDIS_FIELDS = (('redis_per_call', 'every command'),
                ('redis_per_call_no_events', 'every command but the event stream\'s XADD'),
                ('redis_scripts_per_call', 'scripts (round trips of the admission and the bus)'))


def render(meta: dict, runs: list[dict]) -> str:
    return closed_loop(meta, runs, section(meta, runs))


def section(meta: dict, runs: list[dict]) -> list[str]:
    measured = [r for r in runs if r.get('kind') == 'run']
    rows, verdicts = [], []
    for c in sorted({r['connections'] for r in measured}, reverse=True):
        cells = {t: [r for r in measured if r['target'] == t and r['connections'] == c] for t in (ON, OFF)}
        for t, cell in cells.items():
            if cell:
                by_kind = sorted(cell, key=lambda r: r.get('redis_per_call') or 0)[len(cell) // 2]
                rows.append([c, t, spread(cell, 'rps', 0), spread(cell, 'worker_cpu_us_per_call'),
                             *[spread(cell, f, 4) for f, _ in REDIS_FIELDS],
                             ', '.join(f'{k} {v:,}' for k, v in by_kind.get('redis_by_command', {}).items()) or '-'])
        on, off = (median_range([r.get('worker_cpu_us_per_call') for r in cells[t]]) for t in (ON, OFF))
        if on and off:
            n = min(len(cells[ON]), len(cells[OFF]))
            verdicts.append(
                f'- c={c}: worker CPU per call on/off = **{on[0] / off[0]:.3f}** (ratio of medians; ranges '
                f'{"overlap" if overlap(on, off) else "clear"}; with {n} round(s) equal targets look clear '
                f'{false_clear_chance(n) * 100:.1f}% of the time); paired per round: '
                + show_paired(paired_ratios(cells[ON], cells[OFF], lambda r: r.get('worker_cpu_us_per_call')),
                              goal=CPU_TARGET, at_most=True) + '.')
        for field, what in REDIS_FIELDS:
            stat = median_range([r.get(field) for r in cells[ON]])
            if stat:
                verdicts.append(f'- c={c}, admission on, Redis {what}: **{stat[0]:.4f}** per call (median). '
                                f'Target < {REDIS_TARGET}: {"met" if stat[0] < REDIS_TARGET else "NOT met"}.')
    return ['## Admission: what it costs', '',
            'Worker CPU per call: user + system CPU of the gunicorn workers (the master left out) over the calls '
            'served. Redis commands per call: INFO commandstats before and after the run (less the INFO calls), '
            'over the calls served; they include the bus\' heartbeat (a script and a PING every 250 ms per worker). '
            'Median [min-max] of the rounds.', '',
            *table(['Connections', 'Target', 'req/s', 'Worker CPU per call (µs)', 'Redis commands per call',
                    'without the event stream (XADD)', 'scripts (EVALSHA) per call',
                    'Redis commands by kind (median run)'], rows), *verdicts, '']
