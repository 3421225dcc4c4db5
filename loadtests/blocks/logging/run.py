"""The logging block's run: its three targets (access log on, off, and events off too; each with its own store and
Redis), the worker CPU and access-log lines of each run (probes), then the closed-loop rounds."""
from __future__ import annotations

from pathlib import Path

from ...harness import WorkerCpu, record_variants, run_rounds, start_variant
from . import BARE, OFF, ON

TARGETS = (
    (ON, {'GATEWAY_ACCESS_LOG': '1', 'GATEWAY_ACCESS_LOG_SAMPLE': '1.0'}),
    (OFF, {'GATEWAY_ACCESS_LOG': '0'}),
    (BARE, {'GATEWAY_ACCESS_LOG': '0', 'GATEWAY_EVENTS': '0'}),
)
COMMON = {'GATEWAY_LOG_LEVEL': 'info'}


class AccessLines:
    """Access-log lines a target appended to its log file during a run (lines holding a request id)."""

    def __init__(self, log_path: Path):
        self.path = log_path
        self.offset = 0

    def _size(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def start(self):
        self.offset = self._size()

    def finish(self, record: dict) -> dict:
        lines = 0
        try:
            with self.path.open('rb') as log:
                log.seek(self.offset)
                while True:
                    chunk = log.read(1 << 20)
                    if not chunk:
                        break
                    lines += chunk.count(b'"request_id"')
        except OSError:
            return {'access_lines': None, 'access_lines_per_call': None}
        calls = record.get('requests') or 0
        return {'access_lines': lines, 'log_bytes': self._size() - self.offset,
                'access_lines_per_call': round(lines / calls, 3) if calls else None}


def run(run):
    live, probes = [], {}
    for index, (name, extra) in enumerate(TARGETS):
        target, _ = start_variant(run, index, name, {**COMMON, **extra}, f'gwstore_log_{index}')
        live.append(target)
        probes[name] = (WorkerCpu(target.pids[0]), AccessLines(target.log_path))
    record_variants(run, live, OFF)
    run_rounds(run.block, live, run.args, probes, _extra)


def _extra(record: dict) -> str:
    cpu = record.get('worker_cpu_us_per_call')
    lines = record.get('access_lines_per_call')
    return ((f'; worker {cpu:,.0f} µs CPU/call' if cpu is not None else '') +
            (f'; {lines} access lines/call' if lines is not None else ''))
