"""results.md of a ``loadtests.servers`` run (and its page, docs/bench/<date>-servers.md), from its results.jsonl and
meta.json: ``python -m loadtests.servers --render <dir>`` or ``python -m loadtests.report <dir>``.

Every number is the median of the rounds with the [min-max] range; a ratio against the reference server is taken
within each round (both ran minutes apart at most) and judged on the worst round. The fleet's guarantees at the end
are read from the code and the servers' documentation, not measured.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path

from . import rundir, stats
from .markdown import environment, table
from .system import REPO

DOCS = REPO / 'docs' / 'bench'
# The goals under slow clients (issue 25, part 1), applied to each count measured here.
HEALTH_P99_GOAL = 2.0       # /health p99 at most 2x its quiet p99
LOOKUP_KEPT_GOAL = 0.9      # the lookup's req/s at least 0.9x its quiet level


def write(run_dir: Path) -> Path:
    return rundir.write_report(run_dir, render)


def page_name(meta: dict) -> str:
    return f'{(meta.get("started_at") or "undated")[:10]}-servers.md'


def render(meta: dict, runs: list[dict], raw: str | None = None) -> str:
    settings = meta.get('settings', {})
    names = [t['name'] for t in meta.get('targets', [])]
    reference = names[0] if names else settings.get('reference')
    measured = [r for r in runs if r.get('kind') == 'run']
    out = [f'# The server chosen by measurement ({(meta.get("started_at") or "")[:10]})', '']
    out += _intro(meta, settings, reference, raw)
    out += _servers(meta)
    out += _throughput(measured, names, reference)
    out += _single_caller(measured, names, reference)
    out += _slow_clients(measured, names, settings)
    out += _checks(runs, measured)
    out += GUARANTEES
    out += environment(meta)
    return '\n'.join(out).rstrip() + '\n'


def _intro(meta: dict, settings: dict, reference: str | None, raw: str | None) -> list[str]:
    out = []
    if settings.get('quick'):
        out += ['**A smoke run (`--quick`): one round of 2 s per run. Its numbers show the harness works, not how '
                'the servers compare.**', '']
    out += [f'One interleaved run: {settings.get("rounds", "?")} round(s); in each, every test ran on every server '
            'in an order rotated each round, the other servers stopped (SIGSTOP) meanwhile. Each server is one '
            f'worker ({settings.get("threads", 8)} threads) pinned with its whole process tree to CPU '
            f'{settings.get("server_cpu", "?")}; wrk, the /health prober and the slow clients ran on CPU '
            f'{settings.get("load_cpu", "?")}, PostgreSQL and Redis (the embedded default) on CPU '
            f'{settings.get("pg_cpu", "?")}. The same application (`fleet.app:create_app`), settings, store and '
            'data for all.', '',
            f'- **lookup**: the demo\'s `account` query (primary key, aid drawn from 1..1,000,000) with the demo '
            f'key; **hit**: `account_cached` (the same SQL, cache_ttl {settings.get("cache_ttl", "?")}) over a hot '
            f'set of {settings.get("hot_set", 0):,} accounts, every call a cache hit after the warm-up.',
            f'- wrk -c{settings.get("connections", 32)} for {settings.get("duration_s", "?")} s (req/s, and the '
            'server\'s CPU per call from /proc/<pid>/stat: all its processes, and its workers alone); wrk -c1 for '
            f'{settings.get("c1_duration_s", "?")} s (one caller\'s p50).',
            f'- /health: one client, back to back on a kept-alive connection, {settings.get("health_duration_s")} s; '
            f'a call unanswered in {settings.get("probe_timeout_s")} s is a timeout and ranks above every answer '
            '(a p99 of "stalled" means more than 1% of the calls got no answer in time).',
            f'- slow clients: N connections ({", ".join(str(n) for n in settings.get("slow_counts", []))}) that '
            'sent `GET /health HTTP/1.1\\r\\nHost: ...\\r\\n` and then nothing, held by another process while '
            f'/health was probed and the lookup ran at -c32 for {settings.get("slow_duration_s")} s (wrk\'s '
            f'timeout {settings.get("probe_timeout_s")} s); then released, and the time until /health answered '
            'again.',
            f'- Ratios are against `{reference}`, taken within each round and given as median [min-max]; "worst '
            'round" is the lowest ratio of a throughput and the highest of a latency or a cost.', '']
    if meta.get('wall_s'):
        out += [f'The run took {meta["wall_s"]:.0f} s in all.', '']
    if raw:
        out += [f'The run: [`{raw}`]({raw}) (results.jsonl, meta.json, results.md; `python -m loadtests.report '
                f'{raw}` renders it again).', '']
    return out


def _servers(meta: dict) -> list[str]:
    found = meta.get('targets', [])
    out = ['## Servers', '', *table(['Server', 'What', 'Parser that refused a bad request line', 'gunicorn_h1c mapped',
                                     'X-Cache of 2 calls'],
                                    [[f'`{t["name"]}`', t.get('description', ''), t.get('checks', {}).get('parser', '?'),
                                      t.get('checks', {}).get('h1c_mapped_in', '?'),
                                      ', '.join(t.get('checks', {}).get('x_cache', []))] for t in found], blank=False),
           '', *(f'- `{t["name"]}`: `{t.get("command", "")}`' for t in found),
           *(f'- `{name}`: **left out**: {why}' for name, why in meta.get('skipped', {}).items()),
           '', 'The parser check sends `GET /hea lth HTTP/1.1`: gunicorn_h1c refuses it as "Invalid Request Line", '
           'gunicorn\'s Python parser as "Invalid HTTP Version", granian with an empty 400.']
    if any(t['name'] == 'current-h1c' for t in found):
        out[-1] += (' In `current-h1c` the C parser reads only the heads that go to a thread: LeanRequest.parse '
                    'defers to it (`self._use_fast and not self.plain_only`), while the heads read on the worker\'s '
                    'loop (`LeanParser.read_ready`, a kept-alive connection whose whole head came in one read) stay '
                    'on fleet/lean_request.py\'s reader.')
    return out + ['']


def _versus(runs, test, name, reference, value, fmt=None, at_most=False, cell=None) -> list[str]:
    """A server's median [min-max] of one test, and its ratio to the reference's paired per round."""
    mine = _runs(runs, test, name)
    shown = stats.show(stats.median_range([value(r) for r in mine]), *([fmt] if fmt else []))
    ratio = '-' if name == reference else _paired_text(_pair(mine, _runs(runs, test, reference), value, value),
                                                       at_most=at_most)
    return [shown, *(cell(mine) if cell else []), ratio]


def _throughput(runs: list[dict], names: list[str], reference: str | None) -> list[str]:
    def workers(mine):
        return [stats.show(stats.median_range([r.get('worker_cpu_us_per_call') for r in mine]))]
    return ['## Throughput and CPU per call (wrk -c32)', '',
            *table(['Server', 'lookup req/s', f'vs `{reference}`', 'hit req/s', f'vs `{reference}`'],
                   [[f'`{n}`', *[c for test in ('lookup', 'hit') for c in
                                 _versus(runs, test, n, reference, _rps, stats.fmt_rps)]] for n in names]),
            'CPU per call, µs (all the server\'s processes; its workers alone):', '',
            *table(['Server', 'lookup', 'lookup, workers', f'vs `{reference}`', 'hit', 'hit, workers',
                    f'vs `{reference}`'],
                   [[f'`{n}`', *[c for test in ('lookup', 'hit') for c in
                                 _versus(runs, test, n, reference, _cpu, at_most=True, cell=workers)]] for n in names])]


def _single_caller(runs: list[dict], names: list[str], reference: str | None) -> list[str]:
    return ['## One caller (wrk -c1): p50, ms', '',
            *table(['Server', 'lookup', f'vs `{reference}`', 'hit', f'vs `{reference}`'],
                   [[f'`{n}`', *[c for test in ('lookup-c1', 'hit-c1') for c in
                                 _versus(runs, test, n, reference, _p50, stats.fmt_ms, at_most=True)]]
                    for n in names])]


def _slow_clients(runs: list[dict], names: list[str], settings: dict) -> list[str]:
    rows = []
    for name in names:
        quiet = _runs(runs, 'health', name)
        rows.append([f'`{name}`', 0, '-', _health_cell(quiet, 'p50_ms'), _health_cell(quiet, 'p99_ms'),
                     sum(r['health']['timeouts'] for r in quiet), '-',
                     stats.show(stats.median_range([r['rps'] for r in _runs(runs, 'lookup', name)]), stats.fmt_rps),
                     '-', '-', '-'])
        for count in settings.get('slow_counts', []):
            if slow := _runs(runs, f'slow-{count}', name):
                p99 = _pair(slow, quiet, lambda r: r['health']['p99_ms'], lambda r: r['health']['p99_ms'])
                kept = _pair(slow, _runs(runs, 'lookup', name), lambda r: r['lookup']['rps'], _rps)
                rows.append([f'`{name}`', f'{count:,}', ', '.join(f'{r["held"].get("connected")}/{count}' for r in slow),
                             _health_cell(slow, 'p50_ms'), _health_cell(slow, 'p99_ms'),
                             sum(r['health']['timeouts'] for r in slow),
                             _paired_text(p99, HEALTH_P99_GOAL, at_most=True),
                             stats.show(stats.median_range([r['lookup']['rps'] for r in slow]), stats.fmt_rps),
                             _paired_text(kept, LOOKUP_KEPT_GOAL), '; '.join(_fate(r['released']) for r in slow),
                             ', '.join('-' if r['recovery_s'] is None else f'{r["recovery_s"]:.2f}' for r in slow)])
    return ['## /health and slow clients', '',
            *table(['Server', 'Slow clients', 'held', '/health p50, ms', '/health p99, ms', 'timeouts',
                    f'p99 vs quiet (goal <= {HEALTH_P99_GOAL:g}x)', 'lookup req/s',
                    f'vs quiet -c32 (goal >= {LOOKUP_KEPT_GOAL:g}x)', 'what the server did with them',
                    'back after release, s'], rows),
            '"held": connections that connected and sent their partial head, per round: connected as '
            'the client sees it (the kernel completed the handshake, whether or not the server accepted it); '
            'the rest were still waiting when the holder stopped trying, after 3 s. "What '
            'the server did": at the release, how many were still open, closed by the server, answered '
            '(with the status line seen) or reset. The issue\'s goals (10,000 slow connections, within 2x '
            'the idle p99 and at least 0.9x the quiet throughput) are applied here to each count measured.', '']


def _checks(all_runs: list[dict], runs: list[dict]) -> list[str]:
    wrk_runs = [r for r in runs if 'rps' in r] + [r['lookup'] for r in runs if isinstance(r.get('lookup'), dict)]
    checked = sum(r.get('bodies', {}).get('checked', 0) for r in wrk_runs)
    wrong = sum(r.get('bodies', {}).get('bad_body', 0) + r.get('bodies', {}).get('unasked', 0) for r in wrk_runs)
    sampled = [r['sampled'] for r in runs if r.get('sampled')]
    sampled_wrong = [w for s in sampled for w in s['wrong']]
    failed = [r for r in runs if 'rps' in r and not r.get('ok', True)]
    noisy = [r for r in runs if (r.get('other_cores') or 0) > stats.NOISY_CORES]
    gone = [r for r in all_runs if r.get('kind') == 'gone']
    out = ['## Checks', '',
           f'- Bodies under load: {checked:,} answers checked by wrk/random_aid.lua (each 200 holds exactly the row '
           f'its call asked for), {wrong} wrong; after each -c32 run {sum(s["checked"] for s in sampled)} answers '
           f'read whole and compared with PostgreSQL\'s rows (and, for the hit, X-Cache: HIT), '
           f'{len(sampled_wrong)} wrong{": " + str(sampled_wrong[:3]) if sampled_wrong else ""}.',
           f'- Runs with an error outside the slow-client tests (a non-2xx, a socket error): {len(failed)}'
           + ('; ' + '; '.join(f'{r["test"]} of {r["server"]} round {r.get("round")}: {", ".join(r["problems"])}'
                               for r in failed[:5]) if failed else '') + '.',
           f'- Runs during which other processes took more than {stats.NOISY_CORES} of a core: {len(noisy)}'
           + (' (' + ', '.join(f'{r["test"]} of {r["server"]} round {r.get("round")}: {r["other_cores"]:.2f}'
                               for r in noisy[:8]) + ')' if noisy else '') + '.']
    if gone:
        out.append(f'- Servers that exited during the run: {", ".join(sorted({r["server"] for r in gone}))}.')
    return out + ['']


# --- reading the records ---------------------------------------------------------------------

def _runs(runs: list[dict], test: str, server: str | None) -> list[dict]:
    return [r for r in runs if r.get('test') == test and r.get('server') == server]


def _rps(run: dict):
    return run.get('rps')


def _cpu(run: dict):
    return run.get('cpu_us_per_call')


def _p50(run: dict):
    return run['latency_us']['50'] / 1000 if run.get('requests') else None


def _pair(top: list[dict], bottom: list[dict], top_value, bottom_value) -> dict:
    """{round: top / bottom} of the rounds both have; a top of None over a real bottom (a stalled /health p99)
    is infinite, and a zero top over a real bottom (no lookup answered) is 0."""
    bottoms = {r.get('round'): bottom_value(r) for r in bottom}
    out = {}
    for run in top:
        n = run.get('round')
        b = bottoms.get(n)
        if not b:
            continue
        value = top_value(run)
        out[n] = math.inf if value is None else value / b
    return out


def _paired_text(ratios: dict, goal: float | None = None, at_most: bool = False) -> str:
    if not ratios:
        return '-'
    values = list(ratios.values())
    if all(math.isinf(v) for v in values):
        return 'stalled in every round' + ('; misses' if goal is not None else '')
    med, lo, hi = statistics.median(values), min(values), max(values)
    text = f'{_x(med)} [{_x(lo)}-{_x(hi)}]'
    worst = hi if at_most else lo
    if goal is not None:
        met = worst <= goal if at_most else worst >= goal
        text += f'; worst {_x(worst)}: {"meets" if met else "misses"}'
    elif len(values) > 1:
        text += f'; worst {_x(worst)}'
    return text


def _x(value: float) -> str:
    return 'stalled' if math.isinf(value) else f'{value:.2f}×'


def _health_cell(runs: list[dict], key: str) -> str:
    values = [r['health'][key] for r in runs]
    if not values:
        return '-'
    if any(v is None for v in values):
        answered = [v for v in values if v is not None]
        return f'stalled in {len(values) - len(answered)} of {len(values)}' + (
            f' (else {stats.show(stats.median_range(answered), stats.fmt_ms)})' if answered else '')
    return stats.show(stats.median_range(values), stats.fmt_ms)


def _fate(released: dict) -> str:
    if not released:
        return '?'
    parts = [f'{released.get(k, 0)} {k}' for k in ('open', 'closed', 'answered', 'reset') if released.get(k)]
    answers = released.get('answers') or {}
    if answers:
        parts.append('(' + ', '.join(f'{v}× {k}' for k, v in answers.items()) + ')')
    return ' '.join(parts) or 'none held'


# --- what is not measured --------------------------------------------------------------------

GUARANTEES = """## The fleet's guarantees, server by server (read, not measured)

