"""The cache block's results.md, and its page in docs/bench (``publish``): first the verdicts against issue 14's
goals (paired per-round ratios judged on the worst round; the invalidation timings on percentiles pooled over every
round), then what a hit costs the gateway, the purge and write timings, and the closed-loop report of the three
targets (loadtests/blocks/oltp/render.py)."""
from __future__ import annotations

from pathlib import Path

from ... import rundir
from ...markdown import table_head
from ...stats import median_range, paired_ratios, pct, percentile, rps, show_paired, show_range
from ..oltp.render import render as closed_loop
from . import CACHED, P50_GOAL, PEER, PEER_GOAL, THROUGHPUT_GOAL, UNCACHED, WRITE_BOUND_MS

DOCS = Path(__file__).resolve().parents[3] / 'docs' / 'bench'
ISSUE_PURGES = 1000


def write(run_dir: Path) -> Path:
    return rundir.write_report(run_dir, render)


def publish(run_dir: Path, docs: Path = DOCS) -> Path:
    """Keep the run beside the reports (docs/bench/raw/<folder>/) and write docs/bench/<date>-cache.md
    (<date>-cache-2.md, -3, ... when that day's page is another run's: a page is never overwritten by another)."""
    raw = f'raw/{Path(run_dir).name}/'

    def page_name(meta: dict) -> str:
        date = (meta.get("started_at") or "undated")[:10]
        name, n = f'{date}-cache.md', 1
        while (docs / name).exists() and raw not in (docs / name).read_text():
            n += 1
            name = f'{date}-cache-{n}.md'
        return name
    return rundir.publish(run_dir, docs, render, page_name)


def render(meta: dict, runs: list[dict], raw: str | None = None) -> str:
    return closed_loop(meta, runs, section(meta, runs, raw))


def _cell(runs: list[dict], target: str, connections: int) -> list[dict]:
    return [r for r in runs if r.get('kind') == 'run' and r['target'] == target and r['connections'] == connections]


def _pooled(runs: list[dict], kind: str) -> list[float]:
    return [s for r in runs if r.get('kind') == kind for s in r.get('samples_ms', [])]


def verdicts(meta: dict, runs: list[dict]) -> list[str]:
    """One line per goal of issue 14: the measure, and whether it is met."""
    out = []
    cached32, uncached32, peer32 = _cell(runs, CACHED, 32), _cell(runs, UNCACHED, 32), _cell(runs, PEER, 32)
    cached1, uncached1 = _cell(runs, CACHED, 1), _cell(runs, UNCACHED, 1)
    out.append('- Throughput cached / uncached, 32 connections, paired per round: '
               + show_paired(paired_ratios(cached32, uncached32, rps), goal=THROUGHPUT_GOAL))
    out.append('- Single-caller p50 cached / uncached, paired per round: '
               + show_paired(paired_ratios(cached1, uncached1, pct('50')), goal=P50_GOAL, at_most=True))
    out.append(f'- Throughput cached / QueryAPIGate {"0.43.0 " if peer32 else ""}with its Redis cache, 32 connections, '
               'paired per round: ' + (show_paired(paired_ratios(cached32, peer32, rps), goal=PEER_GOAL)
                                       if peer32 else 'not measured (no peer in this run)'))
    hit = median_range([r.get('cpu_us_per_call') for r in cached32])
    miss = median_range([r.get('cpu_us_per_call') for r in uncached32])
    if hit and miss:
        out.append(f'- Gateway CPU per call at 32 connections (master + worker): a hit {show_range(hit, 0)} µs, an '
                   f'uncached call {show_range(miss, 0)} µs; paired per round: '
                   + show_paired(paired_ratios(cached32, uncached32, lambda r: r.get('cpu_us_per_call'))))
    settings = meta.get('settings', {})
    purges = _pooled(runs, 'purges')
    if purges:
        short = (f' (fewer than the issue\'s {ISSUE_PURGES:,}: not a result)' if len(purges) < ISSUE_PURGES else '')
        out.append(f'- A purge\'s call to no worker serving the old entry, {settings.get("workers", "?")} workers, '
                   f'{len(purges):,} purges pooled{short}: p50 {percentile(purges, 50):.1f} ms, p99 '
                   f'{percentile(purges, 99):.1f} ms, max {max(purges):.1f} ms')
    writes = _pooled(runs, 'writes')
    if writes:
        p99 = percentile(writes, 99)
        out.append(f'- A write\'s answer to no worker serving the older body, {len(writes):,} writes pooled: p50 '
                   f'{percentile(writes, 50):.1f} ms, p99 {p99:.1f} ms, max {max(writes):.1f} ms; '
                   f'{"meets" if p99 <= WRITE_BOUND_MS else "misses"} p99 <= {WRITE_BOUND_MS:.0f} ms'
                   + ('' if max(writes) <= WRITE_BOUND_MS else f' (the max does not: {max(writes):.1f} ms)'))
    wrong = sum(len(r.get('wrong', [])) for r in runs if r.get('kind') in ('purges', 'writes'))
    bad = [r for r in runs if r.get('kind') in ('run', 'warmup', 'floor') and not r.get('ok', True)]
    out.append(f'- Answers: {len(bad)} wrk run(s) with a non-2xx, a socket error or a wrong body; {wrong} purge or '
               'write check(s) wrong' + (' - **the block FAILED**' if bad or wrong else ''))
    return out


