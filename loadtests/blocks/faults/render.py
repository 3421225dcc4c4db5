"""The faults block's results.md, and its page in docs/bench (``publish``): one row per fault - what the clients
saw, how long until they saw only checked 200s again, the latency in the fault's window and what was lost - then each
fault in detail, the method and the machine. A run in which any client got a wrong body or a 500 is marked FAILED."""
from __future__ import annotations

from pathlib import Path

from ... import rundir
from ...markdown import environment, incomplete, notes, table

DOCS = Path(__file__).resolve().parents[3] / 'docs' / 'bench'


def publish(run_dir: Path, docs: Path = DOCS) -> Path:
    """Keep the run beside the reports (docs/bench/raw/<folder>/) and write docs/bench/<date>-faults.md
    (<date>-faults-direct.md for a run with the clients straight to the masters, -paced for a paced load)."""
    return rundir.publish(run_dir, docs, render, _page_name)


def _page_name(meta: dict) -> str:
    settings = meta.get('settings', {})
    direct = '-direct' if settings.get('via') == 'direct' else ''
    paced = '-paced' if settings.get('rate') else ''
    return f'{(meta.get("started_at") or "undated")[:10]}-faults{direct}{paced}.md'


def failed(runs: list[dict]) -> list[str]:
    """Why the run failed: every fault with a wrong body or a 500 (empty: it did not)."""
    return [f'{r["fault"]}: {r["all"]["wrong_bodies"]} wrong bodies, {r["all"]["status_500"]} answers 500'
            for r in runs if r['all']['wrong_bodies'] or r['all']['status_500']]


def render(meta: dict, runs: list[dict], raw: str | None = None) -> str:
    settings = meta.get('settings', {})
    faults = [r for r in runs if r.get('kind') == 'fault']
    git = meta.get('versions', {}).get('git') or {}
    commit = git.get('commit') or '?'
    via = ', clients straight to the masters' if settings.get('via') == 'direct' else ''
    if settings.get('rate'):
        via += f', a paced load of {settings["rate"]:,.0f} calls/s'
    why = failed(faults)
    out = [f'# Faults under load: what clients see ({(meta.get("started_at") or "?")[:10]}, commit {commit}'
           f'{" (dirty)" if git.get("dirty") else ""}{via})', '',
           *([f'Raw data: [`{raw}`]({raw}) (results.jsonl, meta.json; results.md renders again from them).', '']
             if raw else []),
           f'    {meta.get("command", "?")}', '', *incomplete(meta),
           '**FAILED**: ' + '; '.join(why) if why else
           '**Passed the hard rule**: no client got a wrong body or a 500 under any fault.', '',
           f'Measured at commit {commit}: this is what the code does *there*. Fixes for several of these faults '
           '(a supervisor for killed masters, worker balancing, Redis cluster) were being made in parallel and are '
           'not in it unless that commit has them; rerun the block to see their effect. The machine has '
           f'{meta.get("machine", {}).get("cpus", "?")} CPUs, shared by the fleet (nginx, two masters, their '
           'workers), PostgreSQL, Redis, the load generator and other work going on at the same time: latencies and '
           'call counts are this machine\'s, under contention, and recovery times include the scheduling that '
           'contention costs.', '',
           '## Per fault', '', _per_fault_note(settings), '',
           *table(['Fault', 'Calls', 'Not 2xx', 'Conn errors', 'Wrong bodies', '500s', 'Fault lasted s', 'Recovery s',
                   'Window p99 ms', 'Window max ms', 'Longest gap ms', 'Baseline p99 ms', 'History lost',
                   'Mgmt after', 'Other work, cores'], [_fault_row(r) for r in faults])]
    quota = [r for r in faults if r.get('quota')]
    if quota:
        out += ['## Quota across the Redis loss', '', *(_quota_line(r) for r in quota), '']
    out += ['## Each fault', '']
    for r in faults:
        out += [f'### {r["fault"]}: {r["what"]}', '', *_detail(r, settings), '']
    out += ['## Method', '', *_method(settings), '', *notes(meta)]
    if meta.get('versions', {}).get('nginx'):
        out += [f'nginx {meta["versions"]["nginx"]}; aids drawn from {(meta.get("data") or {}).get("drawn", "?")}.',
                '']
    return '\n'.join(out + environment(meta)) + '\n'


