"""The report of a closed-loop (wrk) block: requests a second, latency, CPU, the /health floor, the runs with errors
and every run, each cell the median of its rounds [min-max] (loadtests/stats.py). The oltp block's results.md; the
admission and logging blocks put a section of their own first (``section``)."""
from __future__ import annotations

from pathlib import Path

from ... import rundir
from ...markdown import environment, num, table_head
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


def write(run_dir: Path) -> Path:
    return rundir.write_report(run_dir, render)


def render(meta: dict, runs: list[dict], section: list[str] = ()) -> str:
    settings = meta.get('settings', {})
    block = meta.get('block', runs[0]['block'] if runs else '?')
    measured = [r for r in runs if r.get('kind') == 'run']
    floors = [r for r in runs if r.get('kind') == 'floor']
    targets = [t['name'] for t in meta.get('targets', [])] or sorted({r['target'] for r in measured})
    connections = settings.get('connections') or sorted({r['connections'] for r in measured}, reverse=True)
    baseline = settings.get('baseline') if settings.get('baseline') in targets else None
    others = [t for t in targets if t != baseline]
    cells = {(t, c): Cell([r for r in measured if r['target'] == t and r['connections'] == c])
             for t in targets for c in connections}
    rounds_done = max((len(cell.runs) for cell in cells.values()), default=0)

    out = [f'# Block `{block}`: {meta.get("started_at", "?")}', '']
    duration = num(settings.get('duration_s', '?'))
    out += _intro(meta, settings, rounds_done, baseline)
    out += list(section)

    # -- throughput
    out += ['## Requests a second', '',
            f'Closed loop (wrk), {duration} s per run, median of {rounds_done} round(s) '
            '[min-max].', '']
    header = ['Connections', *targets]
    if baseline and others:
        header += [f'{o} / {baseline}' for o in others] + [f'{o} / {baseline}, paired per round' for o in others]
    out += table_head(header)
    for c in connections:
        row = [str(c)] + [show(cells[t, c].stat(rps), fmt_rps) + _warn(cells[t, c]) for t in targets]
        for o in (others if baseline else []):
            row.append(_ratio(cells[o, c].stat(rps), cells[baseline, c].stat(rps)))
        for o in (others if baseline else []):
            row.append(show_paired(paired_ratios(cells[o, c].runs, cells[baseline, c].runs, rps)))
        out.append('| ' + ' | '.join(row) + ' |')
    out.append('')

    # -- latency
    out += ['## Latency (ms)', '',
            'From wrk\'s own histogram, printed exactly by the Lua done() hook. Closed loop: at saturation this '
            'under-reports latency (coordinated omission) - latency against an offered rate needs an open-loop, '
            'latency-corrected generator (oha `-q R --latency-correction`), not available here.', '']
    out += table_head(['Connections', 'Target', 'p50', 'p90', 'p99', 'p99.9'])
    for c in connections:
        for t in targets:
            cell = cells[t, c]
            out.append(f'| {c} | {t} | ' + ' | '.join(show(cell.stat(pct(p)), fmt_ms) for p in
                                                      ('50', '90', '99', '99.9')) + ' |')
    out.append('')
    if baseline and others:
        out += ['p50 against the baseline (ratio of medians; "clear" only when the ranges do not overlap):', '']
        out += table_head(['Connections', *[f'{o} / {baseline} p50' for o in others]])
        for c in connections:
            out.append(f'| {c} | ' + ' | '.join(_ratio(cells[o, c].stat(pct('50')),
                                                       cells[baseline, c].stat(pct('50'))) for o in others) + ' |')
        out.append('')

    # -- CPU
    out += ['## CPU', '',
            'CPU seconds from /proc (utime + stime of the target\'s gunicorn master and its workers, every thread), '
            'per completed call and as cores busy during the run. PostgreSQL: the postmaster and its backends. '
            'wrk: its own rusage. Other: the whole machine\'s busy CPU (/proc/stat) less those three - other '
            'processes; above 0.1 core the run shared the machine with something.', '']
    out += table_head(['Connections', 'Target', 'Target CPU per call (µs)', 'Target cores', 'PostgreSQL cores',
                       'wrk cores', 'Other cores'])
    for c in connections:
        for t in targets:
            cell = cells[t, c]
            out.append(f'| {c} | {t} | {show(cell.stat(cpu_per_call))} | {show(cell.stat(target_cores))} | '
                       f'{show(cell.stat(pg_cores))} | {show(cell.stat(wrk_cores))} | '
                       f'{show(cell.stat(other_cores))} |')
    out.append('')
    noisy = [r for r in runs if (r.get('other_cores') or 0) > NOISY_CORES]
    if noisy:
        out += [f'**{len(noisy)} of {len(runs)} runs shared the machine with other processes** (over '
                f'{NOISY_CORES} core, up to {max(r["other_cores"] for r in noisy):.2f}): their numbers are '
                'suspect; run the block again on a quiet machine.', '']

    # -- floor
    out += ['## /health floor', '',
            'wrk on /health, before and after the block, the same work every time: a machine that changed speed '
            'during the block shows up here.', '']
    out += table_head(['Target', 'Connections', 'Before req/s', 'After req/s', 'Change', 'Errors'])
    for t in targets:
        before = [r for r in floors if r['target'] == t and r.get('phase') == 'before']
        after = [r for r in floors if r['target'] == t and r.get('phase') == 'after']
        if not before and not after:
            continue
        b = before[-1]['rps'] if before else None
        a = after[-1]['rps'] if after else None
        change = f'{(a / b - 1) * 100:+.1f}%' if a and b else '-'
        errs = sum(sum(r['errors'].values()) for r in before + after)
        conns = (before or after)[-1]['connections']
        out.append(f'| {t} | {conns} | {fmt_rps(b) if b else "-"} | {fmt_rps(a) if a else "-"} | {change} | '
                   f'{errs} |')
    out.append('')

    # -- flagged
    flagged = [r for r in runs if not r.get('ok', True)]
    out += ['## Runs with errors', '']
    if flagged:
        out += ['These runs are still in the medians above (their cells carry ⚠); a cell with one is not a fair '
                'comparison - find the cause (the target logs are beside this file) and run the block again.', '']
        out += table_head(['Kind', 'Round', 'Target', 'Connections', 'Requests', 'Problems'])
        for r in flagged:
            out.append(f'| {r["kind"]} | {r.get("round", "-")} | {r["target"]} | {r["connections"]} | '
                       f'{r["requests"]:,} | {"; ".join(r.get("problems", []))} |')
    else:
        out.append('None: every request of every run answered 2xx, with no socket error or timeout.')
    out.append('')

    # -- every run
    out += ['## Every run', '']
    out += table_head(['Round', 'Pos', 'Target', 'Conns', 'req/s', 'p50 ms', 'p99 ms', 'CPU µs/call',
                       'Target cores', 'Other cores', 'Errors', 'Started'])
    for r in measured:
        cpu = r.get('cpu_us_per_call')
        cores = r.get('target_cores')
        out.append(f'| {r["round"]} | {r["position"]} | {r["target"]} | {r["connections"]} | {fmt_rps(r["rps"])} | '
                   f'{fmt_ms(r["latency_us"]["50"] / 1000)} | {fmt_ms(r["latency_us"]["99"] / 1000)} | '
                   f'{"-" if cpu is None else f"{cpu:,.0f}"} | {"-" if cores is None else f"{cores:.2f}"} | '
                   f'{r.get("other_cores", 0):.2f} | '
                   f'{sum(r["errors"].values())} | {r.get("started_at", "")[11:19]} |')
    out.append('')
    out += environment(meta)
    return '\n'.join(out) + '\n'


