"""Every module of the product imports on its own, in a fresh interpreter: no import cycle
hides behind the order in which other modules happen to be imported (``gateway.sql`` once
failed alone: errors -> governance -> analysis -> sql -> errors)."""
from __future__ import annotations

from pathlib import Path

from helpers.import_alone import failures_importing_alone
from helpers.imports import arrows, cycles, import_graph
from helpers.util import ROOT

SKIP = {"fleet.server.gunicorn_conf"}   # a gunicorn config: importing it starts the embedded default


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
    # Each in an interpreter of its own that has loaded none of the product (helpers/import_alone.py).
    failed = failures_importing_alone(modules(), ("gateway", "fleet"), ROOT)
    assert not failed, failed


def test_a_module_that_cannot_import_alone_is_found(tmp_path):
    """The check can fail: a cycle that breaks only when one of its modules is imported first
    (``second`` alone imports, ``first`` alone does not)."""
    package = tmp_path / "cyclic"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "first.py").write_text("from cyclic import second\nVALUE = 1\n")
    (package / "second.py").write_text("from cyclic.first import VALUE\n")
    failed = failures_importing_alone(["cyclic.first", "cyclic.second", "json"], ("cyclic",), tmp_path)
    assert set(failed) == {"cyclic.first"}, failed
    assert "VALUE" in failed["cyclic.first"]


# --- the import rule (docs/architecture.md, "Layers and the import rule") --------------------
# The layers of gateway/, lowest first: a module imports from its own layer and those below,
# never from one above, whether at run time, inside a function or only for the type checker.
# Every package and top-level module of gateway/ has its place here: a new one fails the test
# until it is given one.
LAYERS: list[tuple[str, frozenset[str]]] = [
    ("kernel", frozenset({"gateway", "errors", "settings", "crypto", "request_ids"})),   # "gateway": its __init__ (__version__)
    ("ports", frozenset({"ports"})),
    ("parts", frozenset({"model", "sql", "governance", "execution", "store", "cache", "observe"})),
    ("use cases", frozenset({"pipeline", "control", "warmup"})),
    ("http", frozenset({"http"})),
    ("assembly", frozenset({"app"})),
]
RANK = {unit: rank for rank, (_, units) in enumerate(LAYERS) for unit in units}
# Arrows allowed against the layers, each for a reason. Type-only: a port's signatures name the
# model's values it is handed (Admission is given an ApiKey, Sync a CatalogHolder); at run time
# ports.py imports only errors.
TYPE_ONLY_EXCEPTIONS = {("ports", "model")}
# What http/ may use below the use cases at run time: a resource reads the request and hands it
# to a pipeline or a control service; it runs no stage itself (no runner, store, reader or
# analysis). The typed errors, the metrics registry it exposes, the format table /openapi.json
# lists, the JSON renderer of /api/v1/cache/entries and the request ids are all it takes from below.
HTTP_BELOW = {"gateway", "gateway.errors", "gateway.observe", "gateway.execution.formats", "gateway.request_ids"}
OUTSIDE = {"fleet", "loadtests"}     # the product's two neighbours: gateway imports neither


def unit_of(target: str, root: Path) -> str | None:
    """The gateway unit (a subpackage or a top-level module) a dotted name lands in; None when
    it is not gateway's."""
    parts = target.split(".")
    if parts[0] != "gateway":
        return None
    if len(parts) > 1 and ((root / "gateway" / parts[1]).is_dir() or (root / "gateway" / f"{parts[1]}.py").exists()):
        return parts[1]
    return "gateway"


def violations(root: Path) -> list[str]:
    """Every arrow of ``root/gateway`` against the import rule, and every runtime cycle
    between its units, as readable lines."""
    found = []
    units = {p.stem for p in (root / "gateway").glob("*.py") if p.name != "__init__.py"} \
        | {p.name for p in (root / "gateway").iterdir() if p.is_dir() and any(p.glob("*.py"))}
    found += [f"gateway.{u} has no layer in LAYERS" for u in sorted(units - set(RANK))]
    runtime: dict[str, set[str]] = {}
    for arrow in arrows(root / "gateway"):
        where = f"{arrow.source}:{arrow.line} imports {arrow.target}"
        top = arrow.target.split(".")[0]
        if top in OUTSIDE:
            found.append(f"{where}: gateway imports nothing from {top}")
            continue
        source, target = unit_of(arrow.source, root), unit_of(arrow.target, root)
        if target is None or source == target or source not in RANK or target not in RANK:
            continue
        if not arrow.type_only:
            runtime.setdefault(source, set()).add(target)
        if RANK[target] > RANK[source] and not (arrow.type_only and (source, target) in TYPE_ONLY_EXCEPTIONS):
            found.append(f"{where}: {LAYERS[RANK[source]][0]} ({source}) may not import "
                         f"{LAYERS[RANK[target]][0]} ({target})")
        if source == "http" and not arrow.type_only and RANK[target] < RANK["pipeline"] \
                and not any(arrow.target == m or arrow.target.startswith(m + ".") for m in HTTP_BELOW - {"gateway"}) \
                and arrow.target not in ("gateway", "gateway.__version__"):
            found.append(f"{where}: http reaches below the use cases only for {sorted(HTTP_BELOW)}")
    found += [f"runtime import cycle between {' '.join(c)}" for c in cycles(runtime)]
    return found


def test_gateway_imports_point_down_only():
    assert violations(ROOT) == []