From fleet/worker.py's docstring, fleet/gunicorn_conf.py, gunicorn 27's code and granian 2.8.9's (its CLI's `--help`,
`granian/server/common.py` and `mp.py`). "gunicorn gthread" is gunicorn's own ThreadWorker under
fleet/gunicorn_conf.py, with or without gunicorn-h1c (the parser changes none of these).

| Guarantee | current worker | gunicorn gthread | granian 2.8.9 |
|---|---|---|---|
| One worker per core, pinned | yes: `pre_fork` gives each worker the core of `GATEWAY_CPUS` holding the fewest live workers (a respawn takes its predecessor's), `post_fork` pins it (`sched_setaffinity`) | yes: the same config hooks, whatever the worker class | no: no pre/post-fork hooks on its command line (its hooks, `on_startup`/`on_reload`/`on_shutdown`, run in the main process and only when embedded); `taskset` pins the whole tree to one CPU set, which its workers share |
| Balanced connections across a master's workers | yes: one shared socket, a worker holding more than the least loaded sibling + 1 stops accepting, and excess connections are moved with `Connection: close` | no: whichever worker wakes first accepts a burst of keep-alive connections for their life (shares of 0.00+0.94 measured with two); `GATEWAY_REUSE_PORT=on` spreads by hash, and resets the queue of a worker that leaves | no: the workers share one listening socket, each accepts on a thread of its own until its backpressure, with no balancing between them (granian discussion #886) |
| Graceful reload (SIGHUP), no failed call | yes: an old worker keeps serving until a younger sibling serves (at most 30 s) | partly: the new workers fork and the old ones stop at once; the shared socket keeps the queue, but every call waits while the new ones load the application (about a second) | partly: workers are respawned one at a time: the new one started, the old one terminated `--respawn-interval` (3.5 s) later, whether or not the new one has loaded the application by then; the shared socket keeps the queue |
| Recycling (max_requests), no failed call | yes: a worker leaves at its count only while every sibling serves, one at a time, 2 s apart | no: a worker leaves at its count whatever its siblings do (with one worker, every call waits for the replacement's boot) | no request count: `--workers-lifetime` (60 s at least) and `--workers-max-rss` respawn as a reload does |
| Workers when the master dies | none left: `PR_SET_PDEATHSIG` sends each SIGTERM; an orphan shuts the socket down, closes its idle keep-alive connections, finishes what it holds and exits | stop: the same PDEATHSIG (a config hook), then gunicorn's graceful stop, without the current worker's socket shutdown and idle-connection close | orphans keep serving: workers are `multiprocessing` processes with no parent-death signal (checked by hand with 2.8.9: the main process SIGKILLed, its worker, now a child of init, still answered /health) |
| Metrics across workers (prometheus multiprocess) | yes: the config makes `PROMETHEUS_MULTIPROC_DIR` per master and marks a dead worker (`child_exit`) | yes: the same config | not wired: nothing sets `PROMETHEUS_MULTIPROC_DIR` (whoever starts granian must), and no hook marks a dead worker's live gauges; granian's own `--metrics` exporter counts the server, on a port of its own, not the application's metrics |
| The crash spool (run history) | yes: the spool is the application's (gateway/store/spool.py); a dead worker is respawned and its replacement stores the spool at start; a graceful stop closes the application (`worker_exit`: the history's last batch stored) | yes: the same | partly: the spool works, but a worker that dies stops the whole server unless `--respawn-failed-workers` (off by default; a second death within 5.5 s stops it anyway); no worker-exit hook closes the application at a graceful stop (the spool keeps its runs for the next start), and /ready's drain at a stop (`post_worker_init`) is not wired |
| Slow clients (measured above) | no thread until the request is whole: the worker's loop reads heads and bodies (fleet/front.py); absolute head and body deadlines (`GATEWAY_HEAD_TIMEOUT_S` 10 s, `GATEWAY_BODY_TIMEOUT_S` 30 s, 408), at most `GATEWAY_MAX_READING_PER_CLIENT` (64) being read per address and worker (the rest closed at once: the "closed" above, all these slow clients come from one address), `GATEWAY_MAX_CONNECTIONS` in all with the longest-reading closed to make room | a partial head takes a thread (gthread hands a readable connection to the pool, whose read then blocks), no head deadline | heads are read by its Rust runtime, not by the blocking threads; `--http1-header-read-timeout` (30 s by default) closes a slow head; `--backpressure` (default backlog / workers = 1,024) bounds what a worker takes at once |
"""
GUARANTEES = GUARANTEES.splitlines() + ['']
