"""The report of a closed-loop (wrk) block: requests a second, latency, CPU, the /health floor, the runs with errors
and every run, each cell the median of its rounds [min-max] (loadtests/stats.py). The oltp block's results.md; the
admission, logging, cache and limits blocks put sections of their own first (``section``)."""
from __future__ import annotations

from ...markdown import environment, incomplete, notes, num, table
from ...stats import (
    NOISY_CORES,
    Cell,
    cpu_per_call,
    false_clear_chance,
    fmt_ms,
    fmt_rps,
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

LATENCY_NOTE = ('From wrk\'s own histogram, printed exactly by the Lua done() hook. Closed loop: at saturation this '
                'under-reports latency (coordinated omission) - latency against an offered rate needs an open-loop, '
                'latency-corrected generator (oha `-q R --latency-correction`), not available here.')
CPU_NOTE = ('CPU seconds from /proc (utime + stime of the target\'s gunicorn master and its workers, every thread), '
            'per completed call and as cores busy during the run. PostgreSQL: the postmaster and its backends. '
            'wrk: its own rusage. Other: the whole machine\'s busy CPU (/proc/stat) less those three - other '
            'processes; above 0.1 core the run shared the machine with something.')


def render(meta: dict, runs: list[dict], section: list[str] = ()) -> str:
    settings = meta.get('settings', {})
    measured = [r for r in runs if r.get('kind') == 'run']
    targets = [t['name'] for t in meta.get('targets', [])] or sorted({r['target'] for r in measured})
    conns = settings.get('connections') or sorted({r['connections'] for r in measured}, reverse=True)
    base = settings.get('baseline') if settings.get('baseline') in targets else None
    others = [t for t in targets if t != base] if base else []
    cells = {(t, c): Cell([r for r in measured if r['target'] == t and r['connections'] == c])
             for t in targets for c in conns}
    rounds = max((len(cell.runs) for cell in cells.values()), default=0)
    by_cell = [(c, t, cells[t, c]) for c in conns for t in targets]
    out = [f'# Block `{meta.get("block", runs[0]["block"] if runs else "?")}`: {meta.get("started_at", "?")}', '',
           *_intro(meta, settings, rounds, base), *section,
           '## Requests a second', '', f'Closed loop (wrk), {num(settings.get("duration_s", "?"))} s per run, median '
           f'of {rounds} round(s) [min-max].', '']
    out += table(['Connections', *targets, *[f'{o} / {base}' for o in others],
                  *[f'{o} / {base}, paired per round' for o in others]],
                 [[c, *[show(cells[t, c].stat(rps), fmt_rps) + _warn(cells[t, c]) for t in targets],
                   *[_ratio(cells[o, c].stat(rps), cells[base, c].stat(rps)) for o in others],
                   *[show_paired(paired_ratios(cells[o, c].runs, cells[base, c].runs, rps)) for o in others]]
                  for c in conns])
    out += ['## Latency (ms)', '', LATENCY_NOTE, '']
    out += table(['Connections', 'Target', 'p50', 'p90', 'p99', 'p99.9'],
                 [[c, t, *[show(cell.stat(pct(p)), fmt_ms) for p in ('50', '90', '99', '99.9')]]
                  for c, t, cell in by_cell])
    if others:
        out += ['p50 against the baseline (ratio of medians; "clear" only when the ranges do not overlap):', '']
        out += table(['Connections', *[f'{o} / {base} p50' for o in others]],
                     [[c, *[_ratio(cells[o, c].stat(pct('50')), cells[base, c].stat(pct('50'))) for o in others]]
                      for c in conns])
    out += ['## CPU', '', CPU_NOTE, '']
    out += table(['Connections', 'Target', 'Target CPU per call (µs)', 'Target cores', 'PostgreSQL cores',
                  'wrk cores', 'Other cores'],
                 [[c, t, *[show(cell.stat(f)) for f in (cpu_per_call, target_cores, pg_cores, wrk_cores,
                                                         other_cores)]] for c, t, cell in by_cell])
    noisy = [r for r in runs if (r.get('other_cores') or 0) > NOISY_CORES]
    if noisy:
        out += [f'**{len(noisy)} of {len(runs)} runs shared the machine with other processes** (over '
                f'{NOISY_CORES} core, up to {max(r["other_cores"] for r in noisy):.2f}): their numbers are '
                'suspect; run the block again on a quiet machine.', '']
    out += ['## /health floor', '', 'wrk on /health, before and after the block, the same work every time: a machine '
            'that changed speed during the block shows up here.', '']
    out += table(['Target', 'Connections', 'Before req/s', 'After req/s', 'Change', 'Errors'],
                 filter(None, (_floor_row(t, [r for r in runs if r.get('kind') == 'floor' and r['target'] == t])
                               for t in targets)))
    out += ['## Runs with errors', ''] + _flagged([r for r in runs if not r.get('ok', True)])
    out += ['## Every run', '']
    out += table(['Round', 'Pos', 'Target', 'Conns', 'req/s', 'p50 ms', 'p99 ms', 'CPU µs/call', 'Target cores',
                  'Other cores', 'Errors', 'Started'],
                 [[r['round'], r['position'], r['target'], r['connections'], fmt_rps(r['rps']),
                   fmt_ms(r['latency_us']['50'] / 1000), fmt_ms(r['latency_us']['99'] / 1000),
                   '-' if r.get('cpu_us_per_call') is None else f'{r["cpu_us_per_call"]:,.0f}',
                   '-' if r.get('target_cores') is None else f'{r["target_cores"]:.2f}',
                   f'{r.get("other_cores", 0):.2f}', sum(r['errors'].values()), r.get('started_at', '')[11:19]]
                  for r in measured])
    return '\n'.join(out + environment(meta)) + '\n'


def _intro(meta, settings, rounds, baseline) -> list[str]:
    out = incomplete(meta)
    order = settings.get('order_note', 'targets take turns in an order rotated each round')
    out += [f'- Method: {rounds} round(s) per cell; {order}; wrk `-t1 -c N -d {num(settings.get("duration_s"))}s '
            f'--latency`, closed loop, random keys 1..{settings.get("max_id", 0):,} on each request; a '
            f'{num(settings.get("warmup_s"))} s warm-up per target at {settings.get("warmup_connections", "?")} '
            f'connections before the block; a {num(settings.get("floor_s"))} s /health floor at '
            f'{settings.get("floor_connections", "?")} connections on every target before and after.',
            f'- Rule: a difference counts only when the two ranges do not overlap. With {rounds} round(s), two '
            f'equal targets get clear ranges by chance {false_clear_chance(rounds) * 100:.1f}% of the time'
            + (' - too often to call anything real; use 5 rounds.' if rounds < 5 else '.'),
            f'- Baseline for the ratios: `{baseline}`.' if baseline else
            settings.get('baseline_note', '- One target: no comparison.'),
            f'- Pinning: {settings.get("pinning_note", "?")}', '']
    return out + notes(meta)


def _floor_row(target: str, floors: list[dict]) -> list | None:
    before = [r for r in floors if r.get('phase') == 'before']
    after = [r for r in floors if r.get('phase') == 'after']
    if not floors or not (before or after):
        return None
    b, a = before[-1]['rps'] if before else None, after[-1]['rps'] if after else None
    return [target, (before or after)[-1]['connections'], fmt_rps(b) if b else '-', fmt_rps(a) if a else '-',
            f'{(a / b - 1) * 100:+.1f}%' if a and b else '-', sum(sum(r['errors'].values()) for r in before + after)]


def _flagged(flagged: list[dict]) -> list[str]:
    if not flagged:
        return ['None: every request of every run answered 2xx, with no socket error or timeout.', '']
    return ['These runs are still in the medians above (their cells carry ⚠); a cell with one is not a fair '
            'comparison - find the cause (the target logs are beside this file) and run the block again.', '',
            *table(['Kind', 'Round', 'Target', 'Connections', 'Requests', 'Problems'],
                   [[r['kind'], r.get('round', '-'), r['target'], r['connections'], f'{r["requests"]:,}',
                     '; '.join(r.get('problems', []))] for r in flagged])]


def _warn(cell: Cell) -> str:
    return f' ⚠{cell.flagged}' if cell.flagged else ''


def _ratio(ours, base) -> str:
    if not ours or not base or not base[0]:
        return '-'
    return f'{ours[0] / base[0]:.2f}× ({"overlap" if overlap(ours, base) else "clear"})'
