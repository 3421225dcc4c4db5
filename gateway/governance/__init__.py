"""Governance that cannot be talked around: save-time analysis of a statement (kind,
tables, per-output-column lineage), a key's grants compiled once, and a per-(key, query
version) call plan that masks results with precomputed index lists.

    schema = load_schema(data_conn, ("public",))                  # per connection, cached by the caller
    analysis = analyze(text.positional, schema, ("public",))      # save time; store analysis.to_doc()
    grants = Grants.from_doc(key.grants)                          # catalog load
    call_plan = plan(Analysis.from_doc(doc), grants, query_masks,
                     hash_key=mask_key, server_allows_writes=settings.allow_writes)  # once per (key, version)
    columns, rows = call_plan.apply(columns, rows)                # per call: index lists only

Integration notes (for whoever wires it into the gateway):

* **Search path.** ``analyze`` resolves unqualified names through the ``search_path`` it is
  given (``pg_catalog`` implicitly first, as PostgreSQL does). The data sessions that run
  the statement must use the same path: pin it in the session options
  (``-c search_path=public``); ``SET``/``set_config`` are refused, so a caller cannot move it.
* **Schema drift.** The analysis is as good as the schema it was made against: analyse
  again when a connection's schema changes. When masks apply, ``CallPlan.apply`` refuses
  (``mask_unresolvable``) a result whose width differs from the analysed one, or whose column
  names are not the analysed ones (checked where the analysis knows PostgreSQL's name), so an
  added column never slips out unmasked through ``SELECT *`` and a dropped-and-added one never
  moves a mask onto its neighbour. Pass the same ``columns`` tuple on every call of a query
  version (the check is then one identity test), named from the *current* result.
* **Strings.** The statement is lexed both with and without ``standard_conforming_strings``
  and refused if the readings differ, so the server setting cannot change what runs; a
  backslash in a plain ``'...'`` literal that matters must be written ``E'...'``.
* **Catalogs.** Relations of ``pg_catalog``/``information_schema`` are refused for every key
  (``catalog_not_allowed``) unless ``analyze(..., allowed_catalog_relations=...)`` names them
  (``Settings.allowed_catalog_relations()``, from ``GATEWAY_ALLOW_CATALOG_RELATIONS``).
* **Side effects.** ``Analysis.side_effects`` (``nextval``, ``txid_current``, ...) and every
  write operation (``Analysis.write_ops``: an upsert also updates, a MERGE does its actions)
  are checked by ``plan``: side effects run only in a granted write.
* **Codes.** ``codes.CODES`` holds the new stable codes (analysis: 400; planning: 403);
  ``write_not_allowed`` and ``invalid_body`` are reused.
"""
from .analysis import DEFAULT_DENIED, Analysis, OutputColumn, analyze, denied_matcher
from .call_plan import CallPlan
from .codes import CODES
from .grants import Grants
from .masks import ACTIONS, MaskRule, compile_masks, mask_value
from .planning import plan
from .schema import Schema, load_schema, qname, split_qname

__all__ = ["analyze", "Analysis", "OutputColumn", "Schema", "load_schema", "DEFAULT_DENIED", "denied_matcher",
           "Grants", "MaskRule", "compile_masks", "CallPlan", "plan", "ACTIONS", "mask_value", "CODES",
           "qname", "split_qname"]
