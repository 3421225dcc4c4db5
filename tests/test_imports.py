"""Every module of the product imports on its own, in a fresh interpreter: no import cycle
hides behind the order in which other modules happen to be imported (``gateway.sql`` once
failed alone: errors -> governance -> analysis -> sql -> errors)."""
from __future__ import annotations

import subprocess
import sys

from helpers.util import ROOT

SKIP = {"fleet.gunicorn_conf"}   # a gunicorn config: importing it starts the embedded default


def modules() -> list[str]:
    found = []
    for package in ("gateway", "fleet"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            if name not in SKIP:
                found.append(name)
    return found


def test_every_module_imports_alone():
    failed = {}
    for name in modules():
        run = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=ROOT, capture_output=True, text=True)
        if run.returncode:
            failed[name] = run.stderr.strip().splitlines()[-1]
    assert not failed, failed
