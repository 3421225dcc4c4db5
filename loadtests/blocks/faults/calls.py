"""The calls of the faults block's load (loadtests/blocks/faults/load.py writes them) and what is read from them:
what clients saw in a stretch of time, and the time to recovery after a fault.

Standard library only; no I/O but reading the load's file.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...stats import percentile

HOLD_S = 1.0          # recovery: the first stretch this long in which every call that ended was a checked 200
BUCKET_S = 0.1        # the timeline's resolution


@dataclass(slots=True)
class Call:
    sent: float
    ended: float
    status: int          # 0: a connection error
    verdict: str         # ok | wrong | -
    code: str            # the JSON body's code of a non-2xx, or the error's kind for status 0; '-' for none
    request_id: str      # '-': no X-Request-Id (not answered by the gateway)

    @property
    def good(self) -> bool:
        return self.verdict == 'ok'

    @property
    def latency_ms(self) -> float:
        return (self.ended - self.sent) * 1000


class Reader:
    """The load's file, read as it grows (only whole lines)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.offset = 0
        self.calls: list[Call] = []

    def poll(self) -> list[Call]:
        try:
            with open(self.path, 'rb') as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            return self.calls
        end = chunk.rfind(b'\n') + 1
        self.offset += end
        for line in chunk[:end].decode().splitlines():
            self.calls.append(parse(line))
        return self.calls


def parse(line: str) -> Call:
    sent, ended, status, verdict, code, request_id = line.split(' ')
    return Call(float(sent), float(ended), int(status), verdict, code, request_id)


def outcome(call: Call) -> str:
    """How a call is counted: `200 ok`, `200 WRONG BODY`, `503 database_unavailable`, `502 -`, `conn
    ConnectionRefusedError`."""
    if call.status == 0:
        return f'conn {call.code}'
    if 200 <= call.status < 300:
        return f'{call.status} ok' if call.good else f'{call.status} WRONG BODY'
    return f'{call.status} {call.code}'


def ended_between(calls: list[Call], start: float, end: float) -> list[Call]:
    return [c for c in calls if start <= c.ended <= end]


def seen(calls: list[Call], start: float, end: float) -> dict:
    """What the clients saw from the calls that ended in [start, end]."""
    mine = ended_between(calls, start, end)
    outcomes: dict[str, int] = {}
    for c in mine:
        key = outcome(c)
        outcomes[key] = outcomes.get(key, 0) + 1
    latencies = [c.latency_ms for c in mine]
    ends = sorted(c.ended for c in mine)
    gaps = [b - a for a, b in zip([start, *ends], [*ends, end], strict=True)]
    return {
        'calls': len(mine),
        'good': sum(1 for c in mine if c.good),
        'outcomes': dict(sorted(outcomes.items(), key=lambda kv: -kv[1])),
        'non_2xx': {k: v for k, v in outcomes.items() if not k.startswith('2') and not k.startswith('conn')},
        'connection_errors': {k[5:]: v for k, v in outcomes.items() if k.startswith('conn')},
        'wrong_bodies': sum(1 for c in mine if 200 <= c.status < 300 and not c.good),
        'status_500': sum(1 for c in mine if c.status == 500),
        'rps': round(len(mine) / (end - start), 1) if end > start else None,
        'latency_ms': {'50': _r(percentile(latencies, 50)), '99': _r(percentile(latencies, 99)),
                       'max': _r(max(latencies) if latencies else None)},
        # the longest time in which no call at all was answered (a stall shows here, not in the failures)
        'longest_gap_ms': _r(max(gaps) * 1000 if gaps else None),
    }


def recovery(calls: list[Call], t0: float, end: float, hold_s: float = HOLD_S) -> float | None:
    """Seconds from `t0` to the first stretch (s, s + hold_s] inside [t0, end] in which at least one call ended
    and every call that ended was a checked 200; None when there was none. 0.0: clients saw nothing go wrong
    from the fault on. A stall (no answer for hold_s) is not a recovered second either."""
    events = sorted((c.ended, c.good) for c in calls if t0 <= c.ended <= end)
    starts = [t0] + [e for e, _ in events]
    hi = 0          # events[:hi] ended at or before s + hold_s
    bad_upto = [0]  # prefix counts of failures
    for _, good in events:
        bad_upto.append(bad_upto[-1] + (not good))
    lo = 0          # events[:lo] ended at or before s
    for s in starts:
        if s + hold_s > end:
            return None
        while lo < len(events) and events[lo][0] <= s:
            lo += 1
        while hi < len(events) and events[hi][0] <= s + hold_s:
            hi += 1
        if hi > lo and bad_upto[hi] - bad_upto[lo] == 0:
            return round(s - t0, 3)
    return None


def last_disturbance(calls: list[Call], t0: float, end: float, hold_s: float = HOLD_S) -> float | None:
    """The last moment in [t0, end] that clients saw something wrong: the end of the last failed call, or the first
    answer after a stretch of `hold_s` or more without any (a stall); None when there was neither. A stall still
    going on at `end` counts up to `end`."""
    ends = sorted(c.ended for c in calls if t0 <= c.ended <= end)
    worst = max((c.ended for c in calls if t0 <= c.ended <= end and not c.good), default=None)
    previous = t0
    for e in [*ends, end]:
        if e - previous >= hold_s:
            worst = e if worst is None else max(worst, e)
        previous = e
    return worst


def recovered_after(calls: list[Call], t0: float, end: float, hold_s: float = HOLD_S) -> float | None:
    """Seconds from `t0` to the first `hold_s` of checked 200s after the last disturbance (last_disturbance); 0.0
    when clients saw nothing wrong; None when it did not happen before `end`."""
    last = last_disturbance(calls, t0, end, hold_s)
    if last is None:
        return 0.0
    clean = recovery(calls, last, end, hold_s)
    return None if clean is None else round(last - t0 + clean, 3)


def failure_span(calls: list[Call], start: float, end: float) -> tuple[float, float] | None:
    """(first, last) end of a failed call in [start, end], relative to `start`; None when none failed."""
    bad = [c.ended for c in calls if start <= c.ended <= end and not c.good]
    return (round(min(bad) - start, 3), round(max(bad) - start, 3)) if bad else None


def timeline(calls: list[Call], start: float, end: float, bucket_s: float = BUCKET_S) -> dict:
    """Calls that ended in each `bucket_s` from `start`: good ones and the rest."""
    n = max(1, int((end - start) / bucket_s + 0.999))
    good, bad = [0] * n, [0] * n
    for c in calls:
        if start <= c.ended < start + n * bucket_s:
            i = int((c.ended - start) / bucket_s)
            if c.good:
                good[i] += 1
            else:
                bad[i] += 1
    return {'from_s': 0.0, 'bucket_s': bucket_s, 'good': good, 'failed': bad}


def _r(value):
    return None if value is None else round(value, 2)
