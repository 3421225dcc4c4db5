"""The deny policy: functions refused wherever they are called, functions with side effects
(allowed only in a granted write), and the schemas of the server's own relations. The lists
are data; ``denied_matcher`` turns one into a predicate."""
from __future__ import annotations

from collections.abc import Callable, Iterable

# Functions refused wherever they are called. An entry ending in "*" is a prefix.
DEFAULT_DENIED: frozenset[str] = frozenset({
    # server files and programs
    "pg_read_file", "pg_read_binary_file", "pg_ls_*", "pg_stat_file", "pg_file_*", "pg_current_logfile",
    # large objects (server-side file import/export, arbitrary blobs)
    "lo_*", "loread", "lowrite",
    # session state, configuration and sleeping
    "set_config", "pg_sleep*", "pg_reload_conf", "pg_rotate_logfile", "pg_log_backend_memory_contexts",
    "pg_stat_reset*", "pg_stat_statements_reset",
    # other sessions, their query texts, locks and prepared statements (a pooled session holds
    # other callers'), and the statistics of every table (behind pg_stat_activity & co.)
    "pg_terminate_backend", "pg_cancel_backend", "pg_stat_get_*", "pg_lock_status", "pg_blocking_pids",
    "pg_safe_snapshot_blocking_pids", "pg_prepared_statement", "pg_cursor", "pg_prepared_xact",
    "pg_get_backend_memory_contexts", "pg_get_shmem_allocations", "pg_stat_statements", "pg_stat_statements_info",
    "pg_get_replication_slots", "pg_show_replication_origin_status",
    # server configuration, its files and its build; current_setting(name) is a row of
    # pg_settings (refused as a relation), custom ones included (``app.jwt_secret``, set per
    # database or role, is readable by every role)
    "pg_hba_file_rules", "pg_ident_file_mappings", "pg_show_all_file_settings", "pg_show_all_settings",
    "current_setting", "pg_settings_get_flags", "pg_config", "pg_control_*", "binary_upgrade_*",
    # what the catalogs hold, through functions rather than relations: the source of functions,
    # views, rules and triggers (pg_proc, pg_rewrite ... may hold literals: keys, addresses),
    # comments (pg_description), and the counters of sequences (unknown_table as relations)
    "pg_get_functiondef", "pg_get_viewdef", "pg_get_ruledef", "pg_get_triggerdef", "pg_get_indexdef",
    "pg_get_constraintdef", "pg_get_expr", "pg_get_statisticsobjdef*", "pg_get_partkeydef",
    "pg_get_partition_constraintdef", "obj_description", "col_description", "shobj_description",
    "pg_sequence_last_value", "pg_sequence_parameters",
    # locks and notifications
    "pg_advisory*", "pg_try_advisory*", "pg_notify",
    # replication, WAL, backups: these read or move every row
    "pg_logical_*", "pg_replication_*", "pg_create_*", "pg_drop_replication_slot", "pg_copy_*",
    "pg_switch_wal", "pg_promote", "pg_backup_*", "pg_start_backup", "pg_stop_backup", "pg_wal_replay_*",
    "pg_get_wal_*", "pg_import_system_collations", "pg_prewarm",
    # dynamic SQL or tables read by name, past the allow-list and the masks
    "query_to_xml*", "cursor_to_xml*", "table_to_xml*", "schema_to_xml*", "database_to_xml*",
    "ts_stat", "ts_rewrite", "crosstab*", "connectby", "xpath_table", "dblink*",
    # raw pages and buffers (pageinspect, pg_buffercache, pgstattuple, pg_visibility)
    "get_raw_page", "heap_page_items", "heap_page_item_attrs", "bt_page_items", "brin_page_items",
    "gin_leafpage_items", "pg_buffercache_pages", "pgstattuple*", "pg_visibility*",
    # sequences: moving another table's counter
    "setval",
    # newer servers' (17, 18): replication slots, and writing any table's planner statistics
    "pg_sync_replication_slots", "pg_restore_relation_stats", "pg_restore_attribute_stats",
    "pg_clear_relation_stats", "pg_clear_attribute_stats",
})

# Functions with side effects (or that read another caller's session state): allowed only in
# a statement that writes, for a key (and a server) that allows writes. The deny list wins
# where both name a function (``pg_advisory_lock`` stays refused unless lifted).
SIDE_EFFECTS: frozenset[str] = frozenset({
    "nextval", "setval", "currval", "lastval", "setseed",
    "pg_advisory*", "pg_try_advisory*", "pg_notify", "set_config",
    "brin_summarize_*", "brin_desummarize_range", "gin_clean_pending_list",
    "lo_*", "loread", "lowrite", "txid_*", "pg_current_xact_id*", "pg_export_snapshot",
    "pg_terminate_backend", "pg_cancel_backend", "pg_stat_reset*", "pg_stat_statements_reset",
    "pg_stat_force_next_flush", "pg_replication_origin_*", "pg_log_standby_snapshot",
    "pg_restore_relation_stats", "pg_restore_attribute_stats", "pg_clear_relation_stats", "pg_clear_attribute_stats",
})

# The schemas of the system catalogs: their relations (and those an extension owns, wherever
# it was installed) are refused for every key unless the server names them
# (``GATEWAY_ALLOW_CATALOG_RELATIONS``).
CATALOG_SCHEMAS = frozenset({"pg_catalog", "information_schema"})


def denied_matcher(denied: Iterable[str], allowed: Iterable[str] = ()) -> Callable[[str], bool]:
    """A predicate ``name -> bool`` for a deny list (case-insensitive; ``x*`` is a prefix),
    minus the exact names an operator lifted (``GATEWAY_ALLOW_FUNCTIONS``)."""
    exact = {d.lower() for d in denied if not d.endswith("*")}
    prefixes = tuple(d[:-1].lower() for d in denied if d.endswith("*"))
    lifted = frozenset(a.lower() for a in allowed)

    def match(name: str) -> bool:
        low = name.lower()
        return low not in lifted and (low in exact or (bool(prefixes) and low.startswith(prefixes)))
    return match

