"""results.md from a block's results.jsonl and meta.json - regenerate any time:

    python -m loadtests.report loadtests/results/oltp-20261130-031500

Every cell is the median of its rounds with the [min-max] range. A difference between two targets counts only when
their ranges don't overlap: if two targets were really the same, all orderings of their 2n results would be equally
likely and the ranges would be clear of each other in 2 of C(2n, n) - under 1% for 5 rounds, 33% for 2.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path


def median_range(values):
    """(median, min, max) of the values that are not None; None when there are none."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


def show_range(stat, digits: int = 1) -> str:
    """``median [min-max]``, or '-'."""
    if stat is None:
        return '-'
    return f'{stat[0]:,.{digits}f} [{stat[1]:,.{digits}f}-{stat[2]:,.{digits}f}]'


def load(run_dir: Path) -> tuple[dict, list[dict]]:
    meta = json.loads((run_dir / 'meta.json').read_text()) if (run_dir / 'meta.json').exists() else {}
    runs = []
    path = run_dir / 'results.jsonl'
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                runs.append(json.loads(line))
    return meta, runs


# --------------------------------------------------------------------------------------
# Numbers
# --------------------------------------------------------------------------------------

class Cell:
    """The rounds of one target at one setting."""

    def __init__(self, runs: list[dict]):
        self.runs = runs

    def values(self, getter) -> list[float]:
        out = []
        for run in self.runs:
            try:
                value = getter(run)
            except (KeyError, TypeError):
                value = None
            if value is not None:
                out.append(float(value))
        return out

    def stat(self, getter):
        return median_range(self.values(getter))

    @property
    def flagged(self) -> int:
        return sum(1 for r in self.runs if not r.get('ok', True))


def rps(run):
    return run['rps']


def pct(p):
    return lambda run: run['latency_us'][p] / 1000.0


def cpu_per_call(run):
    return run.get('cpu_us_per_call')


def target_cores(run):
    return run.get('target_cores')


def pg_cores(run):
    return None if run.get('pg_cpu_s') is None else run['pg_cpu_s'] / run['duration_s']


def wrk_cores(run):
    return run['wrk_cpu_s'] / run['duration_s']


def other_cores(run):
    return run.get('other_cores')


NOISY_CORES = 0.10


def fmt_rps(value: float) -> str:
    return f'{value:,.0f}'


def fmt_ms(value: float) -> str:
    return f'{value:.2f}' if value < 10 else f'{value:.1f}'


def fmt_plain(value: float) -> str:
    return f'{value:,.0f}' if value >= 100 else f'{value:.2f}' if value < 10 else f'{value:.1f}'


def show(stat, fmt=fmt_plain, unit: str = '') -> str:
    if stat is None:
        return '-'
    median, lo, hi = stat
    return f'{fmt(median)}{unit} [{fmt(lo)}-{fmt(hi)}]'


def overlap(a, b) -> bool:
    return not (a[2] < b[1] or b[2] < a[1])


def false_clear_chance(n: int) -> float:
    """How often two targets that are really the same get clear ranges with n rounds each: 2 / C(2n, n)."""
    return 2 / math.comb(2 * n, n) if n > 0 else 1.0


# --------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------