def _per_fault_note(settings: dict) -> str:
    return (f'Calls: every call of the fault\'s load ({settings.get("quiet_s", "?")} s before the fault and the '
            'observation after it). Not 2xx: status and the body\'s `code` (`-`: none, e.g. nginx\'s own 502). '
            f'Recovery: from the fault to the start of the first {settings.get("hold_s", 1)} s in which every call '
            'was a checked 200, after the last failed call or the last second or more without any answer (a stall; '
            '`>N`: no such second within the observation). Fault lasted: from '
            'the fault until the server answered again, the worker was replaced or the reload done (a killed master: '
            f'until it was back, or {settings.get("master_wait_s", 10):.0f} s). Window: from the '
            'fault until it was over (server back, worker replaced, reload done) or recovered, plus one second; '
            'latency is per call, from sending it (connect included) to its last byte. Lost: 2xx answers whose '
            'request id never reached the store\'s run history. Other work: CPU the rest of the machine (not the '
            'fleet, PostgreSQL, Redis, the harness or its load) used while the fault\'s load ran, in cores.')


def _fault_row(r: dict) -> list:
    every, window = r['all'], r['window']
    lasted, rec = f'{r["fault_over_after_s"]:.2f}', r.get('recovery_s')
    if r['fault'] == 'max-requests':
        rec = lasted = 'n/a'
    else:
        rec = f'>{r["observed_s"]:.1f}' if rec is None else f'{rec:.2f}'
    mgmt = r.get('management_after') or []
    return [r['fault'], f'{every["calls"]:,}', _counts(every['non_2xx']), _counts(every['connection_errors']),
            _bold(every['wrong_bodies']), _bold(every['status_500']), lasted, rec, _ms(window['latency_ms']['99']),
            _ms(window['latency_ms']['max']), _ms(window['longest_gap_ms']),
            _ms(((r.get('baseline') or {}).get('latency_ms') or {}).get('99')),
            f'{r["history"]["lost_2xx"]} of {r["history"]["answered_2xx"]:,}',
            'ok' if mgmt and all(m.split(' ')[1].startswith('2') for m in mgmt) else ', '.join(mgmt),
            (r.get('machine') or {}).get('other_cores', '-')]


def _quota_line(r: dict) -> str:
    q = r['quota']
    return (f'- `{r["fault"]}`: a key with a quota of {q["quota_calls"]} calls/day, {q["spent_before"]} spent before '
            f'Redis was killed, called by one paced client through the loss until refused for a second: **admitted '
            f'{q["admitted"]}** ({q["over_admitted"]} over the quota). The calls that can have been in flight at the '
            'loss (answered between a history flush before Redis was back and the end of the workers\' local '
            f'fallback): {q["in_flight_bound"]}; within quota + in flight: {"yes" if q["within_bound"] else "**no**"}. '
            f'Answers: {_counts(q["outcomes"])}.'
            + ('' if q['stopped_refused'] else ' (the client stopped before it was refused for a second)'))


def _detail(r: dict, settings: dict) -> list[str]:
    every, window, base, h, m = r['all'], r['window'], r.get('baseline'), r['history'], r.get('machine')
    span = r.get('failure_span_s')
    if r['fault'] == 'max-requests':
        out = [f'- The whole load ({r["observed_s"]:.1f} s) ran on a fleet started with GATEWAY_MAX_REQUESTS='
               f'{r["facts"]["max_requests"]}: {r["facts"]["workers_started"]} workers were started (recycled) '
               'during it.']
    else:
        facts = ', '.join(f'{k} {v}' for k, v in (r.get('facts') or {}).items())
        out = [f'- Injected {r["fault_after_s"]:.1f} s into the load; over {r["fault_over_after_s"]:.2f} s after it '
               f'({facts}); observed {r["observed_s"]:.1f} s after it.']
    out += [f'- Failed calls: {"none" if not span else f"from {span[0]:.2f} s to {span[1]:.2f} s after the fault"}; '
            f'first clean {settings.get("hold_s", 1)} s from {_s(r.get("first_clean_s"))} after the fault; recovered '
            f'(no failure or stall after) {_s(r.get("recovery_s"))}.',
            f'- All calls: {_counts(every["outcomes"])}; {every["rps"]} calls/s.']
    if base:
        out.append(f'- Before the fault: {base["calls"]:,} calls, {base["rps"]} calls/s, p50 '
                   f'{_ms(base["latency_ms"]["50"])} ms, p99 {_ms(base["latency_ms"]["99"])} ms, max '
                   f'{_ms(base["latency_ms"]["max"])} ms.')
    out += [f'- Window (0 to {window["to_s"]:.2f} s): {window["calls"]:,} calls, {_counts(window["outcomes"])}; p50 '
            f'{_ms(window["latency_ms"]["50"])} ms, p99 {_ms(window["latency_ms"]["99"])} ms, max '
            f'{_ms(window["latency_ms"]["max"])} ms; longest time with no answer {_ms(window["longest_gap_ms"])} ms.',
            f'- Run history: {h["answered_2xx"]:,} calls answered 2xx, {h["rows"]:,} rows of the key in the store; '
            f'{h["lost_2xx"]} 2xx answers missing ({h["lost_any"]} of all {h["answered_any"]:,} answers with a '
            'request id)' + (f'; last read failed: {h["error"]}' if h.get('error') else '') + '.',
            f'- Management calls after the load stopped: {", ".join(r.get("management_after") or [])}.']
    if m:
        out.append(f'- The machine while the load ran: {m["machine_busy_cores"]} of {m["cpus"]} CPUs busy, '
                   f'{m["block_cores"]} of them this block (fleet, PostgreSQL, Redis, harness; the load generator '
                   f'alone {m["load_generator_cores"]}), {m["other_cores"]} other work; load average '
                   f'{m["loadavg_1m"][0]} -> {m["loadavg_1m"][1]}.')
    if r.get('logged'):
        out.append('- Logged by the masters and workers while the load ran: '
                   + ', '.join(f'{n} {level} lines' for level, n in r['logged'].items()) + '.')
    if r.get('restored_after'):
        out.append(f'- Afterwards the block made the fleet whole: {r["restored_after"]}.')
    if per_s := _per_second(r):
        out.append(f'- Failed calls per second from 1 s before the fault: {per_s}.')
    return out


