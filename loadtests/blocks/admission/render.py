"""The admission block's results.md: the closed-loop report (loadtests/blocks/oltp/render.py) with, first, what
admission costs: worker CPU and Redis commands per call, and the verdicts against the targets."""
from __future__ import annotations

from pathlib import Path

from ... import rundir
from ...stats import false_clear_chance, median_range, overlap, paired_ratios, show_paired, show_range
from ..oltp.render import render as closed_loop
from . import CPU_TARGET, OFF, ON, REDIS_TARGET


def write(run_dir: Path) -> Path:
    return rundir.write_report(run_dir, render)


def render(meta: dict, runs: list[dict]) -> str:
    return closed_loop(meta, runs, section(meta, runs))


def section(meta: dict, runs: list[dict]) -> list[str]:
    measured = [r for r in runs if r.get('kind') == 'run']
    out = ['## Admission: what it costs', '',
           'Worker CPU per call: user + system CPU of the gunicorn workers (the master left out) over the calls '
           'served. Redis commands per call: INFO commandstats before and after the run (less the INFO calls), over '
           'the calls served; they include the bus\' heartbeat (a script and a PING every 250 ms per worker). '
           'Median [min-max] of the rounds.', '']
    connections = sorted({r['connections'] for r in measured}, reverse=True)
    out += ['| Connections | Target | req/s | Worker CPU per call (µs) | Redis commands per call | '
            'without the event stream (XADD) | scripts (EVALSHA) per call | Redis commands by kind (median run) |',
            '|---|---|---|---|---|---|---|---|']
    verdicts = []
    for c in connections:
        cells = {t: [r for r in measured if r['target'] == t and r['connections'] == c] for t in (ON, OFF)}
        for t, cell in cells.items():
            if not cell:
                continue
            by_kind = sorted(cell, key=lambda r: r.get('redis_per_call') or 0)[len(cell) // 2].get('redis_by_command', {})
            out.append(f'| {c} | {t} | {show_range(median_range([r["rps"] for r in cell]), 0)} | '
                       f'{show_range(median_range([r.get("worker_cpu_us_per_call") for r in cell]))} | '
                       f'{show_range(median_range([r.get("redis_per_call") for r in cell]), 4)} | '
                       f'{show_range(median_range([r.get("redis_per_call_no_events") for r in cell]), 4)} | '
                       f'{show_range(median_range([r.get("redis_scripts_per_call") for r in cell]), 4)} | '
                       f'{", ".join(f"{k} {v:,}" for k, v in by_kind.items()) or "-"} |')
        on = median_range([r.get('worker_cpu_us_per_call') for r in cells[ON]])
        off = median_range([r.get('worker_cpu_us_per_call') for r in cells[OFF]])
        if on and off:
            ratio = on[0] / off[0]
            rounds = min(len(cells[ON]), len(cells[OFF]))
            verdicts.append(
                f'- c={c}: worker CPU per call on/off = **{ratio:.3f}** (ratio of medians; ranges '
                f'{"overlap" if overlap(on, off) else "clear"}; with {rounds} round(s) equal targets look clear '
                f'{false_clear_chance(rounds) * 100:.1f}% of the time); paired per round: '
                + show_paired(paired_ratios(cells[ON], cells[OFF], lambda r: r.get('worker_cpu_us_per_call')),
                              goal=CPU_TARGET, at_most=True) + '.')
        for field, what in (('redis_per_call', 'every command'),
                            ('redis_per_call_no_events', 'every command but the event stream\'s XADD'),
                            ('redis_scripts_per_call', 'scripts (round trips of the admission and the bus)')):
            stat = median_range([r.get(field) for r in cells[ON]])
            if stat:
                verdicts.append(f'- c={c}, admission on, Redis {what}: **{stat[0]:.4f}** per call (median). '
                                f'Target < {REDIS_TARGET}: {"met" if stat[0] < REDIS_TARGET else "NOT met"}.')
    out += [''] + verdicts + ['']
    return out
