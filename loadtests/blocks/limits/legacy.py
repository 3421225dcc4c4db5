"""The limits block's results.md as it was before the mixes and the reference designs (runs whose meta.json has
no `mixes`, such as docs/bench/raw/limits-20261130-122255): the closed-loop report (loadtests/blocks/oltp/render.py)
with, first, what admission under realistic limits costs (paired per round) and how many calls it refused that an
exact limiter would admit, then the runs at the limit against an exact token bucket. Kept as it was, so those runs
render as committed."""
from __future__ import annotations

from ...stats import median_range, paired_ratios, show_paired, show_range
from ..oltp.render import render as closed_loop
from . import KEY_RATE, OFF, ON

LEASE_S = 0.1           # GATEWAY_LEASE_MS's default: how long a lease may be spent


def render(meta: dict, runs: list[dict]) -> str:
    return closed_loop(meta, [r for r in runs if r.get('kind') != 'hot'], section(meta, runs))


def refused(run: dict) -> int:
    return (run.get('statuses') or {}).get('429', 0)


def section(meta: dict, runs: list[dict]) -> list[str]:
    settings = meta.get('settings', {})
    measured = [r for r in runs if r.get('kind') == 'run']
    cells = {t: [r for r in measured if r['target'] == t] for t in (ON, OFF)}
    out = ['## Admission under realistic limits', '',
           f'{settings.get("keys", 0):,} keys at {KEY_RATE}/second each and {settings.get("client_ips", 0):,} '
           f'client addresses at {settings.get("ip_rate", "?")} each, every call on a key and an address drawn at '
           'random; median [min-max] of the rounds. Every key and address is asked far below its limits, so an '
           'exact limiter refuses nothing: each 429 is a call refused that it would have admitted.', '']
    out += ['| Target | req/s | Worker CPU per call (µs) | Redis commands per call | scripts per call | '
            'Redis CPU per call (µs) | 429s (all rounds) |', '|---|---|---|---|---|---|---|']
    for t, cell in cells.items():
        if cell:
            out.append(f'| {t} | {show_range(median_range([r["rps"] for r in cell]), 0)} | '
                       f'{show_range(median_range([r.get("worker_cpu_us_per_call") for r in cell]))} | '
                       f'{show_range(median_range([r.get("redis_per_call") for r in cell]), 4)} | '
                       f'{show_range(median_range([r.get("redis_scripts_per_call") for r in cell]), 4)} | '
                       f'{show_range(median_range([r.get("redis_cpu_us_per_call") for r in cell]))} | '
                       f'{sum(refused(r) for r in cell):,} of {sum(r["requests"] for r in cell):,} |')
    out += ['', '- Worker CPU per call on/off, paired per round: '
            + show_paired(paired_ratios(cells[ON], cells[OFF], lambda r: r.get('worker_cpu_us_per_call'))),
            '- req/s on/off, paired per round: ' + show_paired(paired_ratios(cells[ON], cells[OFF], lambda r: r['rps'])),
            '']
    hot = [r for r in runs if r.get('kind') == 'hot']
    if hot:
        out += ['## At the limit', '',
                f'All calls on {hot[0].get("hot_keys")} keys, far above {KEY_RATE}/second each. Exact: what a token '
                f'bucket (rate {KEY_RATE}/s, burst {KEY_RATE}, full at the start) admits in the run\'s T seconds, '
                f'keys x (burst + rate x T); bound: keys x (burst + rate x (T + {LEASE_S:g} s)), the leased '
                'limiter\'s stated ceiling. Admitted / exact below 1: calls refused that an exact limiter would admit.', '']
        out += ['| Run | T (s) | Calls | Admitted (200) | Refused (429) | Exact | Admitted / exact | Bound | Within bound |',
                '|---|---|---|---|---|---|---|---|---|']
        ratios = []
        for r in hot:
            keys, seconds = r.get('hot_keys') or 0, r['duration_s']
            admitted = (r.get('statuses') or {}).get('200', 0)
            exact = keys * (KEY_RATE + KEY_RATE * seconds)
            bound = keys * (KEY_RATE + KEY_RATE * (seconds + LEASE_S))
            ratios.append(admitted / exact if exact else None)
            out.append(f'| {r.get("round")} | {seconds:.2f} | {r["requests"]:,} | {admitted:,} | {refused(r):,} | '
                       f'{exact:,.0f} | {admitted / exact:.3f} | {bound:,.0f} | {"yes" if admitted <= bound else "NO"} |')
        stat = median_range(ratios)
        if stat:
            out += ['', f'- Admitted / exact: median {stat[0]:.3f} [{stat[1]:.3f}-{stat[2]:.3f}]; calls refused that '
                    f'an exact limiter would admit: {max(0.0, 1 - stat[0]) * 100:.1f}% of its admissions (median run), '
                    f'{max(0.0, 1 - stat[1]) * 100:.1f}% in the worst.', '']
    return out
