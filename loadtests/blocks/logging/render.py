"""The logging block's results.md: the closed-loop report (loadtests/blocks/oltp/render.py) with, first, what the
access log and the event stream cost: throughput and worker CPU against the baseline, access lines per call."""
from __future__ import annotations

from ...markdown import table
from ...stats import false_clear_chance, median_range, overlap, paired_ratios, show_paired, spread
from ..oltp.render import render as closed_loop
from . import BARE, NAMES, OFF, ON, THROUGHPUT_TARGET


def render(meta: dict, runs: list[dict]) -> str:
    return closed_loop(meta, runs, section(meta, runs))


def section(meta: dict, runs: list[dict]) -> list[str]:
    measured = [r for r in runs if r.get('kind') == 'run']
    rows, verdicts = [], []
    for c in sorted({r['connections'] for r in measured}, reverse=True):
        cells = {t: [r for r in measured if r['target'] == t and r['connections'] == c] for t in NAMES}
        rows += [[c, t, spread(cells[t], 'rps', 0), spread(cells[t], 'worker_cpu_us_per_call'),
                  spread(cells[t], 'access_lines_per_call', 3)] for t in NAMES if cells[t]]
        for other, what in ((ON, 'access log on'), (BARE, 'events off (and access log off)')):
            rps = median_range([r['rps'] for r in cells[other]]), median_range([r['rps'] for r in cells[OFF]])
            cpu = [median_range([r.get('worker_cpu_us_per_call') for r in cells[t]]) for t in (other, OFF)]
            if not (rps[0] and rps[1]):
                continue
            line = (f'- c={c}, {what} / access log off: req/s **{rps[0][0] / rps[1][0]:.3f}** (ratio of medians; '
                    f'ranges {"overlap" if overlap(*rps) else "clear"})')
            if cpu[0] and cpu[1]:
                line += f', worker CPU per call **{cpu[0][0] / cpu[1][0]:.3f}**'
            if other == ON:
                line += (f'. Target: the access log costs at most {(1 - THROUGHPUT_TARGET) * 100:.0f}% of throughput, '
                         'judged on the paired runs of each round: '
                         + show_paired(paired_ratios(cells[ON], cells[OFF], lambda r: r['rps']), goal=THROUGHPUT_TARGET))
            verdicts.append(line + '.')
        rounds = min((len(cells[t]) for t in (ON, OFF)), default=0)
        if rounds:
            verdicts.append(f'- With {rounds} round(s), equal targets look clear '
                            f'{false_clear_chance(rounds) * 100:.1f}% of the time.')
    return ['## Access log and events: what they cost', '',
            'Worker CPU per call: user + system CPU of the gunicorn worker (the master left out) over the calls '
            'served. Access lines per call: lines with a request id the target appended to its log file during the '
            'run, over the calls served (written a flush interval after the call, so a run\'s last calls may land in '
            'the next). Median [min-max] of the rounds.', '',
            *table(['Connections', 'Target', 'req/s', 'Worker CPU per call (µs)', 'Access lines per call'], rows),
            *verdicts, '']
