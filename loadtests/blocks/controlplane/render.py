"""The controlplane block's results.md: the catalog's growth, one full load against one applied change, management
calls per kind (pooled percentiles over every sample, and the worst round's p99), the data plane with and without
changes (pooled and per round), worker memory, and the larger fleets."""
from __future__ import annotations

from ...markdown import environment, table
from ...stats import percentile

GOAL_MGMT_MS = 50.0
GOAL_KEYS_S = 60.0
GOAL_DP_MS = 1.0
KINDS = ('create-key', 'patch-key', 'publish', 'delete-key')
MGMT_STEPS = (('mgmt-small', 'Management calls on the small catalog (before growing it)'),
              ('mgmt', 'Management calls on the grown catalog'),
              ('scale', 'Management calls on the grown catalog with more workers'))


def _ms(value) -> str:
    return '?' if value is None else f'{value:,.1f}' if value >= 10 else f'{value:,.2f}'


def _pooled(records: list[dict], q: float):
    return percentile([s for r in records for s in r.get('samples_ms', [])], q)


def _span(records: list[dict], field: str) -> str:
    values = [r[field] for r in records if r.get(field) is not None]
    return f'{min(values):.2f}-{max(values):.2f}' if values else '?'


def _mean(values: list) -> float:
    return sum(values) / len(values)


def render(meta: dict, runs: list[dict]) -> str:
    settings = meta.get('settings', {})
    git = meta.get('versions', {}).get('git', {})
    step = {name: next((r for r in runs if r['step'] == name), None) for name in ('grow-keys', 'grow-queries')}
    out = ['# Control plane at fleet scale', '',
           f'Commit {git.get("commit") or "?"}{" (dirty)" if git.get("dirty") else ""}; started {meta.get("started_at")}'
           f', finished {meta.get("finished_at")}. {settings.get("workers")} workers of {settings.get("threads")} '
           f'threads; {meta.get("pinning_note", "")}.', '', *(f'> {note}' for note in meta.get('notes', []))]
    bad = [r for r in runs if not r.get('ok', True)]
    if bad:
        out += [f'**{len(bad)} record(s) with errors or wrong bodies**: ' +
                '; '.join(f'{r["step"]} {r.get("kind", "")} {r.get("errors") or r.get("wrong_bodies")}' for r in bad),
                '']
    out += ['## Growing the catalog', '', *_growth(step['grow-keys'], step['grow-queries'],
                                                   next((r for r in runs if r['step'] == 'full-load'), None)), '']
    for name, title in MGMT_STEPS:
        records = [r for r in runs if r['step'] == name]
        if records:
            out += [f'## {title}', '', 'Client-side time of the whole call (it returns once every live worker applied '
                    'the change). Pooled percentiles over every sample; "worst round p99": the highest p99 of any '
                    'round.', '', *_mgmt_table(records)]
    dp = [r for r in runs if r['step'] == 'dataplane']
    if dp:
        out += ['## Data plane, one caller, with and without changes', '', _dataplane_note(settings), '',
                *_dataplane(dp)]
    rss = [r for r in runs if r['step'] == 'rss']
    if rss:
        out += ['## Worker memory (VmRSS)', '', *_memory(rss, step['grow-keys'], step['grow-queries'])]
    return '\n'.join(out + environment(meta))


def _growth(keys: dict | None, queries: dict | None, load: dict | None) -> list[str]:
    out = []
    if keys:
        seq, par = keys['sequential'], keys['parallel']
        out += [f'- {keys["keys"]:,} keys created through the Management API in **{keys["seconds"]:.1f} s** '
                f'({"meets" if keys["seconds"] < GOAL_KEYS_S else "misses"} the goal of under {GOAL_KEYS_S:.0f} s):',
                f'  - the first {seq["keys"]:,} one after another on one connection: {seq["seconds"]:.1f} s '
                f'({seq["keys"] / max(seq["seconds"], 1e-9):.0f}/s); per call p50 {_ms(seq["latency_ms"].get("50"))} ms,'
                f' p99 {_ms(seq["latency_ms"].get("99"))} ms, max {_ms(seq["latency_ms"].get("max"))} ms; p50 per '
                '1,000 keys: ' + ', '.join(_ms(p.get('50')) for p in seq['per_thousand_ms']) + ' ms;']
        if par['keys']:
            out.append(f'  - the other {par["keys"]:,} from {par["clients"]} connections at once: {par["seconds"]:.1f} s '
                       f'({par["keys"] / max(par["seconds"], 1e-9):.0f}/s); per call p50 '
                       f'{_ms(par["latency_ms"].get("50"))} ms, p99 {_ms(par["latency_ms"].get("99"))} ms.')
        for label, part in (('one after another', seq), ('at once', par)):
            cost = part.get('per_key')
            if cost and part['keys']:
                commands = ', '.join(f'{n} {c:g}' for n, c in sorted(cost['redis_by_command'].items(),
                                                                   key=lambda item: -item[1])[:6])
                out.append(f'  - per key {label}: {cost["gateway_cpu_ms"]:g} ms of gateway CPU (master and every '
                           f'worker), {cost["redis_commands"]:g} Redis commands ({commands}), '
                           f'{cost["store_transactions"]} store transactions (the workers\' reads included)')
    if queries:
        out.append(f'- {queries["api_queries"]:,} saved queries through the API in {queries["api_seconds"]:.1f} s '
                   f'(p50 {_ms(queries["api_latency_ms"].get("50"))} ms each: PostgreSQL\'s parser and the analysis '
                   f'against the schema), then **{queries["bulk_queries"]:,} inserted in bulk into the store** '
                   '(copies of the benchmark query\'s stored version) with the generation bumped and not logged. '
                   f'The next management call found that gap, so every worker read the whole catalog before it '
                   f'returned: **{_ms(queries["gap_call_ms"])} ms** (the fallback\'s cost).')
    if load:
        out.append(f'- One full load of the grown catalog ({load.get("keys"):,} keys, {load.get("queries"):,} queries, '
                   f'{load.get("rows"):,} rows) in one process: p50 {_ms(load["ms"].get("50"))} ms '
                   f'({_ms(load.get("cpu_ms", {}).get("50"))} ms of CPU; 3 loads). The same catalog applying one change '
                   f'(`{", ".join(load.get("one_change_how", []))}`, {load.get("one_change_rows")} rows read): p50 '
                   f'{_ms(load["one_change_ms"].get("50"))} ms ({_ms(load.get("one_change_cpu_ms", {}).get("50"))} '
                   f'ms of CPU), max {_ms(load["one_change_ms"].get("max"))} ms.')
        if gcs := load.get('gc_full_pass_cpu_ms'):
            out.append(f'- A full pass of the cyclic garbage collector with that catalog alive: '
                       f'{_ms(gcs["loaded"].get("50"))} ms of CPU (holding the interpreter); with it frozen out of the '
                       f'collector\'s reach (`gc.freeze()`, as a worker does after a full load): '
                       f'{_ms(gcs["frozen"].get("50"))} ms.')
    return out