def render(meta: dict, runs: list[dict]) -> str:
    settings = meta.get('settings', {})
    block = meta.get('block', runs[0]['block'] if runs else '?')
    if block == 'sync':  # not wrk runs: its own report (loadtests/sync.py)
        from .sync import render as render_sync
        return render_sync(meta, runs)
    measured = [r for r in runs if r.get('kind') == 'run']
    floors = [r for r in runs if r.get('kind') == 'floor']
    targets = [t['name'] for t in meta.get('targets', [])] or sorted({r['target'] for r in measured})
    connections = settings.get('connections') or sorted({r['connections'] for r in measured}, reverse=True)
    baseline = settings.get('baseline') if settings.get('baseline') in targets else None
    others = [t for t in targets if t != baseline]
    cells = {(t, c): Cell([r for r in measured if r['target'] == t and r['connections'] == c])
             for t in targets for c in connections}
    rounds_done = max((len(cell.runs) for cell in cells.values()), default=0)

    out = [f'# Block `{block}`: {meta.get("started_at", "?")}', '']
    duration = _num(settings.get('duration_s', '?'))
    out += _intro(meta, settings, rounds_done, baseline)
    if block == 'admission':  # its own section first: worker CPU and Redis commands per call (loadtests/admission.py)
        from .admission import report_section
        out += report_section(meta, runs)
    if block == 'logging':  # its own section first: access log and events cost (loadtests/logging_bench.py)
        from .logging_bench import report_section as logging_section
        out += logging_section(meta, runs)

    # -- throughput
    out += ['## Requests a second', '',
            f'Closed loop (wrk), {duration} s per run, median of {rounds_done} round(s) '
            '[min-max].', '']
    header = ['Connections', *targets]
    if baseline and others:
        header += [f'{o} / {baseline}' for o in others]
    out += _table_head(header)
    for c in connections:
        row = [str(c)] + [show(cells[t, c].stat(rps), fmt_rps) + _warn(cells[t, c]) for t in targets]
        for o in (others if baseline else []):
            row.append(_ratio(cells[o, c].stat(rps), cells[baseline, c].stat(rps)))
        out.append('| ' + ' | '.join(row) + ' |')
    out.append('')

    # -- latency
    out += ['## Latency (ms)', '',
            'From wrk\'s own histogram, printed exactly by the Lua done() hook. Closed loop: at saturation this '
            'under-reports latency (coordinated omission) - latency against an offered rate needs an open-loop, '
            'latency-corrected generator (oha `-q R --latency-correction`), not available here.', '']
    out += _table_head(['Connections', 'Target', 'p50', 'p90', 'p99', 'p99.9'])
    for c in connections:
        for t in targets:
            cell = cells[t, c]
            out.append(f'| {c} | {t} | ' + ' | '.join(show(cell.stat(pct(p)), fmt_ms) for p in
                                                      ('50', '90', '99', '99.9')) + ' |')
    out.append('')
    if baseline and others:
        out += ['p50 against the baseline (ratio of medians; "clear" only when the ranges do not overlap):', '']
        out += _table_head(['Connections', *[f'{o} / {baseline} p50' for o in others]])
        for c in connections:
            out.append(f'| {c} | ' + ' | '.join(_ratio(cells[o, c].stat(pct('50')),
                                                       cells[baseline, c].stat(pct('50'))) for o in others) + ' |')
        out.append('')

    # -- CPU
    out += ['## CPU', '',
            'CPU seconds from /proc (utime + stime of the target\'s gunicorn master and its workers, every thread), '
            'per completed call and as cores busy during the run. PostgreSQL: the postmaster and its backends. '
            'wrk: its own rusage. Other: the whole machine\'s busy CPU (/proc/stat) less those three - other '
            'processes; above 0.1 core the run shared the machine with something.', '']
    out += _table_head(['Connections', 'Target', 'Target CPU per call (µs)', 'Target cores', 'PostgreSQL cores',
                        'wrk cores', 'Other cores'])
    for c in connections:
        for t in targets:
            cell = cells[t, c]
            out.append(f'| {c} | {t} | {show(cell.stat(cpu_per_call))} | {show(cell.stat(target_cores))} | '
                       f'{show(cell.stat(pg_cores))} | {show(cell.stat(wrk_cores))} | '
                       f'{show(cell.stat(other_cores))} |')
    out.append('')
    noisy = [r for r in runs if (r.get('other_cores') or 0) > NOISY_CORES]
    if noisy:
        out += [f'**{len(noisy)} of {len(runs)} runs shared the machine with other processes** (over '
                f'{NOISY_CORES} core, up to {max(r["other_cores"] for r in noisy):.2f}): their numbers are '
                'suspect; run the block again on a quiet machine.', '']

    # -- floor
    out += ['## /health floor', '',
            'wrk on /health, before and after the block, the same work every time: a machine that changed speed '
            'during the block shows up here.', '']
    out += _table_head(['Target', 'Connections', 'Before req/s', 'After req/s', 'Change', 'Errors'])
    for t in targets:
        before = [r for r in floors if r['target'] == t and r.get('phase') == 'before']
        after = [r for r in floors if r['target'] == t and r.get('phase') == 'after']
        if not before and not after:
            continue
        b = before[-1]['rps'] if before else None
        a = after[-1]['rps'] if after else None
        change = f'{(a / b - 1) * 100:+.1f}%' if a and b else '-'
        errs = sum(sum(r['errors'].values()) for r in before + after)
        conns = (before or after)[-1]['connections']
        out.append(f'| {t} | {conns} | {fmt_rps(b) if b else "-"} | {fmt_rps(a) if a else "-"} | {change} | '
                   f'{errs} |')
    out.append('')

    # -- flagged
    flagged = [r for r in runs if not r.get('ok', True)]
    out += ['## Runs with errors', '']
    if flagged:
        out += ['These runs are still in the medians above (their cells carry ⚠); a cell with one is not a fair '
                'comparison - find the cause (the target logs are beside this file) and run the block again.', '']
        out += _table_head(['Kind', 'Round', 'Target', 'Connections', 'Requests', 'Problems'])
        for r in flagged:
            out.append(f'| {r["kind"]} | {r.get("round", "-")} | {r["target"]} | {r["connections"]} | '
                       f'{r["requests"]:,} | {"; ".join(r.get("problems", []))} |')
    else:
        out.append('None: every request of every run answered 2xx, with no socket error or timeout.')
    out.append('')

    # -- every run
    out += ['## Every run', '']
    out += _table_head(['Round', 'Pos', 'Target', 'Conns', 'req/s', 'p50 ms', 'p99 ms', 'CPU µs/call',
                        'Target cores', 'Other cores', 'Errors', 'Started'])
    for r in measured:
        cpu = r.get('cpu_us_per_call')
        cores = r.get('target_cores')
        out.append(f'| {r["round"]} | {r["position"]} | {r["target"]} | {r["connections"]} | {fmt_rps(r["rps"])} | '
                   f'{fmt_ms(r["latency_us"]["50"] / 1000)} | {fmt_ms(r["latency_us"]["99"] / 1000)} | '
                   f'{"-" if cpu is None else f"{cpu:,.0f}"} | {"-" if cores is None else f"{cores:.2f}"} | '
                   f'{r.get("other_cores", 0):.2f} | '
                   f'{sum(r["errors"].values())} | {r.get("started_at", "")[11:19]} |')
    out.append('')
    out += _environment(meta)
    return '\n'.join(out) + '\n'


