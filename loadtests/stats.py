"""The numbers every block's report shows, in one place: medians with their [min-max] range, the rule by which two
ranges count as different, percentiles, the cells of a closed-loop block and the formats of the tables.

Every cell is the median of its rounds with the [min-max] range. A difference between two targets counts only when
their ranges don't overlap: if two targets were really the same, all orderings of their 2n results would be equally
likely and the ranges would be clear of each other in 2 of C(2n, n) - under 1% for 5 rounds, 33% for 2.

Standard library only, and no other module of the harness: everything else may import it.
"""
from __future__ import annotations

import math
import statistics

NOISY_CORES = 0.10  # CPU of other processes during a run above which the progress line and the reports point it out


# --------------------------------------------------------------------------------------
# Medians, ranges and the rule
# --------------------------------------------------------------------------------------

def median_range(values):
    """(median, min, max) of the values that are not None; None when there are none."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


def overlap(a, b) -> bool:
    """Whether two (median, min, max) ranges overlap: a difference counts only when they don't."""
    return not (a[2] < b[1] or b[2] < a[1])


def false_clear_chance(n: int) -> float:
    """How often two targets that are really the same get clear ranges with n rounds each: 2 / C(2n, n)."""
    return 2 / math.comb(2 * n, n) if n > 0 else 1.0


def paired_ratios(top: list[dict], bottom: list[dict], value, scale: float = 1.0) -> dict[int, float]:
    """{round: value(top run) / (scale x value(bottom run))} for the rounds both have: a ratio of two runs of one
    round, which ran minutes apart at most, cancels what drifts between rounds (a noisy neighbour, a warm cache)."""
    tops = {r.get('round'): value(r) for r in top}
    bottoms = {r.get('round'): value(r) for r in bottom}
    return {n: tops[n] / (scale * bottoms[n]) for n in sorted(set(tops) & set(bottoms), key=lambda x: x or 0)
            if tops[n] is not None and bottoms[n]}


def show_paired(ratios: dict[int, float], goal: float | None = None, percent: bool = False,
                at_most: bool = False) -> str:
    """'median [min-max] over n rounds' of paired per-round ratios, and, with a goal, the verdict on the worst
    round: a target is met only when every round meets it. The goal is a floor (the lowest ratio is the worst
    round), or with `at_most` a ceiling (the highest is)."""
    if not ratios:
        return '-'
    med, lo, hi = median_range(list(ratios.values()))

    def fmt(v: float) -> str:
        return f'{v * 100:.0f}%' if percent else f'{v:.2f}×'
    text = f'{fmt(med)} [{fmt(lo)}-{fmt(hi)}], {len(ratios)} round(s)'
    if goal is not None:
        worst, met = (hi, hi <= goal) if at_most else (lo, lo >= goal)
        text += f'; worst round {fmt(worst)}: {"meets" if met else "misses"} {"<=" if at_most else ">="} {fmt(goal)}'
    return text


def percentile(samples, q: float):
    """Nearest-rank percentile of `samples` (q in 0..100); None when there are none."""
    if not samples:
        return None
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def pooled_percentile(histograms: list[list], q: float) -> float | None:
    """Percentile (q in 0..100) of several runs' latencies pooled into one distribution, each run given as wrk's
    histogram [[value, count], ...] (wrk.histogram): the p99 of every call of every round, not a median of the
    rounds' p99s. wrk's own rank (stats_percentile: round(q/100 x n + 0.5)), so one run's pooled p99 is the p99
    wrk printed for it. None when there are none."""
    counts: dict[float, int] = {}
    for hist in histograms:
        for value, count in hist:
            counts[value] = counts.get(value, 0) + int(count)
    total = sum(counts.values())
    if not total:
        return None
    rank = math.floor(q / 100 * total) + 1     # C's round(x + 0.5), x >= 0
    seen = 0
    for value in sorted(counts):
        seen += counts[value]
        if seen >= rank:
            return value
    return max(counts)   # q = 100


def summary(samples) -> dict:
    """n, mean, p50/p90/p99 (nearest rank) and max of `samples`; {} when there are none."""
    if not samples:
        return {}
    return {'n': len(samples), 'mean': round(statistics.fmean(samples), 3),
            **{p: round(percentile(samples, float(p)), 3) for p in ('50', '90', '99')},
            'max': round(max(samples), 3)}


# --------------------------------------------------------------------------------------
# The cells of a closed-loop (wrk) block and what is read from each run
# --------------------------------------------------------------------------------------

class Cell:
    """The rounds of one target at one setting."""

    def __init__(self, runs: list[dict]):
        self.runs = runs

    def values(self, getter) -> list[float]:
        out = []
        for run in self.runs:
            try:
                value = getter(run)
            except (KeyError, TypeError):
                value = None
            if value is not None:
                out.append(float(value))
        return out

    def stat(self, getter):
        return median_range(self.values(getter))

    @property
    def flagged(self) -> int:
        return sum(1 for r in self.runs if not r.get('ok', True))


def rps(run):
    return run['rps']


def pct(p):
    return lambda run: run['latency_us'][p] / 1000.0


def cpu_per_call(run):
    return run.get('cpu_us_per_call')


def target_cores(run):
    return run.get('target_cores')


def pg_cores(run):
    return None if run.get('pg_cpu_s') is None else run['pg_cpu_s'] / run['duration_s']


def wrk_cores(run):
    return run['wrk_cpu_s'] / run['duration_s']


def other_cores(run):
    return run.get('other_cores')


# --------------------------------------------------------------------------------------
# Formats
# --------------------------------------------------------------------------------------

def fmt_rps(value: float) -> str:
    return f'{value:,.0f}'


def fmt_ms(value: float) -> str:
    return f'{value:.2f}' if value < 10 else f'{value:.1f}'


def fmt_plain(value: float) -> str:
    return f'{value:,.0f}' if value >= 100 else f'{value:.2f}' if value < 10 else f'{value:.1f}'


def show(stat, fmt=fmt_plain, unit: str = '') -> str:
    """``median [min-max]`` of a median_range, each number through `fmt`; '-' for None."""
    if stat is None:
        return '-'
    median, lo, hi = stat
    return f'{fmt(median)}{unit} [{fmt(lo)}-{fmt(hi)}]'


def spread(runs: list[dict], field: str, digits: int = 1) -> str:
    """``median [min-max]`` of one field over runs (show_range of its values that are not None)."""
    return show_range(median_range([r.get(field) for r in runs]), digits)


def show_range(stat, digits: int = 1, scale: float = 1.0) -> str:
    """``median [min-max]`` with `digits` decimals (after multiplying by `scale`), or '-'."""
    if not stat:
        return '-'
    return f'{stat[0] * scale:,.{digits}f} [{stat[1] * scale:,.{digits}f}-{stat[2] * scale:,.{digits}f}]'
