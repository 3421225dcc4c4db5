"""A rate-limited key (LOADTEST_RATE_LIMIT, default 20/second, burst = the limit) called faster than its limit.

A share of the calls must answer 429 `rate_limited`; that is the expected answer, so it counts as a success, under
a name of its own ("... 429 rate_limited") so the share shows in locust's table. Every answer must carry sane
X-RateLimit-Limit / -Remaining / -Reset headers, and a 429 a Retry-After; a 429 of another kind, a missing or
insane header, or a wrong row is a failure.
"""
from __future__ import annotations

import time

from locust import FastHttpUser, tag, task

from .common import STATE, check_lookup, default_wait, describe, error_code, header, random_aid, secret
from .provision import RATE_LIMIT, rate_limit_number

LIMIT = rate_limit_number(RATE_LIMIT)
BURST = LIMIT
PERIOD_S = {'second': 1, 'minute': 60, 'hour': 3600, 'day': 86400}[
    RATE_LIMIT.split('/', 1)[1].strip().rstrip('s') if '/' in RATE_LIMIT else 'second']
NAME_OK = '/q/account [rate-limited key] 200'
NAME_LIMITED = '/q/account [rate-limited key] 429 rate_limited'
_window: list = []  # monotonic time of the first and the latest call


def _mark():
    now = time.monotonic()
    if len(_window) < 2:
        _window.append(now)
    else:
        _window[1] = now


def _int(response, name: str):
    raw = header(response, name)
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


def rate_headers_problem(response) -> str | None:
    """Why the X-RateLimit-* headers are not sane, or None."""
    limit, remaining, reset = (_int(response, f'X-RateLimit-{h}') for h in ('Limit', 'Remaining', 'Reset'))
    if limit is None or remaining is None or reset is None:
        return ('missing or non-integer X-RateLimit-Limit/Remaining/Reset: '
                f'{header(response, "X-RateLimit-Limit")!r}/{header(response, "X-RateLimit-Remaining")!r}/'
                f'{header(response, "X-RateLimit-Reset")!r}')
    if limit != LIMIT:
        return f'X-RateLimit-Limit is {limit}, the key\'s limit is {LIMIT}'
    if not 0 <= remaining <= BURST:
        return f'X-RateLimit-Remaining {remaining} is outside 0..{BURST}'
    if not 0 <= reset <= PERIOD_S * BURST // LIMIT + 1:
        return f'X-RateLimit-Reset {reset} is outside 0..{PERIOD_S * BURST // LIMIT + 1} s'
    return None


class RateLimited(FastHttpUser):
    """GET /q/account with the rate-limited key, as fast as answers come."""
    weight = 1
    wait_time = default_wait()

    def on_start(self):
        self.headers = {'X-API-Key': secret('limited')}

    @tag('ratelimit')
    @task
    def limited_lookup(self):
        aid = random_aid()
        _mark()
        with self.client.get(f'/q/account?aid={aid}', headers=self.headers, name=NAME_OK,
                             catch_response=True) as response:
            if response.status_code == 429:
                response.request_meta['name'] = NAME_LIMITED
                STATE.count('limited_429')
                code = error_code(response)
                if code != 'rate_limited':
                    response.failure(f'429 with code {code!r}, expected rate_limited: {describe(response)}')
                    return
                retry = _int(response, 'Retry-After')
                if retry is None or not 1 <= retry <= PERIOD_S + 1:
                    response.failure(f'429 with Retry-After {header(response, "Retry-After")!r}, expected an '
                                     f'integer from 1 to {PERIOD_S + 1}')
                    return
                problem = rate_headers_problem(response)
                if problem:
                    response.failure('429: ' + problem)
                    return
                response.success()
                return
            STATE.count('limited_other')
            if not check_lookup(response, aid):
                return
            problem = rate_headers_problem(response)
            if problem:
                response.failure('200: ' + problem)


def summary() -> str | None:
    limited, other = STATE.counts.get('limited_429', 0), STATE.counts.get('limited_other', 0)
    total = limited + other
    if not total:
        return None
    line = (f'rate-limited key ({RATE_LIMIT}): {limited:,} of {total:,} calls answered 429 rate_limited '
            f'({limited / total:.0%})')
    if not limited:
        line += ' - NONE was limited: the load stayed under the limit, or the gateway does not enforce it'
    if len(_window) == 2:
        seconds = _window[1] - _window[0]
        line += (f'; {other:,} admitted in {seconds:.1f} s, where the limit admits about '
                 f'{BURST + LIMIT * seconds / PERIOD_S:,.0f} (burst + rate x time)')
    _window.clear()
    return line
