"""Save-time analysis of one statement: its kind, every relation it touches, and for each
output column the source columns it is computed from (lineage). Everything governance
enforces per call is derived from this, once, so the hot path never parses SQL.

``analyze(statement, schema)`` takes a statement read by ``gateway.sql`` (PostgreSQL's own
parser; or its positional ``$n`` text) and reads it again with sqlglot's PostgreSQL dialect. It fails
closed: whatever it cannot resolve with certainty raises a ``GatewayError`` (400) with a
stable code (``gateway.governance.codes``), it never guesses.

How it stays honest:

* **Two readers agree.** sqlglot's tokens are checked against PostgreSQL's own lexer and
  parser (``gateway.sql``): identifiers, keywords and quoted identifiers must be the same
  sequence, parameters at the same places, the kind the same, so nothing PostgreSQL runs can
  hide from the parse tree inside a string or comment that sqlglot reads differently.
  ``U&`` escapes are refused outright.
* **Denied functions** are refused by name wherever they appear as a call: in the parse
  tree and in PostgreSQL's parse tree (every ``FuncCall``), quoted or schema-qualified.
* **Every part is resolved.** The analysis walks each clause itself (not sqlglot's
  optimizer) and at the end checks that every table, column, subquery and function node of
  the tree was resolved; a construct it does not follow is a refusal, not a silent skip.
* **Lineage is conservative.** An output column derives from every column referenced
  anywhere inside its expression (CASE conditions, window partitions, FILTER clauses,
  scalar subqueries' outputs); a set operation's column i from column i of every branch;
  a whole-row reference (``t``, ``t.*`` in a function, ``row_to_json(t)``) from every
  column of ``t`` and is flagged (``whole_row``). Predicates (WHERE, JOIN ... ON) are not
  output lineage: they are recorded in ``referenced``. A source that reaches a column through
  anything but a bare column reference (renamed through aliases, subqueries, CTEs and set
  operations) is ``derived``: the planner will not hash or partially mask such a value.
  Reading a table reads its inheritance children and partitions: their columns are sources.
* **Names resolve like PostgreSQL.** Unquoted identifiers fold to lower case; relations
  resolve through ``search_path`` with ``pg_catalog`` implicitly first (unless listed), so
  ``pg_authid`` is ``pg_catalog.pg_authid`` even when ``public.pg_authid`` exists; CTE names
  shadow tables only where SQL scoping says so; an unknown relation or column, an
  ambiguous column, or a forward reference inside ``WITH RECURSIVE`` is refused.

The package, one concept a module: ``denied`` (the deny policy), ``result`` (``Analysis``),
``reading`` (the two readings) and ``agree`` (the check that they agree), ``pg_tree`` (what
PostgreSQL's tree says of operators and write operations), ``names`` and ``scope`` (names
and name scoping), the walker in layers (``walker``, ``expressions``, ``relations``,
``queries``, ``writes``), ``nodes`` and ``refusals``; ``driver`` holds ``analyze``.
"""
from ..schema import Schema, load_schema
from .denied import CATALOG_SCHEMAS, DEFAULT_DENIED, SIDE_EFFECTS, denied_matcher
from .driver import analyze
from .result import Analysis, OutputColumn

__all__ = ["analyze", "Analysis", "OutputColumn", "Schema", "load_schema", "DEFAULT_DENIED",
           "SIDE_EFFECTS", "CATALOG_SCHEMAS", "denied_matcher"]
