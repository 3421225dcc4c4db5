"""The limits block's results.md: what admission costs per mix (render_cost.py) and how exact it is
(render_accuracy.py), beside the reference designs, then the closed-loop report of every cell
(loadtests/blocks/oltp/render.py), a target per mix. A run from before the mixes (no `mixes` in its meta.json, such
as docs/bench/raw/limits-20261130-122255) renders as it did then (``legacy``)."""
from __future__ import annotations

from ...markdown import table
from ...stats import median_range, paired_ratios, show_paired, spread
from ..oltp.render import render as closed_loop
from . import ENVOY, KEY_RATE, OFF, ON, QAG, render_accuracy, render_cost
from .mixes import MIXES

DESIGNS = {
    ENVOY: 'envoyproxy/ratelimit\'s algorithm, reimplemented in the harness (loadtests/peers/fixed_window.py, after '
           'its src/redis/fixed_cache_impl.go and src/limiter/base_limiter.go): a fixed-window counter per '
           'descriptor (client address, key, quota as a day limit), one pipelined round trip per call with an '
           'INCRBY and an EXPIRE per descriptor, a near-cache of counters over their limit. A faithful '
           'reimplementation run in our gateway\'s worker, not envoy itself: envoy adds a gRPC call to its '
           'ratelimit service per request, not counted here. No burst: 20 per fixed second.',
    QAG: 'QueryAPIGate 0.43.0 as its image runs it, with QUERYAPIGATE_REDIS_URL: a token bucket per client address '
         'and per key in one EVALSHA each (ratelimit.py); a quota read with an HMGET before the call and another '
         'for its headers, and after a call that returned data an EXISTS then a MULTI/EXEC of two HINCRBY '
         '(quotas.py: checked before, counted after). Its key model has no burst setting: its bucket holds the '
         'rate\'s 20, where the skewed mix asks for 40.',
}
LEASE_S = 0.1           # GATEWAY_LEASE_MS's default then: how long a lease may be spent (the legacy report)


def render(meta: dict, runs: list[dict]) -> str:
    if 'mixes' not in meta.get('settings', {}):
        return closed_loop(meta, [r for r in runs if r.get('kind') != 'hot'], legacy(meta, runs))
    by_mix_meta = dict(meta, targets=[dict(t, name=f'{t["name"]} ({mix})') for mix in meta['settings']['mixes']
                                      for t in meta.get('targets', [])])
    by_mix_runs = [dict(r, target=f'{r["target"]} ({r["mix"]})') for r in runs
                   if r.get('kind') != 'accuracy' and r.get('mix')]
    return closed_loop(by_mix_meta, by_mix_runs, sections(meta, runs))


def sections(meta: dict, runs: list[dict]) -> list[str]:
    settings = meta.get('settings', {})
    targets = [t['name'] for t in meta.get('targets', [])]
    out = ['## Targets', '', *(f'- `{t["name"]}`: {t.get("description", "")}' for t in meta.get('targets', [])), '',
           *(f'- `{name}`: {text}' for name, text in DESIGNS.items() if name in targets), '', *key_lines(settings)]
    for mix in settings.get('mixes', []):
        out += render_cost.mix_section(runs, mix, settings.get('mix_text', {}).get(mix, mix), targets)
    return out + render_accuracy.section(runs, targets)


def key_lines(settings: dict) -> list[str]:
    """How long each target's keys took to make, and the targets given fewer keys than their mix."""
    out = []
    if created := settings.get('keys_created_s') or {}:
        out += ['Keys made through each target\'s Management API (16 calls at a time), once per run (0 s: those of '
                'an earlier run, kept with --keep-stores): '
                + ', '.join(f'{k} {v:g} s' for k, v in created.items()) + '.', '']
    for mix, by_target in (settings.get('keys_by_target') or {}).items():
        full = (settings.get('keys') or {}).get(mix)
        hot = MIXES[mix].hot(full) if mix in MIXES and full else 0
        out += [line for target, count in by_target.items() if full and count < full for line in (
            f'**Mix `{mix}`: `{target}` has {count:,} keys, not {full:,}** (--qag-keys: QueryAPIGate 0.43.0 reads '
            'every key twice to create one, so n keys take a time in n squared). Its hot set is the mix\'s, with the '
            'same share of the calls: its hot keys are asked as often as the others\', each of its other keys '
            f'{(full - hot) / max(count - hot, 1):.1f}× as often.', '')]
    return out


