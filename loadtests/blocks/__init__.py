"""The blocks, one package each: ``run.py`` (how the block runs) and ``render.py`` (its results.md and plots:
``write(run_dir) -> Path``), over the harness's core (loadtests/harness.py, targets.py, system.py, peer.py, wrk.py)
and its one statistics module (loadtests/stats.py).

This registry is how the harness reaches a block: bench.py runs one by name, report.py renders a folder by the
block its meta.json names. Nothing outside loadtests/blocks/ imports a block's module, so the import graph has no
cycle (tests/loadtests/test_loadtests.py checks it).
"""
from __future__ import annotations

from importlib import import_module
from types import ModuleType

# `python -m loadtests.bench --block NAME`: in bench's frame (the data's PostgreSQL, the block folder, meta.json, the
# processes to stop at the end): run.run(block, args, work_dir, cleanup, meta, save_meta).
FRAMED = ('oltp', 'admission', 'sync', 'logging', 'limits')
# `python -m loadtests.bench NAME [ARGS]`: a harness of their own, run.main(argv).
OWN_CLI = ('scaleout', 'oha', 'faults', 'controlplane', 'cache')
NAMES = FRAMED + OWN_CLI


def run(name: str) -> ModuleType:
    return import_module(f'{__name__}.{_known(name)}.run')


def render(name: str) -> ModuleType:
    return import_module(f'{__name__}.{_known(name)}.render')


def _known(name: str) -> str:
    if name not in NAMES:
        raise KeyError(f'no block {name!r} (blocks: {", ".join(NAMES)})')
    return name
