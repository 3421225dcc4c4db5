"""Store migrations that rewrite rows (``gateway/store/schema.py``)."""
from __future__ import annotations

from gateway.store.schema import MIGRATIONS

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
