"""The limits block's results.md: what admission costs per mix (render_cost.py) and how exact it is
(render_accuracy.py), beside the reference designs, then the closed-loop report of every cell
(loadtests/blocks/oltp/render.py), a target per mix. Runs from before the mixes render as they did (legacy.py)."""
from __future__ import annotations

from pathlib import Path

from ... import rundir
from ..oltp.render import render as closed_loop
from . import ENVOY, QAG, legacy, render_accuracy, render_cost
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


def write(run_dir: Path) -> Path:
    return rundir.write_report(run_dir, render)


def render(meta: dict, runs: list[dict]) -> str:
    settings = meta.get('settings', {})
    if 'mixes' not in settings:
        return legacy.render(meta, runs)
    return closed_loop(by_mix_meta(meta), by_mix_runs(runs), sections(meta, runs))


def sections(meta: dict, runs: list[dict]) -> list[str]:
    settings = meta.get('settings', {})
    targets = [t['name'] for t in meta.get('targets', [])]
    out = ['## Targets', ''] + [f'- `{t["name"]}`: {t.get("description", "")}' for t in meta.get('targets', [])]
    out += [''] + [f'- `{name}`: {text}' for name, text in DESIGNS.items() if name in targets] + ['']
    out += key_lines(settings)
    for mix in settings.get('mixes', []):
        out += render_cost.mix_section(runs, mix, settings.get('mix_text', {}).get(mix, mix), targets)
    out += render_accuracy.section(runs, targets)
    return out


def key_lines(settings: dict) -> list[str]:
    """How long each target's keys took to make, and the targets given fewer keys than their mix."""
    out = []
    created = settings.get('keys_created_s') or {}
    if created:
        out += ['Keys made through each target\'s Management API (16 calls at a time), once per run (0 s: those of '
                'an earlier run, kept with --keep-stores): '
                + ', '.join(f'{k} {v:g} s' for k, v in created.items()) + '.', '']
    for mix, by_target in (settings.get('keys_by_target') or {}).items():
        full = (settings.get('keys') or {}).get(mix)
        hot = MIXES[mix].hot(full) if mix in MIXES and full else 0
        for target, count in by_target.items():
            if full and count < full:
                out += [f'**Mix `{mix}`: `{target}` has {count:,} keys, not {full:,}** (--qag-keys: QueryAPIGate '
                        '0.43.0 reads every key twice to create one, so n keys take a time in n squared). Its hot '
                        'set is the mix\'s, with the same share of the calls: its hot keys are asked as often as '
                        f'the others\', each of its other keys {(full - hot) / max(count - hot, 1):.1f}× as often.',
                        '']
    return out


def by_mix_meta(meta: dict) -> dict:
    """The meta the generic report reads, with a target per (target, mix)."""
    mixes = meta.get('settings', {}).get('mixes', [])
    targets = [dict(t, name=f'{t["name"]} ({mix})') for mix in mixes for t in meta.get('targets', [])]
    return dict(meta, targets=targets)


def by_mix_runs(runs: list[dict]) -> list[dict]:
    return [dict(r, target=f'{r["target"]} ({r["mix"]})') for r in runs
            if r.get('kind') != 'accuracy' and r.get('mix')]
