"""``gateway/governance/policy.py``: a stored analysis planned under this gateway's settings
(``refused_now``); end to end, through two gateways on one store: tests/pipeline/test_plans.py."""
from __future__ import annotations

import pytest

from gateway.errors import GatewayError
from gateway.governance import Schema, analyze
from gateway.governance.policy import refused_now
from gateway.settings import Settings

SCHEMA = Schema({"public.customers": ("id", "email"), "public.pg_stat_statements": ("query",),
                 "pg_catalog.pg_class": ("relname",), "information_schema.columns": ("column_name",)},
                extension_relations=["public.pg_stat_statements"], functions=[])
LIFTED = "pg_catalog.pg_class,public.pg_stat_statements,information_schema.columns"


def _code(analysis, **settings) -> str | None:
    try:
        refused_now(analysis, Settings(**settings))
    except GatewayError as error:
        assert error.status == 400
        return error.code
    return None


@pytest.mark.parametrize("sql, relation", [
    ("SELECT relname FROM pg_class", "pg_catalog.pg_class"),
    ("SELECT query FROM pg_stat_statements", "public.pg_stat_statements"),
    ("SELECT c.id FROM customers c WHERE c.email IN (SELECT column_name FROM information_schema.columns)",
     "information_schema.columns"),
])
def test_a_catalog_relation_the_settings_no_longer_name(sql, relation):
    analysis = analyze(sql, SCHEMA, allowed_catalog_relations=LIFTED.split(","))
    assert _code(analysis, allow_catalog_relations=LIFTED) is None
    assert _code(analysis, allow_catalog_relations=relation) is None
    assert _code(analysis) == "catalog_not_allowed"
    others = ",".join(r for r in LIFTED.split(",") if r != relation)
    assert _code(analysis, allow_catalog_relations=others) == "catalog_not_allowed"


def test_a_function_the_deny_list_names_now():
    lifted = analyze("SELECT current_setting('x'), upper(email) FROM customers", SCHEMA,
                     allowed_functions=("current_setting",))
    assert _code(lifted, allow_functions="current_setting") is None
    assert _code(lifted) == "function_not_allowed"                       # the default list names it
    plain = analyze("SELECT pg_catalog.upper(email) FROM customers", SCHEMA)
    assert _code(plain) is None
    assert _code(plain, deny_functions="upper") == "function_not_allowed"
    assert _code(plain, deny_functions="upp*") == "function_not_allowed"
    assert _code(plain, deny_functions="upp*", allow_functions="upper") is None
