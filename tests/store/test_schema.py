"""The store's schema (``gateway/store/schema.py``): migrations that rewrite rows, and the
rule that every statement against the store is written in ``gateway/store/``."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from gateway.store.schema import MIGRATIONS
from helpers.util import ROOT

_VERSION = "SELECT v.extra FROM gw_query_versions v JOIN gw_queries q ON q.id = v.query_id WHERE q.name = %s"


def test_a_version_saved_with_a_split_analysis_is_stored_as_one_document(api, demo_connection, superuser):
    # Saved now: one document with the reading and the governance analysis, kinds agreeing.
    name = api.query("SELECT id, email FROM customers WHERE country = :c ORDER BY id",
                     {"c": {"type": "str", "default": "FR"}}, connection=demo_connection)
    ((extra,),) = superuser(_VERSION, (name,))
    analysis = extra["analysis"]
    assert "governance" not in extra
    assert analysis["kind"] == "read" and analysis["order"] == ["c"] and "paged" in analysis
    assert analysis["tables"] == ["public.customers"] and [c["name"] for c in analysis["columns"]] == ["id", "email"]
    # As an older release stored it: the reading in "analysis", the governance in "governance".
    reading = ("positional", "order", "kind", "paged")
    superuser("UPDATE gw_query_versions v SET extra = v.extra - 'analysis' || jsonb_build_object("
              "'analysis', (SELECT jsonb_object_agg(k, v.extra -> 'analysis' -> k) FROM unnest(%s::text[]) k), "
              "'governance', (v.extra -> 'analysis') - 'positional' - 'order' - 'paged') "
              "FROM gw_queries q WHERE q.id = v.query_id AND q.name = %s", (list(reading), name))
    ((split,),) = superuser(_VERSION, (name,))
    assert set(split["analysis"]) == set(reading) and "tables" in split["governance"]
    superuser(MIGRATIONS[6])
    ((migrated,),) = superuser(_VERSION, (name,))
    assert migrated == extra


def _store_tables() -> set[str]:
    return {m.group(1) for sql in MIGRATIONS for m in re.finditer(r"CREATE TABLE (?:IF NOT EXISTS )?(gw_\w+)", sql)}


def statements_outside_the_store(root: Path, tables: set[str]) -> list[str]:
    """String constants (docstrings aside) of gateway/ and fleet/, outside gateway/store/,
    that name a store table: a statement against the store written elsewhere."""
    found = []
    pattern = re.compile(r"\b(" + "|".join(sorted(tables)) + r")\b")
    for package in ("gateway", "fleet"):
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root)
            if rel.parts[:2] == ("gateway", "store"):
                continue
            tree = ast.parse(path.read_text(), str(path))
            docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                          if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                          and node.body and isinstance(node.body[0], ast.Expr)
                          and isinstance(node.body[0].value, ast.Constant)}
            found += [f"{rel}:{node.lineno}" for node in ast.walk(tree)
                      if isinstance(node, ast.Constant) and isinstance(node.value, str)
                      and id(node) not in docstrings and pattern.search(node.value)]
    return found


def test_every_statement_against_the_store_is_in_gateway_store(tmp_path):
    tables = _store_tables()
    assert {"gw_connections", "gw_api_keys", "gw_catalog_state", "gw_run_history"} <= tables
    assert statements_outside_the_store(ROOT, tables) == []
    # It can fail: a model module reading the store itself.
    (tmp_path / "gateway" / "model").mkdir(parents=True)
    (tmp_path / "fleet").mkdir()
    (tmp_path / "gateway" / "model" / "x.py").write_text(
        '"""Reads gw_api_keys (a docstring may say so)."""\nQ = "SELECT * FROM gw_api_keys WHERE id = %s"\n')
    assert statements_outside_the_store(tmp_path, tables) == ["gateway/model/x.py:2"]
