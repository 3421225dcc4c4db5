"""One version source: ``gateway.__version__``. The package metadata (setup.cfg reads it with
``attr:``), ``fleet --version``, ``/openapi.json``'s ``info.version`` and the newest release of
CHANGELOG.md all say it, and no other file of the build spells a version of its own.

No server, no database: the CLI and the document builder are called in process."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from setuptools.config.setupcfg import read_configuration

from fleet.ops import cli
from gateway import __version__
from gateway.http.openapi import Describer
from gateway.model.catalog import Catalog
from gateway.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


def test_the_version_is_a_release_number():
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__), __version__


def test_the_package_metadata_reads_it():
    setup_cfg = (ROOT / "setup.cfg").read_text()
    assert re.search(r"^version = attr: gateway\.__version__$", setup_cfg, re.M), "setup.cfg spells its own version"
    assert read_configuration(str(ROOT / "setup.cfg"))["metadata"]["version"] == __version__


def test_the_cli_reports_it(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"fleet (gateway-fleet) {__version__}"


class _EmptyCatalog:
    def current(self) -> Catalog:
        return Catalog.empty()


def test_the_openapi_document_reports_it():
    doc = Describer(_EmptyCatalog(), Settings(), None).openapi(None, "127.0.0.1")
    assert doc["info"]["version"] == __version__


def test_the_changelog_names_it_as_the_newest_release():
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert releases and releases[0] == __version__, releases[:3]


@pytest.mark.parametrize("name", ["setup.cfg", "pyproject.toml", "compose/Dockerfile", "compose/docker-compose.yml"])
def test_no_other_build_file_spells_a_version(name):
    text = (ROOT / name).read_text()
    assert not re.search(r"^\s*version\s*[=:]\s*['\"]?\d", text, re.M), f"{name} carries a version of its own"