def _intro(meta, settings, rounds_done, baseline) -> list[str]:
    out = []
    if meta.get('finished_at') is None:
        out += ['**Incomplete: the block did not finish** (interrupted or failed); the numbers below are what it '
                'recorded.', '']
    order = settings.get('order_note', 'targets take turns in an order rotated each round')
    out += [f'- Method: {rounds_done} round(s) per cell; {order}; wrk `-t1 -c N -d {num(settings.get("duration_s"))}s '
            f'--latency`, closed loop, random keys 1..{settings.get("max_id", 0):,} on each request; a '
            f'{num(settings.get("warmup_s"))} s warm-up per target at {settings.get("warmup_connections", "?")} '
            f'connections before the block; a {num(settings.get("floor_s"))} s /health floor at '
            f'{settings.get("floor_connections", "?")} connections on every target before and after.',
            f'- Rule: a difference counts only when the two ranges do not overlap. With {rounds_done} round(s), two '
            f'equal targets get clear ranges by chance {false_clear_chance(rounds_done) * 100:.1f}% of the time'
            + (' - too often to call anything real; use 5 rounds.' if rounds_done < 5 else '.'),
            f'- Baseline for the ratios: `{baseline}`.' if baseline else
            settings.get('baseline_note', '- One target: no comparison.'),
            f'- Pinning: {settings.get("pinning_note", "?")}', '']
    if meta.get('notes'):
        out += ['Notes:', ''] + [f'- {n}' for n in meta['notes']] + ['']
    return out


def _warn(cell: Cell) -> str:
    return f' ⚠{cell.flagged}' if cell.flagged else ''


def _ratio(ours, base) -> str:
    if not ours or not base or not base[0]:
        return '-'
    verdict = 'overlap' if overlap(ours, base) else 'clear'
    return f'{ours[0] / base[0]:.2f}× ({verdict})'
