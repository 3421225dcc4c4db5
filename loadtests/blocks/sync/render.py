"""The sync block's results.md: the management call from start to return and the announce wait, per cell, the
median of the rounds' percentiles [min-max] and the percentiles of every change pooled."""
from __future__ import annotations

from ...markdown import environment, incomplete, notes, table
from ...stats import false_clear_chance, median_range, percentile, show

P99_TARGET_MS = 20.0


def render(meta: dict, runs: list[dict]) -> str:
    settings = meta.get('settings', {})
    measured = [r for r in runs if r.get('kind') == 'run']
    cells = settings.get('targets') or sorted({r['target'] for r in measured})
    by_cell = {c: [r for r in measured if r['target'] == c] for c in cells}
    rounds = max((len(mine) for mine in by_cell.values()), default=0)

    def medians(mine, field, points):
        return [show(median_range([r[field].get(p) for r in mine]), _fmt) for p in points]

    def pooled(mine, field):
        return [s for r in mine for s in r.get(field, [])]

    def calls_row(cell, mine):
        all_ = pooled(mine, 'samples_ms')
        p99 = percentile(all_, 99)
        return [cell, len(all_), *medians(mine, 'latency_ms', ('50', '90', '99', 'max')), _fmt(percentile(all_, 50)),
                _fmt(p99), _fmt(max(all_) if all_ else None),
                '-' if p99 is None else ('met' if p99 < P99_TARGET_MS else 'NOT met')]

    def announce_row(cell, mine):
        all_ = pooled(mine, 'announce_samples_ms')
        return [cell, len(all_), *medians(mine, 'announce_ms', ('50', '99', 'max')), _fmt(percentile(all_, 50)),
                _fmt(percentile(all_, 99))]

    out = [f'# Block `sync`: {meta.get("started_at", "?")}', '', *incomplete(meta),
           f'- Method: {rounds} round(s) per cell; {settings.get("order_note", "")}; per run '
           f'{settings.get("changes", "?")} management changes one after the other on one keep-alive connection, '
           f'{settings.get("pause_ms", "?")} ms apart, each timed on the client from sending the request to reading '
           f'the whole answer; {settings.get("workers", "?")} workers; c=N: a background wrk -cN on /q/account '
           'during the changes, c=0: the fleet idle.',
           f'- Rule: a difference counts only when the ranges do not overlap; with {rounds} round(s) equal '
           f'cells look clear {false_clear_chance(rounds) * 100:.1f}% of the time.',
           f'- Pinning: {settings.get("pinning_note", "?")}', '', *notes(meta),
           '## Management call, start to return (ms)', '',
           'Per run percentiles (nearest rank); median of the rounds [min-max]. "All" pools every change of every '
           f'round. Target: p99 < {P99_TARGET_MS:.0f} ms.', '',
           *table(['Cell', 'Changes', 'p50', 'p90', 'p99', 'max', 'All: p50', 'All: p99', 'All: max',
                   f'p99 < {P99_TARGET_MS:.0f} ms'], [calls_row(c, mine) for c, mine in by_cell.items()]),
           '## Announce: PUBLISH to the last worker\'s acknowledgement (ms)', '',
           'From Redis MONITOR timestamps (server clock): per published generation, the latest of each worker\'s '
           'first acknowledgement of it (or of a later generation). Part of the call above.', '',
           *table(['Cell', 'Generations', 'p50', 'p99', 'max', 'All: p50', 'All: p99'],
                  [announce_row(c, mine) for c, mine in by_cell.items()]),
           '## Runs with problems', '',
           *([f'- round {r.get("round")} {r["target"]}: {"; ".join(r["problems"])}'
              for r in runs if not r.get('ok', True)]
             or ['None: every change answered 2xx and every background load ran without errors.']), '',
           '## Every run', '',
           'Gateway cores: CPU of the master and its workers during the changes; machine cores: the whole machine\'s '
           'busy CPU (/proc/stat) - well above the gateway\'s, wrk\'s and PostgreSQL\'s share means other processes '
           'shared the machine.', '',
           *table(['Round', 'Pos', 'Cell', 'Changes', 'p50 ms', 'p99 ms', 'max ms', 'Announce p50', 'Announce p99',
                   'Background req/s', 'Gateway cores', 'Machine cores', 'Started'],
                  [[r['round'], r['position'], r['target'], r['changes'],
                    *[_fmt(r['latency_ms'].get(p)) for p in ('50', '99', 'max')],
                    *[_fmt(r['announce_ms'].get(p)) for p in ('50', '99')], r.get('background', {}).get('rps', '-'),
                    r.get('gateway_cores', '-'), r.get('machine_cores', '-'), r.get('started_at', '')[11:19]]
                   for r in measured])]
    return '\n'.join(out + environment(meta)) + '\n'


def _fmt(value) -> str:
    return '-' if value is None else f'{value:.2f}'
