"""Governance that cannot be talked around: save-time analysis of a statement (kind,
tables, per-output-column lineage), a key's grants compiled once, and a per-(key, query
version) call plan that masks results with precomputed index lists.

    analysis = analyze(text.positional, schema)          # save time, stored as analysis.to_doc()
    call_plan = plan(analysis, Grants.from_doc(key.grants), query_masks, hash_key=mask_key)
    columns, rows = call_plan.apply(columns, rows)        # per call
"""
from .analysis import DEFAULT_DENIED, Analysis, OutputColumn, analyze, denied_matcher
from .codes import CODES
from .grants import ACTIONS, CallPlan, Grants, MaskRule, compile_masks, mask_value, plan
from .schema import Schema, load_schema, qname, split_qname

__all__ = ["analyze", "Analysis", "OutputColumn", "Schema", "load_schema", "DEFAULT_DENIED", "denied_matcher",
           "Grants", "MaskRule", "compile_masks", "CallPlan", "plan", "ACTIONS", "mask_value", "CODES",
           "qname", "split_qname"]
