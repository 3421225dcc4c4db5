"""``gateway.cache.keys.digest``: what makes an entry unique, computed from a per-version prefix."""
from __future__ import annotations

import decimal
import hashlib

from gateway.cache import keys


class Connection:
    def __init__(self, identity):
        self.identity = identity


class Version:   # what digest reads of a QueryVersion (hashable by identity, as it is)
    def __init__(self, statement, connection):
        self.statement = statement
        self.connection = connection


def whole(qv, bound, page, size, reading=None):
    """The digest as one hash of the whole tuple's repr (its definition)."""
    return hashlib.blake2b(repr((qv.statement, qv.connection.identity, bound, page, size, reading)).encode(),
                           digest_size=16).hexdigest()


def test_digest_is_the_hash_of_the_whole_key():
    qv = Version("gw_q1_v1", Connection((1, "127.0.0.1", 5432, "demo", "u", "sealed'\"", (("sslmode", "x"),))))
    cases = [(), (1,), (True,), (1.0,), (0.0,), (-0.0,), (decimal.Decimal("1"),), ("1",), (None,), ("a'b\"c",),
             ([1, 2],), (1, "x", None)]
    seen = set()
    for bound in cases:
        for page, size in ((1, 10), (2, 10), (1, 11)):
            got = keys.digest(qv, bound, page, size)
            assert got == whole(qv, bound, page, size) and len(got) == 32
            seen.add(got)
    assert len(seen) == len(cases) * 3   # equal values of other types (1, True, 1.0) are other entries


def test_a_version_whose_connection_changed_gets_another_digest():
    conn = Connection((1, "h", 5432, "demo", "u", "p", ()))
    qv = Version("gw_q1_v1", conn)
    before = keys.digest(qv, (1,), 1, 10)
    conn.identity = (1, "h2", 5432, "demo", "u", "p", ())   # a new identity object: the prefix is made again
    after = keys.digest(qv, (1,), 1, 10)
    assert after != before and after == whole(qv, (1,), 1, 10)
    other = Version("gw_q1_v2", conn)
    assert keys.digest(other, (1,), 1, 10) == whole(other, (1,), 1, 10) != after


def test_the_prefixes_held_are_bounded():
    conn = Connection((1, "h", 5432, "demo", "u", "p", ()))
    versions = [Version(f"gw_q{i}_v1", conn) for i in range(keys._HELD + 10)]
    for qv in versions:
        assert keys.digest(qv, (), 1, 1) == whole(qv, (), 1, 1)
    assert len(keys._prefixes) <= keys._HELD


def test_what_the_columns_are_under_the_plans_schema_is_in_the_digest():
    qv = Version("gw_q1_v1", Connection((1, "h", 5432, "demo", "u", "p", ())))
    digests = {keys.digest(qv, (1,), 1, 10, reading) for reading in (None, "a" * 32, "b" * 32)}
    assert len(digests) == 3
    assert keys.digest(qv, (1,), 1, 10, "a" * 32) == whole(qv, (1,), 1, 10, "a" * 32)
