"""``analyze``: one statement read twice and checked (``reading``), the deny policy applied to
what PostgreSQL's parser read (calls, and the functions behind operators), sqlglot's tree
walked (``writes.StatementWalker``), and the walk's findings as one ``Analysis``."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from sqlglot import exp
from sqlglot.tokens import Token

from ...errors import bad_request
from ...sql import Statement
from ..schema import Schema, qname, split_qname
from .agree import names_survive, relations_agree
from .denied import DEFAULT_DENIED, SIDE_EFFECTS, denied_matcher
from .nodes import every_part_analysed, forbidden_nodes, statement_kind
from .pg_tree import operator_symbols, tree_write_ops
from .reading import postgres_reading, sqlglot_reading
from .refusals import TOO_DEEP, failed
from .result import Analysis, OutputColumn
from .scope import Col
from .writes import StatementWalker


def analyze(sql: str | Statement, schema: Schema | Mapping[str, Sequence[str]],
            search_path: Sequence[str] = ("public",),
            denied_functions: Iterable[str] = DEFAULT_DENIED, allowed_functions: Iterable[str] = (),
            allowed_catalog_relations: Iterable[str] = ()) -> Analysis:
    """Analyse one statement against ``schema`` (a :class:`Schema` or a mapping
    ``{"schema.table": (column, ...)}``): a :class:`gateway.sql.Statement` as the reader
    made it, or its positional text (``$1``). Raises ``GatewayError`` (400) when the
    statement is refused or cannot be analysed with certainty.

    ``allowed_catalog_relations``: the relations of ``pg_catalog``/``information_schema``,
    and those extensions own (``public.pg_stat_statements``), that the statement may read
    (``GATEWAY_ALLOW_CATALOG_RELATIONS``, schema-qualified); any other is refused
    (``catalog_not_allowed``), whatever the key."""
    statement = postgres_reading(sql)
    schema = Schema.coerce(schema)
    denied = denied_matcher(denied_functions, allowed_functions)
    catalog_allowed = _relation_names(allowed_catalog_relations)
    operator_calls = _refuse_denied_calls(statement, schema, denied)
    tokens, root = sqlglot_reading(statement)
    kind, write_op = statement_kind(root)
    if kind != statement.kind:
        raise failed("the statement's kind reads differently to the SQL analyser and to PostgreSQL")
    walker = StatementWalker(schema, search_path, denied, catalog_allowed)
    cols = _walk(walker, root, tokens, kind)
    relations_agree(statement.tree, walker.tables)
    return _analysis(walker, cols, statement, schema, operator_calls, kind, write_op)


def _relation_names(names: Iterable[str]) -> frozenset[tuple[str, str]]:
    relations = set()
    for name in names:
        parts = split_qname(name.strip())
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"{name!r} is not a schema-qualified relation name")
        relations.add(parts)
    return frozenset(relations)


def _refuse_denied_calls(statement: Statement, schema: Schema, denied: Callable[[str], bool]) -> set[str]:
    """The deny list over every call PostgreSQL's parser read; the functions the statement's
    operators call (an operator that is not built in is a call of the function behind it)."""
    for word in sorted(statement.calls):
        if denied(word.rsplit(".", 1)[-1]):
            raise bad_request("function_not_allowed", f"function {word}() is not allowed")
    operator_calls: set[str] = set()
    for symbol in sorted(operator_symbols(statement.tree) & set(schema.operators)):
        for function in schema.operators[symbol]:
            if denied(function):
                raise bad_request("function_not_allowed", f"operator {symbol} calls function {function}(), "
                                                          "which is not allowed")
            operator_calls.add(function.lower())
    return operator_calls


def _walk(walker: StatementWalker, root: exp.Expr, tokens: Sequence[Token], kind: str) -> list[Col]:
    try:
        forbidden_nodes(root)
        names_survive(tokens, root)
        cols = walker.statement(root, kind)
        every_part_analysed(root, walker.seen)
    except RecursionError:
        raise failed(TOO_DEEP) from None
    return cols


def _analysis(walker: StatementWalker, cols: list[Col], statement: Statement, schema: Schema,
              operator_calls: set[str], kind: str, write_op: str | None) -> Analysis:
    called = {f.rsplit(".", 1)[-1].lower() for f in walker.functions} | \
        {c.rsplit('.', 1)[-1] for c in statement.calls} | operator_calls
    user: tuple[str, ...] = ()
    if schema.functions is not None:
        user = tuple(sorted(f for f in schema.functions if f.lower() in called))
    side_effect = denied_matcher(SIDE_EFFECTS)
    side_effects = tuple(sorted(f for f in called if side_effect(f)))
    write_ops: tuple[str, ...] = ()
    if write_op is not None:
        extra = (walker.write_ops | tree_write_ops(statement.tree)) - {write_op}
        write_ops = (write_op,) + tuple(sorted(extra))
    return Analysis(kind=kind, write_op=write_op,
                    tables=tuple(sorted(qname(*t) for t in walker.tables)),
                    columns=tuple(_output_column(c) for c in cols),
                    whole_row=tuple(sorted(qname(*w) for w in walker.whole_any)),
                    functions=tuple(sorted(walker.functions)),
                    views=tuple(sorted(qname(*v) for v in walker.views)),
                    user_functions=user,
                    referenced=tuple(sorted(qname(*s) for s in walker.referenced)),
                    write_sources=tuple(sorted(qname(*s) for s in walker.write_sources)),
                    side_effects=side_effects, write_ops=write_ops,
                    catalogs=tuple(sorted(qname(*c) for c in walker.catalogs)))


def _output_column(col: Col) -> OutputColumn:
    return OutputColumn(col.name, frozenset(qname(*s) for s in col.sources), frozenset(qname(*w) for w in col.whole),
                        frozenset(qname(*s) for s in col.derived), col.exact)
