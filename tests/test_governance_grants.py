"""Grants and call plans (gateway.governance.grants): validation, allow-lists, write
permissions, mask decisions, refusals, and what ``apply`` does per call (and how fast)."""
from __future__ import annotations

import hashlib
import hmac
import time
from datetime import date, datetime, timezone
from decimal import Decimal

import pytest

from gateway.errors import GatewayError
from gateway.governance import CallPlan, Grants, Schema, analyze, mask_value, plan

SCHEMA = Schema({
    "public.customers": ("id", "name", "email", "country", "plan", "created_at"),
    "public.orders": ("id", "customer_id", "amount", "status", "ordered_at"),
    "public.notes": ("id", "body"),
    "public.customer_contacts": ("id", "contact"),
    "private.secrets": ("id", "secret"),
    "pg_catalog.pg_class": ("oid", "relname"),
}, views=["public.customer_contacts"], functions=["get_email"])
KEY = b"mask-key"


def grants(**doc):
    return Grants.from_doc(doc)


def refused_plan(sql, code, g, query_masks=None):
    with pytest.raises(GatewayError) as info:
        plan(analyze(sql, SCHEMA), g, query_masks, hash_key=KEY)
    assert info.value.code == code, (info.value.code, info.value.message)
    assert info.value.status == 403
    return info.value


# --- validation -----------------------------------------------------------------------------------
@pytest.mark.parametrize("doc, field", [
    ({"allowed_tables": "customers"}, "allowed_tables"),
    ({"allowed_tables": [""]}, "allowed_tables"),
    ({"allowed_tables": ["a.b.c"]}, "allowed_tables"),
    ({"mask": {"column": "customers.email"}}, "mask"),
    ({"mask": [{"column": "email", "action": "hash"}]}, "mask"),
    ({"mask": [{"column": "customers.email", "action": "encrypt"}]}, "mask"),
    ({"mask": [{"column": "customers.email", "action": "hash", "extra": 1}]}, "mask"),
    ({"mask": [{"column": "a.b.c.d", "action": "hash"}]}, "mask"),
    ({"allow_writes": "yes"}, "allow_writes"),
    ({"allowed_write_ops": ["drop"]}, "allowed_write_ops"),
    ({"allowed_write_ops": "insert"}, "allowed_write_ops"),
    ({"max_rows": 0}, "max_rows"),
    ({"max_rows": True}, "max_rows"),
    ({"query_timeout": 0}, "query_timeout"),
    ({"allowed_ips": ["10.0.0.0/33"]}, "allowed_ips"),
    ({"allowed_ips": "10.0.0.1"}, "allowed_ips"),
])
def test_invalid_grants(doc, field):
    with pytest.raises(GatewayError) as info:
        Grants.from_doc(doc)
    assert info.value.code == "invalid_body" and field in info.value.extra["errors"]


def test_grants_round_trip_and_defaults():
    doc = {"allowed_tables": ["customers", "private.*"], "mask": [{"column": "*.email", "action": "hash"}],
           "allow_writes": True, "allowed_write_ops": ["insert"], "max_rows": 10, "query_timeout": 2.5,
           "allowed_ips": ["10.0.0.0/8"]}
    assert Grants.from_doc(Grants.from_doc(doc).to_doc()).to_doc() == Grants.from_doc(doc).to_doc()
    empty = Grants.from_doc(None)
    assert empty.allowed_tables is None and empty.masks == () and empty.allow_writes is False
    # unknown fields (queries, connections, rate_limit...) belong to other parts of the gateway
    assert Grants.from_doc({"queries": ["x"], "rate_limit": "10/minute"}).masks == ()


# --- allow-lists ----------------------------------------------------------------------------------
def test_allowed_tables():
    g = grants(allowed_tables=["orders", "private.*"])
    plan(analyze("SELECT * FROM orders", SCHEMA), g)
    plan(analyze("SELECT * FROM public.orders o JOIN private.secrets s USING (id)", SCHEMA), g)
    refused_plan("SELECT * FROM customers", "table_not_allowed", g)
    refused_plan("SELECT * FROM orders WHERE customer_id IN (SELECT id FROM customers)", "table_not_allowed", g)
    refused_plan("SELECT relname FROM pg_class", "table_not_allowed", g)
    refused_plan("SELECT * FROM customer_contacts", "table_not_allowed", g)
    refused_plan("SELECT get_email(1)", "function_opaque", g)
    refused_plan("SELECT 1 FROM orders", "table_not_allowed", grants(allowed_tables=[]))
    plan(analyze("SELECT 1", SCHEMA), grants(allowed_tables=[]))
    plan(analyze("SELECT get_email(1)", SCHEMA), grants())  # no restriction: nothing to protect


