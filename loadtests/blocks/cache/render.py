"""The cache block's results.md, and its page in docs/bench (``publish``): first the verdicts against issue 14's
goals (paired per-round ratios judged on the worst round; the invalidation timings on percentiles pooled over every
round), then what a hit costs the gateway, the purge and write timings, and the closed-loop report of the three
targets (loadtests/blocks/oltp/render.py)."""
from __future__ import annotations

from pathlib import Path

from ... import rundir
from ...markdown import table
from ...stats import median_range, paired_ratios, pct, percentile, rps, show_paired, show_range, spread
from ..oltp.render import render as closed_loop
from . import CACHED, P50_GOAL, PEER, PEER_GOAL, THROUGHPUT_GOAL, UNCACHED, WRITE_BOUND_MS

DOCS = Path(__file__).resolve().parents[3] / 'docs' / 'bench'
ISSUE_PURGES = 1000


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


def _pooled(runs: list[dict], kind: str, field: str = 'samples_ms') -> list[float]:
    return [s for r in runs if r.get('kind') == kind for s in r.get(field, [])]


def _p(samples: list[float]) -> str:
    return f'p50 {percentile(samples, 50):.1f} ms, p99 {percentile(samples, 99):.1f} ms'


def verdicts(meta: dict, runs: list[dict]) -> list[str]:
    """One line per goal of issue 14: the measure, and whether it is met."""
    cached32, uncached32, peer32 = _cell(runs, CACHED, 32), _cell(runs, UNCACHED, 32), _cell(runs, PEER, 32)
    out = ['- Throughput cached / uncached, 32 connections, paired per round: '
           + show_paired(paired_ratios(cached32, uncached32, rps), goal=THROUGHPUT_GOAL),
           '- Single-caller p50 cached / uncached, paired per round: '
           + show_paired(paired_ratios(_cell(runs, CACHED, 1), _cell(runs, UNCACHED, 1), pct('50')), goal=P50_GOAL,
                         at_most=True),
           f'- Throughput cached / QueryAPIGate {"0.43.0 " if peer32 else ""}with its Redis cache, 32 connections, '
           'paired per round: ' + (show_paired(paired_ratios(cached32, peer32, rps), goal=PEER_GOAL)
                                   if peer32 else 'not measured (no peer in this run)')]
    hit, miss = (median_range([r.get('cpu_us_per_call') for r in cell]) for cell in (cached32, uncached32))
    if hit and miss:
        out.append(f'- Gateway CPU per call at 32 connections (master + worker): a hit {show_range(hit, 0)} µs, an '
                   f'uncached call {show_range(miss, 0)} µs; paired per round: '
                   + show_paired(paired_ratios(cached32, uncached32, lambda r: r.get('cpu_us_per_call'))))
    purges, writes = _pooled(runs, 'purges'), _pooled(runs, 'writes')
    if purges:
        short = f' (fewer than the issue\'s {ISSUE_PURGES:,}: not a result)' if len(purges) < ISSUE_PURGES else ''
        out.append(f'- A purge\'s call to no worker serving the old entry, {meta.get("settings", {}).get("workers", "?")}'
                   f' workers, {len(purges):,} purges pooled{short}: {_p(purges)}, max {max(purges):.1f} ms')
    if writes:
        p99 = percentile(writes, 99)
        out.append(f'- A write\'s answer to no worker serving the older body, {len(writes):,} writes pooled: '
                   f'{_p(writes)}, max {max(writes):.1f} ms; {"meets" if p99 <= WRITE_BOUND_MS else "misses"} p99 <= '
                   f'{WRITE_BOUND_MS:.0f} ms' + ('' if max(writes) <= WRITE_BOUND_MS else
                                                 f' (the max does not: {max(writes):.1f} ms)'))
    wrong = sum(len(r.get('wrong', [])) for r in runs if r.get('kind') in ('purges', 'writes'))
    bad = [r for r in runs if r.get('kind') in ('run', 'warmup', 'floor') and not r.get('ok', True)]
    out.append(f'- Answers: {len(bad)} wrk run(s) with a non-2xx, a socket error or a wrong body; {wrong} purge or '
               'write check(s) wrong' + (' - **the block FAILED**' if bad or wrong else ''))
    return out