def _method(settings: dict) -> list[str]:
    rate = settings.get('rate')
    pace = ('as soon as the last answer was read' if not rate else
            f'on a fixed schedule, {rate:,.0f} calls/s in all (one every {settings.get("clients", 1) / rate * 1000:.1f} '
            'ms a client), each call timed from when it was due, so a stall shows in every call due during it '
            '(no coordinated omission)')
    return [f'- The fleet: `fleet up --instances 2` (nginx in front of two gunicorn masters, '
            f'{settings.get("workers", "?")} workers each, pinned with GATEWAY_CPUS=auto; the embedded PostgreSQL and '
            'Redis of fleet.local) in a home of its own; settings: '
            + ', '.join(f'{k}={v}' for k, v in sorted((settings.get('fleet') or {}).items()) if k != 'GATEWAY_HOME')
            + '.',
            f'- The load: {settings.get("clients", "?")} keep-alive HTTP/1.1 clients (one asyncio process, '
            'loadtests/blocks/faults/load.py) '
            + ('straight to the masters, half to each (--via direct: no nginx in the way)'
               if settings.get('via') == 'direct' else 'through nginx') + ', each sending `GET /q/account?aid=<random '
            f'1..{settings.get("max_id", "?")}>` {pace}; every 200 is compared with the row PostgreSQL holds for that '
            'aid (read before the block). A connection error closes the connection and the client opens a new one '
            '10 ms later.',
            f'- One fault at a time, each on a fleet made whole first, with its own API key: '
            f'{settings.get("quiet_s", "?")} s of load, the fault, then load until the fault is over and '
            f'{settings.get("after_s", "?")} s passed without a failed call (at most '
            f'{settings.get("max_observe_s", "?")} s); the load stops, the key\'s run history is read back once it '
            f'stops growing, three management calls are made, and {settings.get("settle_s", "?")} quiet seconds '
            'pass. A fault that leaves the fleet broken (a master nobody restarted) is repaired with `fleet up` '
            'after its observation, and the report says so.',
            '- Faults on one master hit instance i0; i1 keeps serving. max-requests restarts the fleet with '
            f'GATEWAY_MAX_REQUESTS={settings.get("max_requests", "?")} (gunicorn adds a jitter of a tenth) and '
            f'runs the load {settings.get("recycle_window_s", "?")} s: the whole window is the fault, and the '
            'workers started during it are counted.',
            f'- Quota ({settings.get("quota", "?")}): one more client, paced (5 ms between calls), spends the 200 '
            'first; Redis is killed once they are admitted, and the client calls on through the loss until refused '
            'for a whole second.',
            '- Hard rule: no wrong body and no 500, ever. A run that breaks it is marked FAILED.']


def _per_second(r: dict) -> str:
    t = r.get('timeline') or {}
    if not t.get('failed') or not any(t['failed']):
        return ''
    per = round(1 / t['bucket_s'])
    failed_ = t['failed'][max(0, int((t['fault_at_s'] - 1) / t['bucket_s'])):]
    seconds = [sum(failed_[i:i + per]) for i in range(0, len(failed_), per)]
    while seconds and seconds[-1] == 0:
        seconds.pop()
    return ' '.join(str(n) for n in seconds[:40]) + (' ...' if len(seconds) > 40 else '')


def _counts(counts: dict) -> str:
    return ', '.join(f'{k}: {v:,}' for k, v in counts.items()) if counts else '0'


def _bold(n: int) -> str:
    return f'**{n}**' if n else '0'


def _ms(value) -> str:
    return '-' if value is None else f'{value:,.1f}'


def _s(value) -> str:
    return '-' if value is None else f'{value:.2f} s'
