"""Import each of a list of modules alone, in a fresh interpreter of its own: what
``tests/test_imports.py`` asks of every module of the product.

A new ``python -c "import x"`` per module spent most of its time importing the same
third-party packages again (falcon, psycopg2, sqlglot, pglast, redis...): over a minute for the
product's ~110 modules on a loaded 2-core machine. So one interpreter (the zygote) imports
those once, and nothing of the product, then forks a child per module, a few at a time: each
child starts with none of the product's modules loaded, which is what the test is about (no
import cycle of the product hides behind the order other modules were imported in).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# Run in a child interpreter: argv[1] is the JSON list of the product's modules, argv[2] the
# names of the product's packages. First, in a throwaway interpreter's place, learn what the
# product imports from outside itself, by importing all of it in a forked child; then preload
# exactly that, and fork one child per module.
_ZYGOTE = r"""
import importlib, json, os, sys, traceback
modules, own = json.loads(sys.argv[1]), tuple(json.loads(sys.argv[2]))

def outside():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        before = set(sys.modules)
        for name in modules:
            try:
                importlib.import_module(name)
            except BaseException:
                pass
        found = [m for m in sys.modules if m not in before and m.split(".")[0] not in own]
        os.write(write, json.dumps(found).encode())
        os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 65536):
        data += chunk
    os.waitpid(pid, 0)
    return json.loads(data)

for name in outside():
    try:
        importlib.import_module(name)
    except BaseException:
        pass     # a module that only imports in the product's company: each child imports it anew

def alone(name):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(name)
            code, message = 0, ""
        except BaseException:
            code, message = 1, traceback.format_exc().strip().splitlines()[-1]
        os.write(write, message.encode())
        os._exit(code)
    os.close(write)
    return pid, read

results, running = {}, {}
todo = list(modules)
width = max(2, os.cpu_count() or 2)
while todo or running:
    while todo and len(running) < width:
        name = todo.pop(0)
        pid, read = alone(name)
        running[pid] = (name, read)
    pid, status = os.wait()
    if pid not in running:
        continue
    name, read = running.pop(pid)
    message = b""
    while chunk := os.read(read, 65536):
        message += chunk
    os.close(read)
    if os.waitstatus_to_exitcode(status):
        results[name] = message.decode(errors="replace") or f"exit status {status}"
print(json.dumps(results))
"""


def failures_importing_alone(modules: list[str], packages: tuple[str, ...], cwd: Path) -> dict[str, str]:
    """{module: the last line of its error} for each of ``modules`` that does not import alone."""
    run = subprocess.run([sys.executable, "-c", _ZYGOTE, json.dumps(modules), json.dumps(list(packages))],
                         cwd=cwd, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])