def test_writes():
    delete = "DELETE FROM notes WHERE id = $1"
    refused_plan(delete, "write_not_allowed", grants())
    plan(analyze(delete, SCHEMA), grants(allow_writes=True))
    with pytest.raises(GatewayError) as info:
        plan(analyze(delete, SCHEMA), grants(allow_writes=True), server_allows_writes=False)
    assert info.value.code == "write_not_allowed"
    refused_plan(delete, "write_op_not_allowed", grants(allow_writes=True, allowed_write_ops=["insert", "update"]))
    plan(analyze(delete, SCHEMA), grants(allow_writes=True, allowed_write_ops=["DELETE"]))
    # a read is never a write, whatever the write grants
    plan(analyze("SELECT 1", SCHEMA), grants(allow_writes=False, allowed_write_ops=[]))


def test_ip_allow_list():
    g = grants(allowed_ips=["10.0.0.0/8", "2001:db8::/32", "192.168.1.7"])
    assert g.ip_allowed("10.1.2.3") and g.ip_allowed("192.168.1.7") and g.ip_allowed("2001:db8::1")
    assert g.ip_allowed("::ffff:10.0.0.1")
    assert not g.ip_allowed("192.168.1.8") and not g.ip_allowed("") and not g.ip_allowed("not-an-ip")
    assert not g.ip_allowed("11.0.0.1")
    assert grants().ip_allowed("anything")
    assert not grants(allowed_ips=[]).ip_allowed("10.0.0.1")
    with pytest.raises(GatewayError) as info:
        g.check_ip("8.8.8.8")
    assert info.value.code == "ip_not_allowed" and info.value.status == 403


# --- mask decisions ---------------------------------------------------------------------------------
def actions(sql, rules, query_masks=None):
    return plan(analyze(sql, SCHEMA), grants(mask=rules), query_masks, hash_key=KEY).actions


def test_strictest_action_wins():
    rules = [{"column": "customers.*", "action": "mask"}, {"column": "*.email", "action": "hash"},
             {"column": "public.customers.id", "action": "keep"}]
    # keep is the weakest action: it settles a column no stricter rule matches
    assert actions("SELECT id, name, email, email || name FROM customers", rules) == ("mask", "mask", "hash", "hash")
    assert actions("SELECT id FROM customers", [{"column": "customers.id", "action": "keep"}]) == (None,)
    assert actions("SELECT email FROM customers", [{"column": "customers.email", "action": "keep"}]) == (None,)
    assert actions("SELECT email FROM customers", [{"column": "customers.email", "action": "keep"},
                                                   {"column": "*.email", "action": "drop"}]) == ("drop",)
    assert actions("SELECT email FROM customers", [{"column": "CUSTOMERS.EMAIL", "action": "null"}]) == ("null",)
    assert actions("SELECT email FROM customers", [{"column": "private.customers.email", "action": "null"}]) == (None,)
    assert actions("SELECT secret FROM private.secrets", [{"column": "secrets.secret", "action": "null"}]) == ("null",)


def test_query_masks_apply_to_every_caller():
    assert actions("SELECT id, email FROM customers", None,
                   [{"column": "customers.email", "action": "drop"}]) == (None, "drop")
    assert actions("SELECT id, email FROM customers", [{"column": "customers.email", "action": "mask"}],
                   [{"column": "customers.email", "action": "null"}]) == (None, "null")


def test_mask_refusals():
    rules = [{"column": "customers.email", "action": "hash"}]
    refused_plan("SELECT row_to_json(c) FROM customers c", "mask_unresolvable", grants(mask=rules))
    refused_plan("SELECT contact FROM customer_contacts", "mask_unresolvable", grants(mask=rules))
    refused_plan("SELECT contact FROM customer_contacts", "mask_unresolvable",
                 grants(mask=rules + [{"column": "*.contact", "action": "keep"}]))
    assert actions("SELECT contact FROM customer_contacts",
                   rules + [{"column": "customer_contacts.contact", "action": "hash"}]) == ("hash",)
    assert actions("SELECT contact FROM customer_contacts", rules + [{"column": "customer_contacts.*",
                                                                       "action": "keep"}]) == (None,)
    refused_plan("INSERT INTO notes (body) SELECT email FROM customers", "mask_unresolvable",
                 grants(mask=rules, allow_writes=True))
    refused_plan("SELECT get_email(1)", "function_opaque", grants(mask=rules))
    # a whole row of a table with no masked column is fine
    assert actions("SELECT row_to_json(o) FROM orders o", rules) == (None,)
    assert actions("SELECT row_to_json(s) FROM (SELECT id FROM customers) s", rules) == (None,)


