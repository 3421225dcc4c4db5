"""A block's folder, ``<out>/<block>-<timestamp>/``: results.jsonl (one line a run, written as it runs), meta.json
(machine, versions, settings, targets) and results.md with any plots (rendered from the two, any time:
``python -m loadtests.report <dir>``).

New runs go to loadtests/results/ (gitignored) unless a block's ``--out`` says otherwise; the runs the reports in
docs/bench/ cite are kept beside them, in docs/bench/raw/. Target logs and homes go to .bench/runs/ (gitignored).
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from .system import REPO

RESULTS = REPO / 'loadtests' / 'results'
WORK = REPO / '.bench' / 'runs'


def new(out: Path, block: str) -> tuple[Path, Path]:
    """(the block's folder under `out`, its work folder for logs and homes), both created."""
    stamp = datetime.now().strftime('%Y%m%d-%H%M%S')
    run_dir = out / f'{block}-{stamp}'
    run_dir.mkdir(parents=True, exist_ok=False)
    work_dir = WORK / f'{block}-{stamp}'
    work_dir.mkdir(parents=True, exist_ok=True)
    return run_dir, work_dir


def load(run_dir: Path) -> tuple[dict, list[dict]]:
    """(meta.json, the records of results.jsonl) of a block's folder; what is missing reads as empty."""
    run_dir = Path(run_dir)
    meta = json.loads((run_dir / 'meta.json').read_text()) if (run_dir / 'meta.json').exists() else {}
    runs = []
    path = run_dir / 'results.jsonl'
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                runs.append(json.loads(line))
    return meta, runs


def write_meta(run_dir: Path, meta: dict):
    (Path(run_dir) / 'meta.json').write_text(json.dumps(meta, indent=2, default=str) + '\n')


def write_report(run_dir: Path, render) -> Path:
    """results.md from ``render(meta, runs)``; returns its path."""
    meta, runs = load(run_dir)
    path = Path(run_dir) / 'results.md'
    path.write_text(render(meta, runs))
    return path


def publish(run_dir: Path, docs: Path, render, page_name: Callable[[dict], str]) -> Path:
    """Keep a block's run beside the reports (``docs/raw/<folder>/``: meta.json, results.jsonl, results.md) and
    write its page ``docs/<page_name(meta)>``, rendered with links to that copy; returns the page."""
    run_dir = Path(run_dir)
    raw = docs / 'raw' / run_dir.name
    raw.mkdir(parents=True, exist_ok=True)
    for name in ('meta.json', 'results.jsonl', 'results.md'):
        shutil.copy(run_dir / name, raw / name)
    meta, runs = load(run_dir)
    page = docs / page_name(meta)
    page.write_text(render(meta, runs, raw=f'raw/{run_dir.name}/'))
    return page
