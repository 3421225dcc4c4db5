"""A key's governance grants, validated and compiled once (at catalog load).

``Grants.from_doc(doc)`` reads the QueryAPIGate-style fields of a key's grants:

* ``allowed_tables``: None (no restriction) or a list of relations the key may touch:
  ``schema.table``, ``schema.*``, or a bare ``table`` meaning ``public.table``. Names are
  exact (PostgreSQL's stored names; unquoted SQL folds to lower case). An empty list allows
  no relation. A view is a relation of its own: listing it allows reading it.
* ``mask``: a list of ``{"column": pattern, "action": action}`` (``gateway.governance.masks``).
* ``allow_writes`` (bool), ``allowed_write_ops`` (None or a list of insert / update /
  delete / merge), ``max_rows`` (int), ``query_timeout`` (seconds), ``allowed_ips`` (None
  or a list of addresses / CIDR ranges, IPv4 and IPv6).

What the grants make of a query version, the call plan, is ``gateway.governance.planning``.
"""
from __future__ import annotations

import fnmatch
import ipaddress
import re
from collections.abc import Mapping
from typing import Any

from ..errors import forbidden
from .masks import MaskRule, compile_masks, invalid_grant
from .schema import split_qname

__all__ = ["Grants", "compile_masks"]

WRITE_OPS = ("insert", "update", "delete", "merge")


class _TableMatcher:
    __slots__ = ("exact", "patterns", "raw")

    def __init__(self, names: Any) -> None:
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise invalid_grant("allowed_tables",
                                "must be a list of table names (schema.table, schema.*, table), or null")
        self.raw = list(names)
        self.exact: set[tuple[str, str]] = set()
        self.patterns: list[tuple[re.Pattern[str], re.Pattern[str]]] = []
        for name in names:
            try:
                parts = split_qname(name)
            except ValueError:
                raise invalid_grant("allowed_tables", f"{name!r} is not a table name") from None
            if len(parts) == 1:
                parts = ("public", parts[0])
            if len(parts) != 2 or not all(parts):
                raise invalid_grant("allowed_tables", f"{name!r} must be schema.table, schema.* or table")
            if any(ch in p for p in parts for ch in "*?["):
                self.patterns.append((re.compile(fnmatch.translate(parts[0]), re.DOTALL),
                                      re.compile(fnmatch.translate(parts[1]), re.DOTALL)))
            else:
                self.exact.add(parts)

    def allows(self, qualified: str) -> bool:
        try:
            parts = split_qname(qualified)
        except ValueError:
            return False
        if len(parts) != 2:
            return False
        if parts in self.exact:
            return True
        return any(s.match(parts[0]) and t.match(parts[1]) for s, t in self.patterns)


class Grants:
    """A key's governance grants, validated and compiled once (at catalog load)."""

    __slots__ = ("allowed_tables", "masks", "allow_writes", "allowed_write_ops", "max_rows", "query_timeout",
                 "allowed_ips", "_networks")

    def __init__(self, allowed_tables: _TableMatcher | None = None, masks: tuple[MaskRule, ...] = (),
                 allow_writes: bool = False, allowed_write_ops: frozenset[str] | None = None,
                 max_rows: int | None = None, query_timeout: float | None = None,
                 allowed_ips: list[str] | None = None) -> None:
        self.allowed_tables = allowed_tables        # _TableMatcher or None
        self.masks = masks                          # tuple[MaskRule, ...]
        self.allow_writes = allow_writes
        self.allowed_write_ops = allowed_write_ops  # frozenset or None
        self.max_rows = max_rows
        self.query_timeout = query_timeout          # seconds or None
        self.allowed_ips = allowed_ips              # list of strings or None
        self._networks = None if allowed_ips is None else \
            tuple(ipaddress.ip_network(v, strict=False) for v in allowed_ips)

    @classmethod
    def from_doc(cls, doc: Mapping | None) -> Grants:
        doc = doc or {}
        if not isinstance(doc, Mapping):
            raise invalid_grant("grants", "must be an object")
        tables = doc.get("allowed_tables")
        matcher = None if tables is None else _TableMatcher(tables)
        masks = compile_masks(doc.get("mask"))
        allow_writes = doc.get("allow_writes", False)
        if not isinstance(allow_writes, bool):
            raise invalid_grant("allow_writes", "must be true or false")
        ops = doc.get("allowed_write_ops")
        if ops is not None:
            if not isinstance(ops, list) or not all(isinstance(o, str) for o in ops) \
                    or not {o.lower() for o in ops} <= set(WRITE_OPS):
                raise invalid_grant("allowed_write_ops", f"must be a list of {', '.join(WRITE_OPS)}, or null")
            ops = frozenset(o.lower() for o in ops)
        max_rows = doc.get("max_rows")
        if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int)
                                     or not 1 <= max_rows <= 10_000_000):
            raise invalid_grant("max_rows", "must be a whole number from 1 to 10,000,000, or null")
        timeout = doc.get("query_timeout")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not 0.1 <= timeout <= 86400):
            raise invalid_grant("query_timeout", "must be a number of seconds from 0.1 to 86400, or null")
        ips = doc.get("allowed_ips")
        if ips is not None:
            if not isinstance(ips, list) or not all(isinstance(v, str) for v in ips):
                raise invalid_grant("allowed_ips", "must be a list of IP addresses or CIDR ranges, or null")
            for value in ips:
                try:
                    ipaddress.ip_network(value, strict=False)
                except ValueError:
                    raise invalid_grant("allowed_ips", f"{value!r} is not an IP address or CIDR range") from None
        return cls(matcher, masks, allow_writes, ops, max_rows, timeout, ips)

    def to_doc(self) -> dict:
        return {"allowed_tables": self.allowed_tables.raw if self.allowed_tables is not None else None,
                "mask": [m.to_doc() for m in self.masks] or None, "allow_writes": self.allow_writes,
                "allowed_write_ops": sorted(self.allowed_write_ops) if self.allowed_write_ops is not None else None,
                "max_rows": self.max_rows, "query_timeout": self.query_timeout, "allowed_ips": self.allowed_ips}

    def table_allowed(self, qualified: str) -> bool:
        return self.allowed_tables is None or self.allowed_tables.allows(qualified)

    def ip_allowed(self, client_ip: str) -> bool:
        """True with no ``allowed_ips``; otherwise the address must parse and fall in a range
        (an IPv4-mapped IPv6 address counts as its IPv4 address). Fails closed."""
        networks = self._networks
        if networks is None:
            return True
        if not client_ip:
            return False
        try:
            address = ipaddress.ip_address(client_ip.strip().split("%", 1)[0])
        except ValueError:
            return False
        mapped = getattr(address, "ipv4_mapped", None)
        if mapped is not None:
            address = mapped
        return any(address.version == net.version and address in net for net in networks)

    def check_ip(self, client_ip: str) -> None:
        if not self.ip_allowed(client_ip):
            raise forbidden("ip_not_allowed", "this key may not be used from this address")
