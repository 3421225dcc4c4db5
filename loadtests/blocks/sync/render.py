"""The sync block's results.md: the management call from start to return and the announce wait, per cell, the
median of the rounds' percentiles [min-max] and the percentiles of every change pooled."""
from __future__ import annotations

from pathlib import Path

from ... import rundir
from ...markdown import environment, table_head
from ...stats import false_clear_chance, median_range, percentile, show

P99_TARGET_MS = 20.0


def write(run_dir: Path) -> Path:
    return rundir.write_report(run_dir, render)


def render(meta: dict, runs: list[dict]) -> str:
    settings = meta.get('settings', {})
    measured = [r for r in runs if r.get('kind') == 'run']
    cells = settings.get('targets') or sorted({r['target'] for r in measured})
    rounds_done = max((sum(1 for r in measured if r['target'] == c) for c in cells), default=0)
    out = [f'# Block `sync`: {meta.get("started_at", "?")}', '']
    if meta.get('finished_at') is None:
        out += ['**Incomplete: the block did not finish** (interrupted or failed); the numbers below are what it '
                'recorded.', '']
    out += [f'- Method: {rounds_done} round(s) per cell; {settings.get("order_note", "")}; per run '
            f'{settings.get("changes", "?")} management changes one after the other on one keep-alive connection, '
            f'{settings.get("pause_ms", "?")} ms apart, each timed on the client from sending the request to reading '
            f'the whole answer; {settings.get("workers", "?")} workers; c=N: a background wrk -cN on /q/account '
            'during the changes, c=0: the fleet idle.',
            f'- Rule: a difference counts only when the ranges do not overlap; with {rounds_done} round(s) equal '
            f'cells look clear {false_clear_chance(rounds_done) * 100:.1f}% of the time.',
            f'- Pinning: {settings.get("pinning_note", "?")}', '']
    if meta.get('notes'):
        out += ['Notes:', ''] + [f'- {n}' for n in meta['notes']] + ['']

    out += ['## Management call, start to return (ms)', '',
            'Per run percentiles (nearest rank); median of the rounds [min-max]. "All" pools every change of every '
            f'round. Target: p99 < {P99_TARGET_MS:.0f} ms.', '']
    out += table_head(['Cell', 'Changes', 'p50', 'p90', 'p99', 'max', 'All: p50', 'All: p99', 'All: max',
                        f'p99 < {P99_TARGET_MS:.0f} ms'])
    for cell in cells:
        mine = [r for r in measured if r['target'] == cell]
        pooled = [s for r in mine for s in r.get('samples_ms', [])]
        p99 = percentile(pooled, 99)
        out.append(f'| {cell} | {len(pooled)} | ' + ' | '.join(
            show(median_range([r['latency_ms'].get(p) for r in mine]), _fmt) for p in ('50', '90', '99', 'max')) +
            f' | {_fmt(percentile(pooled, 50))} | {_fmt(p99)} | {_fmt(max(pooled) if pooled else None)} | '
            f'{"-" if p99 is None else ("met" if p99 < P99_TARGET_MS else "NOT met")} |')
    out.append('')

    out += ['## Announce: PUBLISH to the last worker\'s acknowledgement (ms)', '',
            'From Redis MONITOR timestamps (server clock): per published generation, the latest of each worker\'s '
            'first acknowledgement of it (or of a later generation). Part of the call above.', '']
    out += table_head(['Cell', 'Generations', 'p50', 'p99', 'max', 'All: p50', 'All: p99'])
    for cell in cells:
        mine = [r for r in measured if r['target'] == cell]
        pooled = [s for r in mine for s in r.get('announce_samples_ms', [])]
        out.append(f'| {cell} | {len(pooled)} | ' + ' | '.join(
            show(median_range([r['announce_ms'].get(p) for r in mine]), _fmt) for p in ('50', '99', 'max')) +
            f' | {_fmt(percentile(pooled, 50))} | {_fmt(percentile(pooled, 99))} |')
    out.append('')

    flagged = [r for r in runs if not r.get('ok', True)]
    out += ['## Runs with problems', '']
    out += [f'- round {r.get("round")} {r["target"]}: {"; ".join(r["problems"])}' for r in flagged] or \
        ['None: every change answered 2xx and every background load ran without errors.']
    out.append('')
    out += ['## Every run', '']
    out += ['Gateway cores: CPU of the master and its workers during the changes; machine cores: the whole machine\'s '
            'busy CPU (/proc/stat) - well above the gateway\'s, wrk\'s and PostgreSQL\'s share means other processes '
            'shared the machine.', '']
    out += table_head(['Round', 'Pos', 'Cell', 'Changes', 'p50 ms', 'p99 ms', 'max ms', 'Announce p50', 'Announce p99',
                        'Background req/s', 'Gateway cores', 'Machine cores', 'Started'])
    for r in measured:
        lat, ann = r['latency_ms'], r['announce_ms']
        out.append(f'| {r["round"]} | {r["position"]} | {r["target"]} | {r["changes"]} | {_fmt(lat.get("50"))} | '
                   f'{_fmt(lat.get("99"))} | {_fmt(lat.get("max"))} | {_fmt(ann.get("50"))} | {_fmt(ann.get("99"))} | '
                   f'{r.get("background", {}).get("rps", "-")} | {r.get("gateway_cores", "-")} | '
                   f'{r.get("machine_cores", "-")} | {r.get("started_at", "")[11:19]} |')
    out.append('')
    out += environment(meta)
    return '\n'.join(out) + '\n'


def _fmt(value) -> str:
    return '-' if value is None else f'{value:.2f}'