def section(meta: dict, runs: list[dict], raw: str | None = None) -> list[str]:
    settings = meta.get('settings', {})
    git = meta.get('versions', {}).get('git') or {}
    load = meta.get('load_average') or {}
    timings = [r for r in runs if r.get('kind') in ('purges', 'writes')]
    server = meta.get('invalidation_server') or {}
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
    if load:
        out += ['Load average (1, 5, 15 min) at the start: ' + ', '.join(map(str, load.get('start', [])))
                + ('; at the end: ' + ', '.join(map(str, load['end'])) if load.get('end') else '')
                + ' (the block\'s own processes count in it; each run\'s "Other cores" in the CPU table below says '
                'what else ran beside it).', '']
    out += ['### Verdicts', '', *verdicts(meta, runs), '', '### What a call costs the gateway', '',
            'CPU seconds of the gateway\'s process tree (master + worker) and of the worker alone, over the calls '
            'served; median [min-max] of the rounds.', '',
            *table(['Connections', 'Target', 'req/s', 'CPU per call (µs)', 'worker CPU per call (µs)'],
                   [[c, t, *[spread(cell, f, 0) for f in ('rps', 'cpu_us_per_call', 'worker_cpu_us_per_call')]]
                    for c in settings.get('connections', []) for t in (UNCACHED, CACHED)
                    if (cell := _cell(runs, t, c))]),
            '### Purges and writes: when no worker serves the old answer', '',
            f'On {server.get("description") or "a master with " + str(settings.get("workers", "?")) + " workers"} '
            f'({server.get("base_url", "?")}), every call on a new '
            'connection. Purge: `DELETE /api/v1/cache/entries?query=account_cached`, timed from its call to its '
            'answer (it returns once every live worker acknowledged; were one pending, until the cache bus\'s '
            'acknowledgements in Redis show it). Write: the saved write `deposit` into a cached account, timed from '
            'its answer to the moment every live worker acknowledged its purge (0 when all had before the answer, '
            'as X-Cache-Invalidated `pending=0` says). Before each, the entry was cached (some of '
            f'{settings.get("fill_calls", "?")} calls hit); after a purge the next call must miss; after a write '
            f'{settings.get("checks", "?")} calls must answer the balance written.', '']

    def ms(s: list[float]) -> list[str]:
        return [f'{percentile(s, 50):.1f}', f'{percentile(s, 99):.1f}', f'{max(s):.1f}'] if s else ['-'] * 3
    rows = [[r['round'], r['kind'], r.get('live_workers', '?'), len(r.get('samples_ms', [])),
             *ms(r.get('samples_ms', [])), r.get('pending_at_answer', 0), len(r.get('wrong', []))] for r in timings]
    out += table(['Round', 'Kind', 'Live workers', 'n', 'p50 ms', 'p99 ms', 'max ms', 'answered with a worker pending',
                  'wrong'], rows, blank=False)
    for kind in ('purges', 'writes'):
        if s := _pooled(runs, kind):
            mine = [r for r in timings if r['kind'] == kind]
            out.append(f'| all | {kind} | | {len(s)} | ' + ' | '.join(ms(s)) + f' | '
                       f'{sum(r.get("pending_at_answer", 0) for r in mine)} | '
                       f'{sum(len(r.get("wrong", [])) for r in mine)} |')
    out.append('')
    calls = {'the purge call': _pooled(runs, 'purges', 'call_ms'), 'the write call': _pooled(runs, 'writes', 'write_ms'),
             'of it the invalidation\'s wait (X-Cache-Invalidated ms)': _pooled(runs, 'writes', 'waited_ms')}
    if calls['the purge call'] or calls['the write call']:
        out += ['Call durations, pooled: ' + '; '.join(f'{what} {_p(v)}' for what, v in calls.items() if v) + '.', '']
    problems = [(r['round'], r['kind'], w) for r in timings for w in r.get('wrong', [])]
    if problems:
        out += ['Wrong (first 20):', ''] + [f'- round {n} {k}: {w}' for n, k, w in problems[:20]] + ['']
    return out
