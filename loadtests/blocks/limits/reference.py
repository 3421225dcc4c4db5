"""What an exact limiter admits for the arrivals the accuracy phase recorded, computed offline, and how a target's
admissions compare with it. Pure functions of the recorded calls (tests/loadtests/test_limits_block.py).

A call is (key, monotonic send time, wall send time, status): 200 admitted, 429 refused, anything else an error,
left out of both sides (its decision is unknown).
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import NamedTuple

EPS = 1e-9          # a token is whole when float sums say 0.999999999


class Call(NamedTuple):
    key: int
    mono: float      # time.monotonic() when it was sent
    wall: float      # time.time() at the same moment (fixed windows are aligned to wall seconds)
    status: int


def token_bucket(times: Sequence[float], rate: float, burst: float) -> list[bool]:
    """Which of `times` (sorted seconds) an exact token bucket admits: `rate` tokens a second, at most `burst`,
    full at the first arrival; a call takes one token or is refused."""
    admitted = []
    tokens, last = float(burst), None
    for t in times:
        if last is not None:
            tokens = min(float(burst), tokens + (t - last) * rate)
        last = t
        if tokens >= 1 - EPS:
            tokens -= 1
            admitted.append(True)
        else:
            admitted.append(False)
    return admitted


def fixed_window(times: Sequence[float], limit: int, unit_s: float) -> list[bool]:
    """Which of `times` (sorted wall seconds) an exact fixed-window counter admits: the first `limit` calls of each
    window [k x unit, (k + 1) x unit) (envoy's rule: a call is over when the count after it exceeds the limit)."""
    admitted = []
    window, count = None, 0
    for t in times:
        w = math.floor(t / unit_s)
        if w != window:
            window, count = w, 0
        count += 1
        admitted.append(count <= limit)
    return admitted


def most_in_window(times: Sequence[float], window_s: float) -> int:
    """The most of `times` (sorted) inside any window [t, t + window_s)."""
    most, start = 0, 0
    for end, t in enumerate(times):
        while t - times[start] >= window_s:
            start += 1
        most = max(most, end - start + 1)
    return most


Rule = Callable[[list[Call]], list[bool]]


def bucket_rule(rate: float, burst: float) -> Rule:
    return lambda calls: token_bucket([c.mono for c in calls], rate, burst)


def window_rule(limit: int, unit_s: float) -> Rule:
    return lambda calls: fixed_window([c.wall for c in calls], limit, unit_s)


def by_key(calls: list[Call]) -> dict[int, list[Call]]:
    """The decided calls (200 or 429) of each key, in the order they were sent."""
    found: dict[int, list[Call]] = {}
    for call in sorted(calls, key=lambda c: c.mono):
        if call.status in (200, 429):
            found.setdefault(call.key, []).append(call)
    return found


def compare(calls: list[Call], rule: Rule, window_s: float = 1.0) -> dict:
    """A target's admissions against `rule`'s for the same arrivals, summed over keys:

    - admitted, exact: the calls each admitted;
    - over: per key, admitted - exact where positive, summed (what the target let through beyond the rule);
    - missed: calls the rule admits that the target refused (one by one, same call);
    - extra: calls the target admitted that the rule refuses;
    - most_in_window / exact_most_in_window: the most admitted calls of one key in any `window_s` window."""
    admitted = exact = over = missed = extra = most = exact_most = 0
    for key_calls in by_key(calls).values():
        ours = [c.status == 200 for c in key_calls]
        ideal = rule(key_calls)
        a, e = sum(ours), sum(ideal)
        admitted, exact, over = admitted + a, exact + e, over + max(0, a - e)
        missed += sum(1 for o, i in zip(ours, ideal, strict=True) if i and not o)
        extra += sum(1 for o, i in zip(ours, ideal, strict=True) if o and not i)
        most = max(most, most_in_window([c.mono for c, o in zip(key_calls, ours, strict=True) if o], window_s))
        exact_most = max(exact_most, most_in_window([c.mono for c, i in zip(key_calls, ideal, strict=True) if i],
                                                    window_s))
    return {'admitted': admitted, 'exact': exact, 'ratio': round(admitted / exact, 4) if exact else None,
            'over': over, 'missed': missed, 'extra': extra, 'most_in_window': most,
            'exact_most_in_window': exact_most, 'window_s': window_s}


def poisson_schedule(keys: int, rate_per_key: float, duration_s: float, seed: int) -> list[tuple[float, int]]:
    """Open-loop arrivals: for each key an independent Poisson process at `rate_per_key` over [0, duration_s),
    merged into one list of (offset seconds, key index from 0), sorted by offset."""
    rng = random.Random(seed)
    schedule = []
    for key in range(keys):
        t = rng.expovariate(rate_per_key)
        while t < duration_s:
            schedule.append((t, key))
            t += rng.expovariate(rate_per_key)
    schedule.sort()
    return schedule