def legacy(meta: dict, runs: list[dict]) -> list[str]:
    """The section of a run before the mixes: what admission under realistic limits cost (paired per round), and the
    runs at the limit against an exact token bucket."""
    settings = meta.get('settings', {})
    cells = {t: [r for r in runs if r.get('kind') == 'run' and r['target'] == t] for t in (ON, OFF)}
    out = ['## Admission under realistic limits', '',
           f'{settings.get("keys", 0):,} keys at {KEY_RATE}/second each and {settings.get("client_ips", 0):,} '
           f'client addresses at {settings.get("ip_rate", "?")} each, every call on a key and an address drawn at '
           'random; median [min-max] of the rounds. Every key and address is asked far below its limits, so an '
           'exact limiter refuses nothing: each 429 is a call refused that it would have admitted.', '',
           *table(['Target', 'req/s', 'Worker CPU per call (µs)', 'Redis commands per call', 'scripts per call',
                   'Redis CPU per call (µs)', '429s (all rounds)'],
                  [[t, spread(cell, 'rps', 0), spread(cell, 'worker_cpu_us_per_call'), spread(cell, 'redis_per_call', 4),
                    spread(cell, 'redis_scripts_per_call', 4), spread(cell, 'redis_cpu_us_per_call'),
                    f'{sum(render_cost.refused(r) for r in cell):,} of {sum(r["requests"] for r in cell):,}']
                   for t, cell in cells.items() if cell]),
           '- Worker CPU per call on/off, paired per round: '
           + show_paired(paired_ratios(cells[ON], cells[OFF], lambda r: r.get('worker_cpu_us_per_call'))),
           '- req/s on/off, paired per round: ' + show_paired(paired_ratios(cells[ON], cells[OFF], lambda r: r['rps'])),
           '']
    hot = [r for r in runs if r.get('kind') == 'hot']
    if not hot:
        return out
    rows, ratios = [], []
    for r in hot:
        keys, seconds = r.get('hot_keys') or 0, r['duration_s']
        admitted = (r.get('statuses') or {}).get('200', 0)
        exact, bound = keys * (KEY_RATE + KEY_RATE * seconds), keys * (KEY_RATE + KEY_RATE * (seconds + LEASE_S))
        ratios.append(admitted / exact if exact else None)
        rows.append([r.get('round'), f'{seconds:.2f}', f'{r["requests"]:,}', f'{admitted:,}',
                     f'{render_cost.refused(r):,}', f'{exact:,.0f}', f'{admitted / exact:.3f}', f'{bound:,.0f}',
                     'yes' if admitted <= bound else 'NO'])
    out += ['## At the limit', '',
            f'All calls on {hot[0].get("hot_keys")} keys, far above {KEY_RATE}/second each. Exact: what a token '
            f'bucket (rate {KEY_RATE}/s, burst {KEY_RATE}, full at the start) admits in the run\'s T seconds, '
            f'keys x (burst + rate x T); bound: keys x (burst + rate x (T + {LEASE_S:g} s)), the leased '
            'limiter\'s stated ceiling. Admitted / exact below 1: calls refused that an exact limiter would admit.', '',
            *table(['Run', 'T (s)', 'Calls', 'Admitted (200)', 'Refused (429)', 'Exact', 'Admitted / exact', 'Bound',
                    'Within bound'], rows, blank=False)]
    if stat := median_range(ratios):
        out += ['', f'- Admitted / exact: median {stat[0]:.3f} [{stat[1]:.3f}-{stat[2]:.3f}]; calls refused that '
                f'an exact limiter would admit: {max(0.0, 1 - stat[0]) * 100:.1f}% of its admissions (median run), '
                f'{max(0.0, 1 - stat[1]) * 100:.1f}% in the worst.', '']
    return out
