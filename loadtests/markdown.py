"""The pieces every block's results.md is made of: tables, the notes and "incomplete" lines, numbers as settings
show them, and the closing section on the machine, the versions, the targets and the command.

Written here rather than with tabulate: the committed reports (docs/bench/raw/*/results.md) are unpadded
``|---|`` tables, and tests/loadtests/test_loadtests.py holds every one of them to the byte."""
from __future__ import annotations

INCOMPLETE = ['**Incomplete: the block did not finish** (interrupted or failed); the numbers below are what it '
              'recorded.', '']


def row(cells) -> str:
    return '| ' + ' | '.join(str(c) for c in cells) + ' |'


def table(columns, rows=(), blank: bool = True) -> list[str]:
    """A Markdown table (a row: a list of cells), and a blank line after it unless `blank` is false."""
    return [row(columns), '|' + '|'.join('---' for _ in columns) + '|', *(row(r) for r in rows)] + \
        ([''] if blank else [])


def notes(meta: dict, extra=()) -> list[str]:
    """'Notes:' and a bullet a note (meta.json's, then `extra`), or nothing."""
    found = [*(meta.get('notes') or []), *extra]
    return ['Notes:', '', *(f'- {n}' for n in found), ''] if found else []


def incomplete(meta: dict) -> list[str]:
    return list(INCOMPLETE) if meta.get('finished_at') is None else []



def num(value) -> str:
    """A setting as written: 10 rather than 10.0; '?' for None."""
    if isinstance(value, (int, float)):
        return str(int(value)) if float(value).is_integer() else str(value)
    return '?' if value is None else str(value)


def dash(value, fmt: str = '') -> str:
    """`value` formatted, or '-' for None."""
    return '-' if value is None else format(value, fmt)


def environment(meta) -> list[str]:
    """"Machine and versions": from meta.json's machine, versions, data, targets, work_dir and command."""
    machine, versions = meta.get('machine', {}), meta.get('versions', {})
    guest = f', {machine["hypervisor"]} guest' if machine.get('hypervisor') else ''
    out = ['## Machine and versions', '',
           f'- Machine: {machine.get("cpu_model", "?")}, {machine.get("cpus", "?")} CPUs '
           f'({machine.get("cores_per_socket", "?")} cores/socket, {machine.get("threads_per_core", "?")} '
           f'thread(s)/core{guest}), {machine.get("memory_gib", "?")} GiB; {machine.get("os", "?")}, kernel '
           f'{machine.get("kernel", "?")}.']
    for key, label in (('harness', 'Harness / our gateway venv'), ('peer', 'Peer venv')):
        if versions.get(key):
            out.append(f'- {label}: ' + ', '.join(f'{k} {v}' for k, v in versions[key].items() if v))
    for key, label in (('gateway_fleet', 'gateway-fleet'), ('postgresql', 'PostgreSQL'), ('wrk', 'wrk'),
                       ('git', 'git')):
        value = versions.get(key)
        if isinstance(value, dict):
            value = f'{value.get("commit") or "no commit"}{" (dirty)" if value.get("dirty") else ""}'
        if value is not None:
            out.append(f'- {label}: {value}')
    data = meta.get('data')
    if data:
        out.append(f'- Data: pgbench_accounts, {data.get("rows", 0):,} rows (aid {data.get("min_aid")}-'
                   f'{data.get("max_aid")}), in {data.get("database_url", "?")}')
        if data.get('pg_settings'):
            out.append('- PostgreSQL settings: ' + ', '.join(f'{k} {v}' for k, v in data['pg_settings'].items())
                       + f'; {data.get("prewarm", "")}')
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
