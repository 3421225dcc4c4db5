"""The stable error codes that governance adds, in the shape of ``gateway.errors.CODES``
(code -> (HTTP status, meaning)); the lead merges them into that table.

Analysis codes (400) are raised when a query is saved (or an ad-hoc statement is first
seen); planning codes (403) when a key meets a query version. ``write_not_allowed`` (403)
is reused from ``gateway.errors.CODES``; a malformed grants document raises the existing
``invalid_body``.
"""
from __future__ import annotations

CODES: dict[str, tuple[int, str]] = {
    "sql_not_allowed": (400, "The statement kind is refused: only SELECT, VALUES, set operations, WITH (without "
                             "data-modifying parts), INSERT, UPDATE, DELETE and MERGE are served; DDL, COPY, "
                             "SET/RESET, DO, CALL, EXPLAIN, transaction control, LOCK, LISTEN/NOTIFY, SELECT ... "
                             "INTO, row locks (FOR UPDATE) and writable CTEs are not."),
    "multiple_statements": (400, "The SQL holds more than one statement."),
    "function_not_allowed": (400, "The SQL calls a function on the deny list (file, large-object, session, lock, "
                                  "replication, statistics, dynamic-SQL or remote-connection functions such as "
                                  "`pg_read_file`, `lo_import`, `set_config`, `pg_stat_get_activity`, `dblink`, "
                                  "`query_to_xml`), by name or through an operator."),
    "catalog_not_allowed": (400, "The SQL reads a relation of `pg_catalog` or `information_schema`, or one an "
                                 "extension owns (statistics hold column values, `pg_stat_activity` and "
                                 "`pg_stat_statements` other callers' statements, `pg_authid` password hashes); "
                                 "refused for every key unless `GATEWAY_ALLOW_CATALOG_RELATIONS` names it."),
    "unknown_table": (400, "The SQL names a relation that does not resolve, through the search path, to a table or "
                           "view of the connection's schema."),
    "unknown_column": (400, "The SQL names a column that does not resolve to a column of a relation in scope."),
    "analysis_failed": (400, "The SQL could not be analysed with certainty (it does not parse, two SQL readers "
                             "disagree on where its code is, it is ambiguous, or it uses a construct the analysis "
                             "does not follow), so it is refused rather than served ungoverned."),
    "table_not_allowed": (403, "The query touches a table or view outside the key's `allowed_tables`."),
    "write_op_not_allowed": (403, "One of the query's write operations (insert, update, delete, merge) is not in the "
                                  "key's `allowed_write_ops` (`INSERT ... ON CONFLICT DO UPDATE` needs insert and "
                                  "update; `MERGE` needs merge and each of its actions' operations)."),
    "mask_unresolvable": (403, "A mask rule applies, but masking cannot be guaranteed: a whole row of a masked table "
                               "is used (`row_to_json(t)`, `t.*` in a function), a view is read that no mask rule "
                               "names, masked values would be written into a table, or the result no longer has the "
                               "analysed shape."),
    "function_opaque": (403, "The query calls a user-defined function (by name, or through an operator it backs), "
                             "whose reads the gateway cannot see, and the key has table or mask restrictions."),
    "ip_not_allowed": (403, "The client address is not in the key's `allowed_ips`."),
}