def fleet_violations(root: Path) -> list[str]:
    """fleet/ implements the ports: it may use the gateway's parts and values below the use
    cases, never http/, pipeline/ or control/; only the composition root (fleet/app.py) builds
    the app (gateway.app); and nothing of it imports loadtests."""
    wrong = []
    for arrow in arrows(root / "fleet"):
        where = f"{arrow.source}:{arrow.line} imports {arrow.target}"
        unit = unit_of(arrow.target, root)
        if arrow.target.split(".")[0] == "loadtests":
            wrong.append(f"{where}: the product imports nothing of loadtests")
        elif unit in ("http", "pipeline", "control"):
            wrong.append(f"{where}: fleet implements ports, it does not reach into the {unit} layer")
        elif unit == "app" and arrow.source != "fleet.app":
            wrong.append(f"{where}: only the composition root (fleet.app) builds the app")
    return wrong


def test_fleet_implements_ports_and_builds_the_app_in_one_place(tmp_path):
    assert fleet_violations(ROOT) == []
    (tmp_path / "fleet" / "shared").mkdir(parents=True)
    (tmp_path / "gateway" / "pipeline").mkdir(parents=True)
    (tmp_path / "gateway" / "app.py").write_text("")
    (tmp_path / "fleet" / "shared" / "bus.py").write_text("from gateway.pipeline import call\n"
                                                          "from gateway.app import build_app\n"
                                                          "import loadtests.bench\nfrom gateway.ports import Sync\n")
    assert [line.split(": ")[0] for line in fleet_violations(tmp_path)] == [
        "fleet.shared.bus:1 imports gateway.pipeline", "fleet.shared.bus:1 imports gateway.pipeline.call",
        "fleet.shared.bus:2 imports gateway.app", "fleet.shared.bus:2 imports gateway.app.build_app",
        "fleet.shared.bus:3 imports loadtests.bench"]


def test_the_import_rule_can_fail(tmp_path):
    """The checker sees an upward arrow at module level, inside a function and for the type
    checker only; an import of fleet; an http resource running a stage itself; a new unit
    without a layer; and a runtime cycle inside a layer."""
    gw = tmp_path / "gateway"
    for package in ("http", "model", "governance", "ports", "pipeline", "newpart"):
        (gw / package).mkdir(parents=True)
        (gw / package / "__init__.py").write_text("")
    (gw / "errors.py").write_text("")
    (gw / "ports" / "__init__.py").write_text("from ..pipeline import call\n")
    (gw / "model" / "a.py").write_text("from ..governance import b\n\ndef f():\n    from gateway.http import c\n")
    (gw / "governance" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                            "    from ..pipeline import call\nfrom ..model import a\n")
    (gw / "http" / "c.py").write_text("from ..errors import x\nfrom ..model import a\nimport fleet.shared.bus\n")
    (gw / "pipeline" / "call.py").write_text("from ..model import a\n")
    found = "\n".join(violations(tmp_path))
    assert "gateway.newpart has no layer" in found
    assert "gateway.ports:1 imports gateway.pipeline: ports (ports) may not import use cases (pipeline)" in found
    assert "gateway.model.a:4 imports gateway.http: parts (model) may not import http (http)" in found
    assert "gateway.governance.b:3 imports gateway.pipeline: parts (governance) may not import" in found
    assert "gateway.http.c:2 imports gateway.model: http reaches below the use cases only" in found
    assert "gateway.http.c:3 imports fleet.shared.bus: gateway imports nothing from fleet" in found
    assert "runtime import cycle between governance http model" in found
    # the allowed arrows: http's typed errors, a use case importing the model
    assert not [line for line in found.splitlines() if line.startswith(("gateway.http.c:1", "gateway.pipeline.call:"))]


def test_every_folder_of_the_product_is_a_package():
    """``setup.cfg``'s ``packages = find:`` ships only folders with an ``__init__.py``: one
    without (a namespace package) imports from a checkout but is missing from the wheel, as
    ``gateway/model/`` was."""
    folders = [folder for package in ("gateway", "fleet") for folder in [ROOT / package, *sorted((ROOT / package).rglob("*"))]
               if folder.is_dir() and any(folder.glob("*.py"))]
    missing = [str(folder.relative_to(ROOT)) for folder in folders if not (folder / "__init__.py").exists()]
    assert missing == []
    # What the wheel ships, as setuptools finds it from setup.cfg: the product's folders, all of
    # them, and nothing else (not loadtests/, which runs from a checkout with its `load` extra).
    import configparser

    import setuptools
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    include = [p.strip() for p in config["options.packages.find"]["include"].split(",")]
    shipped = set(setuptools.find_packages(where=str(ROOT), include=include))
    assert shipped == {".".join(f.relative_to(ROOT).parts) for f in folders}


def test_no_two_modules_import_each_other(tmp_path):
    """No import cycle between the product's modules, not even one only the type checker follows
    or one through a package's ``__init__`` (``gateway/cache`` had two: ``entry`` <-> ``memory``,
    the package <-> ``service``); and the check sees both kinds on a synthetic tree."""
    assert [c for package in ("gateway", "fleet") for c in cycles(import_graph(ROOT / package))] == []
    pkg = tmp_path / "gateway" / "cache"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .service import S\n")
    (pkg / "service.py").write_text("from . import keys\n")
    (pkg / "keys.py").write_text("")
    (pkg / "entry.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .memory import M\n")
    (pkg / "memory.py").write_text("from .entry import E\n")
    assert cycles(import_graph(tmp_path / "gateway")) == [["gateway.cache", "gateway.cache.service"],
                                                          ["gateway.cache.entry", "gateway.cache.memory"]]
