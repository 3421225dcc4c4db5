"""The limits block's run: the targets (provision.py), each mix's keys on each, the cost rounds of every mix, then
the accuracy phase (accuracy.py)."""
from __future__ import annotations

from ... import system
from ...harness import log, record_variants, run_rounds
from . import OFF, QAG, TARGETS, accuracy
from .mixes import IP_RATE, KEY_RATE, Mix, chosen
from .provision import mix_keys, start_targets

SINGLE_CALLER = 1     # the cell whose every latency is kept (wrk -c1 -t1): a single caller's pooled p99


def run(run):
    args, work_dir, meta = run.args, run.work_dir, run.meta
    mixes = chosen(args.mix)
    names = [TARGETS[n.strip()] for n in args.limits_targets.split(',') if n.strip()]
    live, probes = start_targets(run, names)
    keys_files: dict = {m.name: {} for m in mixes}
    created: dict = {}
    server = system.redact(args.database_url)
    for mix in mixes:
        for target in live:
            path = work_dir / target.name / f'keys-{mix.name}.txt'
            count = keys_for(mix, args, target.name)
            created[f'{target.name} {mix.name}'] = round(mix_keys(target, mix, count, path, server,
                                                                  args.keep_stores), 1)
            keys_files[mix.name][target.name] = path
    for target in live:
        target.info.update(mixes={m.name: m.describe(keys_for(m, args, target.name), m.hot(keys_for(m, args)))
                                  for m in mixes},
                           key_limits={m.name: m.key_limits('qag' if target.name == QAG else 'gateway')
                                       for m in mixes})
    meta['settings'].update(
        mixes=[m.name for m in mixes], keys={m.name: keys_for(m, args) for m in mixes},
        keys_by_target={m.name: {t.name: keys_for(m, args, t.name) for t in live} for m in mixes},
        mix_text={m.name: m.describe(keys_for(m, args)) for m in mixes}, key_rate=KEY_RATE, ip_rate=IP_RATE,
        keys_created_s=created, single_caller=SINGLE_CALLER, accuracy_multiples=args.accuracy_multiples,
        accuracy_keys=args.accuracy_keys, accuracy_duration_s=args.accuracy_duration,
        baseline_note=f'- Ratios: against `{OFF}`, paired per round, in the sections on admission above.')
    record_variants(run, live, OFF)
    meta['settings']['baseline'] = None     # the generic tables below mix the mixes' cells: no ratios there
    run.save()

    for mix in mixes:
        for target in live:   # the hot set is the mix's own on every target, also one with fewer keys
            target.wrk_env = mix.wrk_env(str(keys_files[mix.name][target.name]), keys_for(mix, args, target.name),
                                         hot=mix.hot(keys_for(mix, args)))
        log(f'mix {mix.name}: {mix.describe(keys_for(mix, args))}')
        # The skewed mix's hot keys may be asked above their limit at the top of a target's throughput: its 429s
        # are answers (counted and shown per round), not errors.
        run_rounds(run.block, live, args, probes, _extra, tags={'mix': mix.name}, cell_env=_cell_env,
                   limited_ok=True)
    accuracy.run_phase(run.block, live, mixes[-1], keys_files[mixes[-1].name], args)


def keys_for(mix: Mix, args, target: str | None = None) -> int:
    """The mix's keys, or fewer with --keys (a smoke run: the hot set keeps its share), and for limits-qag at most
    --qag-keys (its keys cost a time in n squared to create; the hot set stays the mix's)."""
    count = min(mix.keys, args.keys) if args.keys else mix.keys
    if target == QAG and args.qag_keys:
        count = min(count, args.qag_keys)
    return count


def _cell_env(connections: int) -> dict:
    return {'LATENCY_HISTOGRAM': '1'} if connections == SINGLE_CALLER else {}


def _extra(record: dict) -> str:
    statuses = record.get('statuses') or {}
    return (f'; {statuses.get("429", 0):,} x 429; workers {record.get("worker_cpu_us_per_call") or 0:,.0f} µs '
            f'CPU/call; Redis {record.get("redis_per_call")} commands, {record.get("redis_reads_per_call")} '
            f'reads, {record.get("redis_cpu_us_per_call")} µs/call')