def _mgmt_table(records: list[dict]) -> list[str]:
    rows = []
    for workers in sorted({r['workers'] for r in records}):
        for kind in KINDS:
            cell = [r for r in records if r['workers'] == workers and r['kind'] == kind]
            if cell:
                p99 = _pooled(cell, 99)
                rows.append([workers, kind, sum(len(r.get('samples_ms', [])) for r in cell), _ms(_pooled(cell, 50)),
                             _ms(_pooled(cell, 90)), _ms(p99), _ms(_pooled(cell, 100)),
                             _ms(max((r['latency_ms'].get('99') or 0) for r in cell)),
                             'yes' if p99 is not None and p99 < GOAL_MGMT_MS else 'no',
                             *[_span(cell, f) for f in ('gateway_cpu_ms_per_call', 'gateway_idle_cpu_ms_per_call',
                                                        'machine_cores', 'loadavg_1m')]])
    return table(['workers', 'call', 'n', 'p50 ms', 'p90 ms', 'p99 ms', 'max ms', 'worst round p99 ms',
                  f'p99 < {GOAL_MGMT_MS:.0f} ms', 'gateway CPU ms a call', 'of it idle background',
                  'machine busy cores', 'load avg'], rows)


def _dataplane_note(settings: dict) -> str:
    return (f'One keep-alive connection calling `/q/account?aid=R` back to back; "changing": a management change '
            f'every {settings.get("change_every")} s (patch, publish, create, delete in turn). Every answer\'s '
            'status and row were checked.')


def _dataplane(dp: list[dict]) -> list[str]:
    out = table(['round', 'condition', 'calls', 'changes', 'p50 ms', 'p99 ms', 'p99.9 ms', 'max ms', 'wrong',
                 'gateway cores', 'machine busy cores', 'load avg'],
                [[r['round'], 'changing' if r['changing'] else 'quiet', f'{r["calls"]:,}', r['changes'],
                  *[_ms(r['latency_ms'].get(p)) for p in ('50', '99', '99.9', 'max')], r['wrong_bodies'],
                  r.get('gateway_cores'), r.get('machine_cores'), r.get('loadavg_1m')] for r in dp], blank=False)
    quiet, changing = [r for r in dp if not r['changing']], [r for r in dp if r['changing']]
    q99, c99 = _pooled(quiet, 99), _pooled(changing, 99)
    if q99 is not None and c99 is not None:
        by_round = {r['round']: r['latency_ms']['99'] for r in quiet}
        paired = [c['latency_ms']['99'] - by_round[c['round']] for c in changing if c['round'] in by_round]
        out += ['', f'Pooled p99: quiet {_ms(q99)} ms, changing {_ms(c99)} ms: moved **{c99 - q99:+.2f} ms** '
                    f'({"meets" if c99 - q99 < GOAL_DP_MS else "misses"} the goal of under {GOAL_DP_MS:g} ms); '
                    f'per round (changing - quiet): {", ".join(f"{p:+.2f}" for p in paired)} ms, worst '
                    f'{max(paired):+.2f} ms. Pooled p50: quiet {_ms(_pooled(quiet, 50))} ms, changing '
                    f'{_ms(_pooled(changing, 50))} ms; max: quiet {_ms(_pooled(quiet, 100))} ms, changing '
                    f'{_ms(_pooled(changing, 100))} ms.']
    return out + ['']


def _memory(rss: list[dict], keys: dict | None, queries: dict | None) -> list[str]:
    out = table(['workers', 'catalog', 'per worker MB (min-max)'],
                [[r['workers'], stage, f'{min(values) / 1024:.0f}-{max(values) / 1024:.0f}']
                 for r in rss for stage, values in r['rss_kb'].items() if values], blank=False)
    first = rss[0]['rss_kb']
    if first.get('small') and first.get('keys') and keys:
        delta = (_mean(first['keys']) - _mean(first['small'])) / 1024
        out += ['', f'{keys["keys"]:,} keys added {delta:.0f} MB per worker '
                    f'({delta * 1024 * 1024 / keys["keys"]:,.0f} bytes a key).']
    if first.get('keys') and first.get('keys+queries') and queries:
        delta = (_mean(first['keys+queries']) - _mean(first['keys'])) / 1024
        total = queries['api_queries'] + queries['bulk_queries']
        out.append(f'{total:,} queries added {delta:.0f} MB per worker ({delta * 1024 * 1024 / total:,.0f} bytes '
                   'a query).')
    return out + ['']
