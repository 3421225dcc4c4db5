"""The limits block's cost sections, per mix: every target's numbers per round and their medians, the ratios to
limits-off paired per round, the Redis numbers on minus off, and a single caller's pooled p99, each judged on the
worst round against issue 26's goals (loadtests/blocks/limits/__init__.py)."""
from __future__ import annotations

from ...markdown import table
from ...stats import median_range, paired_ratios, pooled_percentile, show_paired, spread
from . import GOAL_CPU, GOAL_P99_MS, GOAL_REDIS_US, GOAL_ROUND_TRIPS, GOAL_RPS, OFF, QAG

LOAD_CONNECTIONS = 32
REDIS_FIELDS = (('redis_per_call', 'Redis commands', 3), ('redis_scripts_per_call', 'scripts (EVALSHA/EVAL)', 4),
                ('redis_reads_per_call', 'round trips (Redis reads)', 4), ('redis_cpu_us_per_call', 'Redis CPU µs', 2))
GOALS = {'redis_reads_per_call': GOAL_ROUND_TRIPS, 'redis_cpu_us_per_call': GOAL_REDIS_US}


def cells(runs: list[dict], mix: str, connections: int, targets: list[str]) -> dict[str, list[dict]]:
    """Each target's measured runs of one mix at one connection count, by round."""
    found = {t: [r for r in runs if r.get('kind') == 'run' and r.get('mix') == mix and r['target'] == t
                 and r['connections'] == connections] for t in targets}
    return {t: sorted(rs, key=lambda r: r.get('round') or 0) for t, rs in found.items() if rs}


def refused(run: dict) -> int:
    return (run.get('statuses') or {}).get('429', 0)


def paired_differences(top: list[dict], bottom: list[dict], field: str) -> dict[int, float]:
    """{round: top - bottom} of `field` for the rounds both have."""
    tops, bottoms = ({r.get('round'): r.get(field) for r in side} for side in (top, bottom))
    return {n: tops[n] - bottoms[n] for n in sorted(set(tops) & set(bottoms), key=lambda x: x or 0)
            if tops[n] is not None and bottoms[n] is not None}


def show_differences(diffs: dict[int, float], digits: int, goal: float | None) -> str:
    if not diffs:
        return '-'
    med, lo, hi = median_range(list(diffs.values()))
    text = f'{med:+,.{digits}f} [{lo:+,.{digits}f} to {hi:+,.{digits}f}]'
    if goal is not None:
        text += f'; worst {hi:+,.{digits}f}: {"meets" if hi <= goal else "misses"} <= {goal:g}'
    return text


def mix_section(runs: list[dict], mix: str, text: str, targets: list[str]) -> list[str]:
    load, single = cells(runs, mix, LOAD_CONNECTIONS, targets), cells(runs, mix, 1, targets)
    base = load.get(OFF)
    out = [f'## Mix `{mix}`: cost', '', f'{text}. wrk -c{LOAD_CONNECTIONS}; median [min-max] of the rounds. Round '
           'trips: Redis\'s own count of client reads (`total_reads_processed`): one per script, pipeline or plain '
           'command that arrives at once, whatever sends it.', '',
           *table(['Target', 'req/s', 'Worker CPU per call (µs)', *[f'{label} per call' for _, label, _ in REDIS_FIELDS],
                   '429s (all rounds)'],
                  [[t, spread(cell, 'rps', 0), spread(cell, 'worker_cpu_us_per_call'),
                    *[spread(cell, f, d) for f, _, d in REDIS_FIELDS],
                    f'{sum(refused(r) for r in cell):,} of {sum(r["requests"] for r in cell):,}']
                   for t, cell in load.items()]), 'Every round:', '',
           *table(['Target', 'Round', 'req/s', 'Worker CPU µs/call', *[label for _, label, _ in REDIS_FIELDS], '429s',
                   'Other cores'],
                  [[t, r.get('round'), f'{r["rps"]:,.0f}', f'{r.get("worker_cpu_us_per_call") or 0:,.1f}',
                    *['-' if r.get(f) is None else f'{r[f]:,.{d}f}' for f, _, d in REDIS_FIELDS], f'{refused(r):,}',
                    f'{r.get("other_cores", 0):.2f}'] for t, cell in load.items() for r in cell]),
           f'Paired per round against `{OFF}` (goals: worker CPU <= {GOAL_CPU:.2f}×, throughput >= '
           f'{GOAL_RPS:.2f}×, judged on the worst round):', '']
    if not base:
        out += ['No limits-off runs: no ratios.', '']
    else:
        out += [line for t, cell in load.items() if t != OFF for line in (
            f'- {t}: worker CPU per call / {OFF}: '
            + show_paired(paired_ratios(cell, base, lambda r: r.get('worker_cpu_us_per_call')), GOAL_CPU, at_most=True),
            f'- {t}: req/s / {OFF}: ' + show_paired(paired_ratios(cell, base, lambda r: r['rps']), GOAL_RPS))] + ['']
    out += [f'Redis per call, on minus off, paired per round (goals: <= {GOAL_ROUND_TRIPS:g} round trips, <= '
            f'{GOAL_REDIS_US:g} µs of Redis CPU; median [min to max], worst round judged). Our gateway\'s targets: '
            f'`{QAG}`\'s Redis holds its limits alone, so its numbers above are its whole cost.', '']
    if base:
        out += table(['Target', *[f'{label} per call, minus {OFF}' for _, label, _ in REDIS_FIELDS]],
                     [[t, *[show_differences(paired_differences(cell, base, f), d, GOALS.get(f))
                            for f, _, d in REDIS_FIELDS]] for t, cell in load.items() if t not in (OFF, QAG)])
    if single:
        out += [f'### Mix `{mix}`: a single caller (wrk -c1 -t1)', '',
                'Every call\'s latency of every round pooled (wrk\'s histogram, 1 µs buckets, as wrk corrects it for '
                'coordinated omission: the one its own percentiles come from), not a median of per-round '
                f'percentiles; goal: p99 at most {GOAL_P99_MS:g} ms above `{OFF}`.', '', *_single_caller(single)]
    return out


def _single_caller(by_target: dict[str, list[dict]]) -> list[str]:
    """p50/p99 of every call of every round at one connection, pooled, and p99 on minus off."""
    pooled = {t: [r.get('latency_hist') or [] for r in cell] for t, cell in by_target.items()}
    base = pooled_percentile(pooled.get(OFF, []), 99)
    rows = []
    for t, cell in by_target.items():
        p50, p99 = pooled_percentile(pooled[t], 50), pooled_percentile(pooled[t], 99)
        delta = '-' if t == OFF or base is None or p99 is None else \
            f'{(p99 - base) / 1000:+.3f}: {"meets" if (p99 - base) / 1000 <= GOAL_P99_MS else "misses"} ' \
            f'<= +{GOAL_P99_MS:g}'
        rows.append([t, f'{sum(c for hist in pooled[t] for _, c in hist):,}', _ms(p50), _ms(p99),
                     ', '.join(f'{r["latency_us"]["99"] / 1000:.2f}' for r in cell), delta])
    return table(['Target', 'calls', 'p50 (ms)', 'p99 (ms)', 'p99 per round (ms)', f'p99 minus {OFF} (ms)'], rows)


def _ms(us: float | None) -> str:
    return '-' if us is None else f'{us / 1000:.3f}'
