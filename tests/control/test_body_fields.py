"""The management bodies' field rules (``gateway.control.validate.Fields``): the answers a
bad field gets, pinned (code, message, ``errors``), for a key (its first problem) and a
connection (every problem at once, in the table's order); and what the table's two modes do
with a body that has several problems. Pure: no store is reached (a body that passes the checks
would go on to the store, which these tests never get to)."""
from __future__ import annotations

import pytest

from gateway.control.connections import Connections
from gateway.control.keys import Keys, grants_of
from gateway.control.validate import TRUE_OR_FALSE, Fields, Problem, rule, whole_number
from gateway.errors import GatewayError


def answer(call, *args):
    with pytest.raises(GatewayError) as info:
        call(*args)
    error = info.value
    return error.status, error.code, error.message, (error.extra or {}).get("errors")


@pytest.mark.parametrize("body, message, errors", [
    ({"queries": "some"}, "queries must be a list of strings", {"queries": "must be a list of strings"}),
    ({"queries": [5]}, 'queries must be a list of names or objects, or "*"',
     {"queries": 'must be a list of names or objects, or "*"'}),
    ({"queries": [{"nom": "x"}]}, 'each queries entry is a name or {"name": ..., "allow_writes": true}',
     {"queries": "has an invalid entry"}),
    ({"queries": ["a", {"name": "a"}]}, 'queries lists "a" more than once', {"queries": "lists a name twice"}),
    ({"connections": [1]}, "connections must be a list of strings", {"connections": "must be a list of strings"}),
    ({"collections": ["c"]}, "collections are not supported: grant queries by name", {"collections": "must be empty"}),
    ({"max_concurrent": 0}, "max_concurrent must be a whole number from 1 to 10000, or null",
     {"max_concurrent": "must be a whole number from 1 to 10000, or null"}),
    ({"max_concurrent": True}, "max_concurrent must be a whole number from 1 to 10000, or null",
     {"max_concurrent": "must be a whole number from 1 to 10000, or null"}),
    ({"active": "yes"}, "active must be true or false", {"active": "must be true or false"}),
    ({"allow_writes": 1}, "allow_writes must be true or false", {"allow_writes": "must be true or false"}),
    # The first field in the table's order is the one named.
    ({"allow_writes": 1, "active": 0, "queries": 5}, "queries must be a list of strings",
     {"queries": "must be a list of strings"}),
])
def test_a_keys_first_bad_field_is_the_answer(body, message, errors):
    assert answer(grants_of, body) == (400, "invalid_body", message, errors)


def test_a_good_keys_grants():
    grants = grants_of({"queries": ["b", {"name": "a", "allow_writes": True}], "connections": ["c", "c"],
                        "max_concurrent": None, "active": False})
    assert grants == {"queries": ["a", "b"], "connections": ["c"], "query_writes": ["a"], "max_concurrent": None,
                      "active": False}


@pytest.mark.parametrize("grace", [-1, 10_081, 1.5, True, "5"])
def test_rotation_grace(grace):
    assert answer(Keys(None).rotate, "k", {"grace_minutes": grace}) == (
        400, "invalid_body", "grace_minutes must be a whole number from 0 to 10080",
        {"grace_minutes": "must be a whole number from 0 to 10080"})


class Box:
    def seal(self, value):
        return None if value is None else f"sealed:{value}"


def test_a_connection_names_every_bad_field_in_order():
    body = {"options": "x", "active": 1, "password": 5, "port": "²", "db": "mysql", "host": ""}
    assert answer(Connections(None, Box())._values, body, False) == (400, "invalid_body", "invalid connection", {
        "db": "only 'postgres' is supported", "host": "must be a non-empty string", "database": "is required",
        "user": "is required", "port": "must be an integer from 1 to 65535", "password": "must be a string",
        "active": "must be true or false", "options": "must be an object"})
    # A partial body (an update) requires nothing; driver options beside the fields join options.
    assert answer(Connections(None, Box())._values, {"sslmode": True, "keepalives": []}, True)[3] == {
        "options": "keepalives, sslmode must be a string or a number"}
    assert answer(Connections(None, Box())._values, {"sslmode": "require", "options": 5}, True)[3] == {
        "options": "must be an object"}


def test_a_good_connections_stored_values():
    values = Connections(None, Box())._values({"db": "postgresql", "host": "h", "database": "d", "user": "u",
                                               "port": "5433", "password": "pw", "sslmode": "require"}, False)
    assert {k: getattr(v, "adapted", v) for k, v in values.items()} == {
        "db": "postgres", "host": "h", "database": "d", "username": "u", "port": 5433, "password": "sealed:pw",
        "options": {"sslmode": "require"}}


def test_the_two_modes_of_a_table():
    rules = {"a": TRUE_OR_FALSE, "b": (whole_number(1, 3), rule(lambda v: v != 2, "is not two")),
             "c": lambda v: Problem("no", "c is out")}
    first, every = Fields(rules), Fields(rules, invalid="invalid thing")
    body = {"c": 1, "b": 4, "a": 0}
    assert answer(first.check, body) == (400, "invalid_body", "a must be true or false",
                                         {"a": "must be true or false"})
    assert answer(first.check, {"c": 1}) == (400, "invalid_body", "c is out", {"c": "no"})
    assert answer(every.check, body) == (400, "invalid_body", "invalid thing", {
        "a": "must be true or false", "b": "must be a whole number from 1 to 3", "c": "no"})
    assert answer(every.check, {"b": 2})[3] == {"b": "is not two"}   # every rule of a field, the first problem
    assert answer(every.check, {}, ["b"]) == (400, "invalid_body", "invalid thing", {"b": "is required"})
    first.check({"a": True, "b": 3})   # fine: nothing raised
    every.check({})