def section(meta: dict, runs: list[dict], raw: str | None = None) -> list[str]:
    settings = meta.get('settings', {})
    git = meta.get('versions', {}).get('git') or {}
    out = [f'## Response cache (issue 14): commit {git.get("commit", "?")}'
           f'{" (dirty: not a result)" if git.get("dirty") else ""}', '']
    if raw:
        out += [f'Raw data: [`{raw}`]({raw}) (results.jsonl, meta.json; results.md renders again from them).', '']
    out += [f'    {meta.get("command", "?")}', '',
            f'One gateway worker, hot set of {settings.get("hot", 0):,} accounts, cache_ttl '
            f'{settings.get("cache_ttl", "?")}; `uncached` is GET /q/account, `cached` GET /q/account_cached on the '
            'same process, `peer` QueryAPIGate 0.43.0 with its Redis response cache and the same TTL. Ratios are '
            'paired per round (both runs of a round, minutes apart at most) and a goal is met only when the worst '
            'round meets it; the invalidation timings pool every round\'s samples.', '']
    load = meta.get('load_average') or {}
    if load:
        out += ['Load average (1, 5, 15 min) at the start: ' + ', '.join(map(str, load.get('start', [])))
                + ('; at the end: ' + ', '.join(map(str, load['end'])) if load.get('end') else '')
                + ' (the block\'s own processes count in it; each run\'s "Other cores" in the CPU table below says '
                'what else ran beside it).', '']
    out += ['### Verdicts', ''] + verdicts(meta, runs) + ['']

    out += ['### What a call costs the gateway', '',
            'CPU seconds of the gateway\'s process tree (master + worker) and of the worker alone, over the calls '
            'served; median [min-max] of the rounds.', '']
    out += table_head(['Connections', 'Target', 'req/s', 'CPU per call (µs)', 'worker CPU per call (µs)'])
    for c in settings.get('connections', []):
        for t in (UNCACHED, CACHED):
            cell = _cell(runs, t, c)
            if cell:
                out.append(f'| {c} | {t} | {show_range(median_range([r["rps"] for r in cell]), 0)} | '
                           f'{show_range(median_range([r.get("cpu_us_per_call") for r in cell]), 0)} | '
                           f'{show_range(median_range([r.get("worker_cpu_us_per_call") for r in cell]), 0)} |')
    out.append('')

    timings = [r for r in runs if r.get('kind') in ('purges', 'writes')]
    server = meta.get('invalidation_server') or {}
    out += ['### Purges and writes: when no worker serves the old answer', '',
            f'On {server.get("description") or "a master with " + str(settings.get("workers", "?")) + " workers"} '
            f'({server.get("base_url", "?")}), every call on a new '
            'connection. Purge: `DELETE /api/v1/cache/entries?query=account_cached`, timed from its call to its '
            'answer (it returns once every live worker acknowledged; were one pending, until the cache bus\'s '
            'acknowledgements in Redis show it). Write: the saved write `deposit` into a cached account, timed from '
            'its answer to the moment every live worker acknowledged its purge (0 when all had before the answer, '
            'as X-Cache-Invalidated `pending=0` says). Before each, the entry was cached (some of '
            f'{settings.get("fill_calls", "?")} calls hit); after a purge the next call must miss; after a write '
            f'{settings.get("checks", "?")} calls must answer the balance written.', '']
    out += table_head(['Round', 'Kind', 'Live workers', 'n', 'p50 ms', 'p99 ms', 'max ms',
                       'answered with a worker pending', 'wrong'])
    for r in timings:
        s = r.get('samples_ms', [])
        cols = [f'{percentile(s, 50):.1f}', f'{percentile(s, 99):.1f}', f'{max(s):.1f}'] if s else ['-'] * 3
        out.append(f'| {r["round"]} | {r["kind"]} | {r.get("live_workers", "?")} | {len(s)} | ' + ' | '.join(cols)
                   + f' | {r.get("pending_at_answer", 0)} | {len(r.get("wrong", []))} |')
    for kind in ('purges', 'writes'):
        s = _pooled(runs, kind)
        if s:
            out.append(f'| all | {kind} | | {len(s)} | {percentile(s, 50):.1f} | {percentile(s, 99):.1f} | '
                       f'{max(s):.1f} | {sum(r.get("pending_at_answer", 0) for r in timings if r["kind"] == kind)} | '
                       f'{sum(len(r.get("wrong", [])) for r in timings if r["kind"] == kind)} |')
    out.append('')
    calls = [c for r in timings if r['kind'] == 'purges' for c in r.get('call_ms', [])]
    written = [c for r in timings if r['kind'] == 'writes' for c in r.get('write_ms', [])]
    waited = [c for r in timings if r['kind'] == 'writes' for c in r.get('waited_ms', [])]
    if calls or written:
        out.append('Call durations, pooled: '
                   + '; '.join(f'{what} p50 {percentile(v, 50):.1f} ms, p99 {percentile(v, 99):.1f} ms'
                               for what, v in (('the purge call', calls), ('the write call', written),
                                               ('of it the invalidation\'s wait (X-Cache-Invalidated ms)', waited))
                               if v) + '.')
        out.append('')
    problems = [(r['round'], r['kind'], w) for r in timings for w in r.get('wrong', [])]
    if problems:
        out += ['Wrong (first 20):', ''] + [f'- round {n} {k}: {w}' for n, k, w in problems[:20]] + ['']
    return out
