"""results.md (and the plots) of a block's folder, from its results.jsonl and meta.json - regenerate any time:

    python -m loadtests.report docs/bench/raw/oltp-20261201-032222

Each block renders its own (loadtests/blocks/<name>/render.py: render(meta, runs), or write(dir) with plots); this only finds which, by the block meta.json names
(a folder that names none is read as a closed-loop block's, the oltp report). A run of ``python -m loadtests.servers``
(its meta.json names the block ``servers``) renders through loadtests/servers_render.py.
"""
from __future__ import annotations

import sys
from pathlib import Path

from . import blocks, rundir, servers_render


def write(run_dir: Path) -> Path:
    meta, runs = rundir.load(run_dir)
    name = meta.get('block') or (runs[0].get('block') if runs else None)
    if name == 'servers':
        return servers_render.write(Path(run_dir))
    module = blocks.render(name if name in blocks.NAMES else 'oltp')
    if hasattr(module, 'write'):     # a block with plots of its own (scaleout, oha)
        return module.write(Path(run_dir))
    return rundir.write_report(run_dir, module.render)


if __name__ == '__main__':
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(write(Path(sys.argv[1])))
