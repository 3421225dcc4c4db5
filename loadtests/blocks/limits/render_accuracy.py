"""The limits block's accuracy section: per target and multiple of the limit, what was admitted against an exact
token bucket on the same arrivals (the mix's: 20/s and its burst, full at the start) and against the design's
own rule, summed over the rounds, with the worst round (accuracy.py records, reference.py arithmetic)."""
from __future__ import annotations

from ...markdown import table
from ...stats import median_range


def groups(runs: list[dict], targets: list[str]) -> dict[tuple[str, float], list[dict]]:
    """The runs by (target, multiple), the targets in the block's order."""
    found: dict[tuple[str, float], list[dict]] = {}
    for r in runs:
        found.setdefault((r['target'], r['multiple']), []).append(r)
    rank = {t: n for n, t in enumerate(targets)}
    return dict(sorted(found.items(), key=lambda item: (rank.get(item[0][0], len(rank)), item[0][1])))


def _total(cell: list[dict], side: str, field: str) -> int:
    return sum(r[side][field] for r in cell)


def _ratio(cell: list[dict], side: str) -> str:
    """Admitted over exact in all rounds, and in the round farthest from 1 (either way)."""
    exact = _total(cell, side, 'exact')
    ratios = [r[side]['ratio'] for r in cell if r[side].get('ratio') is not None]
    worst = f'{max(ratios, key=lambda x: abs(x - 1)):.3f}' if ratios else '-'
    return f'{_total(cell, side, "admitted") / exact if exact else 0:.3f} ({worst})'


def _errors(cell: list[dict]) -> int:
    return sum(sum((r.get('errors') or {}).values()) + sum(v for k, v in r['statuses'].items() if k not in ('200', '429'))
               for r in cell)


def section(runs: list[dict], targets: list[str]) -> list[str]:
    found = [r for r in runs if r.get('kind') == 'accuracy']
    if not found:
        return []
    first, cells = found[0], groups(found, targets)
    rounds = median_range([len(c) for c in cells.values()])
    return ['## Accuracy at 1×, 2× and 10× the limit', '',
            f'Mix `{first["mix"]}`: {first["keys"]} of its hottest keys, each offered multiple × {first["rate"]} '
            f'calls a second for {first["duration_s"]:g} s, open loop (independent Poisson arrivals per key, '
            'loadtests/blocks/limits/drive.py), after an idle pause that refills every bucket; '
            f'{rounds[0] if rounds else 0:.0f} round(s). Exact: a token bucket of {first["rate"]}/s and burst '
            f'{first["burst"]}, full at the start, run offline on the recorded send times of the same calls '
            '(reference.py). Over-admitted: per key, admitted minus exact where positive; refused that exact '
            'admits, admitted that exact refuses: the same calls, one by one (a limiter that admits the same number '
            'at other moments has both). Calls answered neither 200 nor 429 are left out of both sides.', '',
            *table(['Target', 'Offered', 'Calls', 'Admitted', 'Exact', 'Admitted / exact (worst round)',
                    'Over-admitted', 'Refused that exact admits', 'Admitted that exact refuses',
                    'Most in 1 s, one key (exact)'],
                   [[target, f'{multiple:g}×', f'{sum(r["calls"] for r in cell):,}',
                     f'{_total(cell, "vs_mix", "admitted"):,}', f'{_total(cell, "vs_mix", "exact"):,}',
                     _ratio(cell, 'vs_mix'), *[f'{_total(cell, "vs_mix", f):,}' for f in ('over', 'missed', 'extra')],
                     f'{max(r["vs_mix"]["most_in_window"] for r in cell)} '
                     f'({max(r["vs_mix"]["exact_most_in_window"] for r in cell)})']
                    for (target, multiple), cell in cells.items()]),
            'Against each design\'s own rule (what it claims to enforce for these keys):', '',
            *table(['Target', 'Offered', 'Own rule', 'Admitted / own rule (worst round)', 'Over its rule',
                    'Refused that its rule admits', 'Send lag p99, worst (ms)', 'Errors'],
                   [[target, f'{multiple:g}×', cell[0]['own_rule'], _ratio(cell, 'vs_own'),
                     f'{_total(cell, "vs_own", "over"):,}', f'{_total(cell, "vs_own", "missed"):,}',
                     f'{max((r.get("lag_ms") or {}).get("p99") or 0 for r in cell):.2f}', f'{_errors(cell):,}']
                    for (target, multiple), cell in cells.items()])]