def _intro(meta, settings, rounds_done, baseline) -> list[str]:
    out = []
    if meta.get('finished_at') is None:
        out += ['**Incomplete: the block did not finish** (interrupted or failed); the numbers below are what it '
                'recorded.', '']
    order = settings.get('order_note', 'targets take turns in an order rotated each round')
    out += [f'- Method: {rounds_done} round(s) per cell; {order}; wrk `-t1 -c N -d {_num(settings.get("duration_s"))}s '
            f'--latency`, closed loop, random keys 1..{settings.get("max_id", 0):,} on each request; a '
            f'{_num(settings.get("warmup_s"))} s warm-up per target at {settings.get("warmup_connections", "?")} '
            f'connections before the block; a {_num(settings.get("floor_s"))} s /health floor at '
            f'{settings.get("floor_connections", "?")} connections on every target before and after.',
            f'- Rule: a difference counts only when the two ranges do not overlap. With {rounds_done} round(s), two '
            f'equal targets get clear ranges by chance {false_clear_chance(rounds_done) * 100:.1f}% of the time'
            + (' - too often to call anything real; use 5 rounds.' if rounds_done < 5 else '.'),
            f'- Baseline for the ratios: `{baseline}`.' if baseline else '- One target: no comparison.',
            f'- Pinning: {settings.get("pinning_note", "?")}', '']
    if meta.get('notes'):
        out += ['Notes:', ''] + [f'- {n}' for n in meta['notes']] + ['']
    return out


