"""Run wrk once and read its result.

wrk is a closed loop: -c N keeps N connections, each sending its next request when the last one answers. That
measures throughput, and latency at a given concurrency - but not latency against an offered rate: a slow answer
delays the next request, so under saturation a closed loop under-reports latency (coordinated omission). Latency
against load, open loop and latency-corrected, needs oha (`oha -q R --latency-correction`), which is not installable
here (not on PyPI); until it is, this harness reports closed-loop numbers only and says so.

The Lua scripts under loadtests/wrk/ print one `WRKJSON {...}` line from wrk's done() hook, with exact percentiles
in microseconds - wrk's own text rounds them (e.g. 1.05ms) - and the error counts. Requests that did not answer
2xx/3xx are counted by wrk in errors.status; socket errors as connect/read/write/timeout. Any of them makes the run
`ok: false` (see errors_of()), so a run with errors is flagged, never silently averaged in.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .system import taskset_prefix

SCRIPTS = Path(__file__).resolve().parent / 'wrk'
RANDOM_AID = SCRIPTS / 'random_aid.lua'
HEALTH = SCRIPTS / 'health.lua'


@dataclass
class WrkResult:
    requests: int
    duration_s: float
    rps: float
    latency_us: dict  # min, max, mean, stdev, "50", "90", "99", "99.9"
    errors: dict      # connect, read, write, status (non-2xx/3xx), timeout
    bytes: int
    wrk_cpu_s: float  # user + system CPU of the wrk process
    command: list = field(default_factory=list)
    bodies: dict = field(default_factory=dict)  # checked, bad_body, unasked, check (random_aid.lua)
    statuses: dict = field(default_factory=dict)  # "200", "429", "other" (random_aid.lua)
    latency_hist: list = field(default_factory=list)  # [[us, count], ...] with LATENCY_HISTOGRAM=1 (random_aid.lua)
    text: str = ''

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop('text')
        if not out['latency_hist']:
            out.pop('latency_hist')   # only the runs that asked for it carry it
        return out


class WrkError(RuntimeError):
    pass


def run(url: str, *, connections: int, duration_s: float, script: Path = RANDOM_AID, env: dict | None = None,
        cpu: str | None = None, threads: int = 1, timeout_s: float | None = None) -> WrkResult:
    """`wrk -t<threads> -c<connections> -d<duration>s --latency -s <script> <url>`, pinned with taskset to `cpu`.
    `env` reaches the Lua script (API_KEY, QUERY_PATH, PARAM, MAX_ID)."""
    cmd = [*taskset_prefix(cpu), 'wrk', f'-t{threads}', f'-c{connections}', f'-d{_seconds(duration_s)}s',
           '--latency', '-s', str(script)]
    if timeout_s:
        cmd += ['--timeout', f'{_seconds(timeout_s)}s']
    cmd.append(url)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})},
                          timeout=duration_s + 60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    wrk_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise WrkError(f'wrk exited {done.returncode} after {time.monotonic() - started:.1f}s: '
                       f'{(done.stderr or done.stdout)[-500:]}')
    data = parse(done.stdout)
    duration = data['duration_us'] / 1e6
    return WrkResult(requests=data['requests'], duration_s=round(duration, 3),
                     rps=data['requests'] / duration if duration else 0.0, latency_us=data['latency_us'],
                     errors=data['errors'], bytes=data['bytes'], wrk_cpu_s=round(wrk_cpu, 3),
                     command=cmd, text=done.stdout, bodies=data.get('bodies', {}), statuses=data.get('statuses', {}),
                     latency_hist=histogram(done.stdout))


def parse(stdout: str) -> dict:
    """The WRKJSON line of a run's output. Raises WrkError if the script didn't print one (a wrk without Lua,
    or the wrong script)."""
    for line in stdout.splitlines():
        if line.startswith('WRKJSON '):
            return json.loads(line[len('WRKJSON '):])
    raise WrkError('no WRKJSON line in wrk output - run it with one of loadtests/wrk/*.lua:\n' + stdout[-500:])


def histogram(stdout: str) -> list:
    """The WRKHIST line's [[latency us, count], ...] (random_aid.lua with LATENCY_HISTOGRAM=1), or []."""
    for line in stdout.splitlines():
        if line.startswith('WRKHIST '):
            return json.loads(line[len('WRKHIST '):])['us']
    return []


def parse_text(stdout: str) -> dict:
    """wrk's own (rounded) text summary - kept as a cross-check of parse(): Requests/sec and the percentiles of
    --latency, in microseconds, and the Non-2xx count."""
    out: dict = {'latency_us': {}}
    units = {'us': 1, 'ms': 1e3, 's': 1e6, 'm': 60e6}
    in_dist = False
    for raw in stdout.splitlines():
        line = raw.strip()
        if line.startswith('Requests/sec:'):
            out['rps'] = float(line.split()[1])
        elif line.startswith('Non-2xx or 3xx responses:'):
            out['non_2xx'] = int(line.split(':')[1])
        elif line.startswith('Latency Distribution'):
            in_dist = True
        elif in_dist and line.endswith(tuple(units)) and '%' in line:
            pct, value = line.split()
            number = value.rstrip('usm')
            unit = value[len(number):]
            out['latency_us'][pct.rstrip('%')] = float(number) * units[unit]
        else:
            in_dist = False if in_dist and '%' not in line else in_dist
    return out


def errors_of(result: WrkResult, limited_ok: bool = False) -> list[str]:
    """What is wrong with a run, in words; empty when every request answered 2xx/3xx without a socket error and
    every checked body held the row its call asked for. `limited_ok`: 429s are answers the run expects (a load
    above a rate limit), any other non-2xx still counts."""
    errors = dict(result.errors)
    if limited_ok and errors.get('status'):
        errors['status'] -= min(errors['status'], result.statuses.get('429', 0))
    problems = [f'{count} {kind}' + (' (non-2xx/3xx responses)' if kind == 'status' else ' errors')
                for kind, count in errors.items() if count]
    if result.requests == 0:
        problems.append('no requests completed')
    bodies = result.bodies
    problems += [f'{bodies[kind]} wrong bodies ({kind})' for kind in ('bad_body', 'unasked') if bodies.get(kind)]
    if bodies.get('check') == 'account' and not bodies.get('checked') and result.requests:
        problems.append('no body was checked')
    return problems


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