# --- apply ----------------------------------------------------------------------------------------
def test_apply_actions():
    call_plan = CallPlan(["hash", None, "mask", "null", "drop", "keep"], KEY)
    columns = ["a", "b", "c", "d", "e", "f"]
    rows = [("x@example.com", 1, "4111111111111111", "secret", "gone", "kept"), (None, 2, "abc", None, 1, None)]
    out_columns, out_rows = call_plan.apply(columns, rows)
    assert out_columns == ["a", "b", "c", "d", "f"]
    expected = hmac.new(KEY, b"x@example.com", hashlib.sha256).hexdigest()
    assert out_rows[0] == (expected, 1, "****1111", None, "kept")
    assert out_rows[1] == (None, 2, "****", None, None)
    # iterators stay lazy
    lazy_columns, lazy = call_plan.apply(columns, iter(rows))
    assert not isinstance(lazy, list) and list(lazy) == out_rows
    assert call_plan.apply_row(rows[0]) == out_rows[0]


def test_apply_identity_and_shape_check():
    identity = CallPlan([None, "keep"], None)
    rows = [(1, 2)]
    assert identity.apply(["a", "b"], rows) == (["a", "b"], rows)
    masked = CallPlan([None, "null"], None)
    with pytest.raises(GatewayError) as info:
        masked.apply(["a", "b", "c"], [(1, 2, 3)])
    assert info.value.code == "mask_unresolvable"
    with pytest.raises(ValueError):
        CallPlan(["hash"], None)
    only = CallPlan(["drop", None], None)
    assert only.apply(["a", "b"], [(1, 2)]) == (["b"], [(2,)])
    nothing = CallPlan(["drop"], None)
    assert nothing.apply(["a"], [(1,)]) == ([], [()])


def test_mask_and_hash_values_of_other_types():
    assert mask_value("12345678") == "****5678"
    assert mask_value("1234") == "****"
    assert mask_value(123456) == "****3456"
    assert mask_value(Decimal("12.50")) == "****2.50"
    assert mask_value(date(2024, 1, 31)) == "****1-31"
    assert mask_value({"a": 1}) is None and mask_value(b"bytes") is None and mask_value(None) is None
    call_plan = CallPlan(["hash"] * 4, KEY)
    _, rows = call_plan.apply(list("abcd"), [({"b": 1, "a": 2}, b"raw", datetime(2024, 1, 1, tzinfo=timezone.utc),
                                             42)])
    assert all(isinstance(v, str) and len(v) == 64 for v in rows[0])
    assert rows[0][3] == hmac.new(KEY, b"42", hashlib.sha256).hexdigest()


def test_plan_describe_and_limits():
    g = grants(mask=[{"column": "*.email", "action": "hash"}], max_rows=50, query_timeout=1.5)
    call_plan = plan(analyze("SELECT id, upper(email) AS e FROM customers", SCHEMA), g, hash_key=KEY)
    assert call_plan.describe() == [{"position": 1, "column": "e", "action": "hash",
                                     "source": "public.customers.email", "rule": "*.email"}]
    assert call_plan.max_rows == 50 and call_plan.query_timeout == 1.5


def test_apply_is_cheap_per_row():
    call_plan = CallPlan([None, "hash", None, "mask", "drop", None, None, "null"], KEY)
    columns = [f"c{i}" for i in range(8)]
    rows = [(i, f"user{i}@example.com", "x", f"card-{i:012d}", "drop", 1.5, None, "n") for i in range(50_000)]
    started = time.perf_counter()
    _, out = call_plan.apply(columns, rows)
    elapsed = time.perf_counter() - started
    assert len(out) == 50_000 and len(out[0]) == 7
    assert elapsed < 1.5, elapsed  # ~2 us per masked cell; generous for slow CI
    identity = CallPlan([None] * 8, None)
    started = time.perf_counter()
    for _ in range(10_000):
        identity.apply(columns, rows)
    assert time.perf_counter() - started < 0.5