def _environment(meta) -> list[str]:
    machine = meta.get('machine', {})
    versions = meta.get('versions', {})
    out = ['## Machine and versions', '',
           f'- Machine: {machine.get("cpu_model", "?")}, {machine.get("cpus", "?")} CPUs '
           f'({machine.get("cores_per_socket", "?")} cores/socket, {machine.get("threads_per_core", "?")} '
           f'thread(s)/core{", " + machine["hypervisor"] + " guest" if machine.get("hypervisor") else ""}), '
           f'{machine.get("memory_gib", "?")} GiB; {machine.get("os", "?")}, kernel {machine.get("kernel", "?")}.']
    for key, label in (('harness', 'Harness / our gateway venv'), ('peer', 'Peer venv')):
        if versions.get(key):
            out.append(f'- {label}: ' + ', '.join(f'{k} {v}' for k, v in versions[key].items() if v))
    for key, label in (('gateway_fleet', 'gateway-fleet'), ('postgresql', 'PostgreSQL'), ('wrk', 'wrk'),
                       ('git', 'git')):
        if versions.get(key) is not None:
            value = versions[key]
            if isinstance(value, dict):
                value = f'{value.get("commit") or "no commit"}{" (dirty)" if value.get("dirty") else ""}'
            out.append(f'- {label}: {value}')
    data = meta.get('data')
    if data:
        out.append(f'- Data: pgbench_accounts, {data.get("rows", 0):,} rows (aid {data.get("min_aid")}-'
                   f'{data.get("max_aid")}), in {data.get("database_url", "?")}')
    out.append('')
    for target in meta.get('targets', []):
        out.append(f'- `{target["name"]}`: {target.get("description", "")} at {target.get("base_url")}, '
                   f'CPU {target.get("cpu", "?")}; `{target.get("command", "")}`')
        if target.get('env'):
            out.append('  - env: ' + ', '.join(f'{k}={v}' for k, v in sorted(target['env'].items())))
    if meta.get('work_dir'):
        out += ['', f'Target logs, homes and Redis data of this block (not kept in the repo): `{meta["work_dir"]}`']
    if meta.get('command'):
        out += ['', f'Command: `{meta["command"]}`']
    return out + ['']


def _num(value) -> str:
    if isinstance(value, (int, float)):
        return str(int(value)) if float(value).is_integer() else str(value)
    return '?' if value is None else str(value)


def _table_head(columns) -> list[str]:
    return ['| ' + ' | '.join(columns) + ' |', '|' + '|'.join('---' for _ in columns) + '|']


def _warn(cell: Cell) -> str:
    return f' ⚠{cell.flagged}' if cell.flagged else ''


def _ratio(ours, base) -> str:
    if not ours or not base or not base[0]:
        return '-'
    verdict = 'overlap' if overlap(ours, base) else 'clear'
    return f'{ours[0] / base[0]:.2f}× ({verdict})'


def write(run_dir: Path) -> Path:
    meta, runs = load(run_dir)
    if meta.get('block') == 'scaleout':  # its own tables and plots (loadtests/scaleout.py)
        from .scaleout import write_report
        return write_report(run_dir)
    if meta.get('block') == 'oha':  # loadtests/oha/collect.py's folders
        from .oha.collect import write as write_oha
        return write_oha(run_dir)
    if meta.get('block') == 'openloop':
        from .oha.openloop import write_report as write_openloop
        return write_openloop(run_dir)
    path = run_dir / 'results.md'
    path.write_text(render(meta, runs))
    return path


if __name__ == '__main__':
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(write(Path(sys.argv[1])))
