"""Names as PostgreSQL has them: identifiers folded and truncated as the server stores them,
the words it reads as values, and the name it gives an output column."""
from __future__ import annotations

from sqlglot import exp

from ...sql.reader import fold
from .refusals import failed

NAMEDATALEN = 64


def pg_name(text: str, quoted: bool) -> str:
    """An identifier as PostgreSQL stores it: unquoted ones folded to lower case (ASCII
    letters only, as ``downcase_identifier`` does in UTF-8), truncated to 63 bytes."""
    name = text if quoted else fold(text)
    data = name.encode("utf-8")
    if len(data) >= NAMEDATALEN:
        name = data[:NAMEDATALEN - 1].decode("utf-8", "ignore")
    return name


def ident(node: object) -> str:
    if isinstance(node, exp.Identifier):
        return pg_name(node.this, bool(node.quoted))
    if isinstance(node, str):
        return pg_name(node, False)
    raise failed(f"expected a name, found {type(node).__name__}")


# The functions sqlglot types under a name other than PostgreSQL's.
_TYPED_NAMES = {"explodinggenerateseries": "generate_series", "generateseries": "generate_series",
                "unnest": "unnest", "groupconcat": "string_agg", "arrayagg": "array_agg"}
# Words PostgreSQL reads as values where a column name could stand.
KEYWORD_VALUES = frozenset({"current_user", "session_user", "user", "current_role", "current_catalog",
                            "current_schema", "current_date", "current_time", "current_timestamp",
                            "localtime", "localtimestamp"})


def typed_name(node: exp.Func) -> str:
    """The name of a function sqlglot has a type for, as PostgreSQL spells it."""
    return _TYPED_NAMES.get(type(node).__name__.lower()) or node.sql_name().lower()


def bare_column(node: exp.Expr) -> exp.Column | None:
    """The column reference ``node`` is, through an alias and parentheses, or None."""
    if isinstance(node, exp.Alias):
        node = node.this
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Column) and isinstance(node.this, exp.Identifier):
        return node
    return None


def exact_name(node: exp.Expr) -> bool:
    """Whether :func:`output_name` is certainly PostgreSQL's name for the projection: an
    alias, or a column reference (PostgreSQL names a cast of a column after the column).
    Other expressions are named after functions as sqlglot reads them (``substr`` becomes
    ``substring``), so their names are not checked against a result's."""
    if isinstance(node, exp.Alias):
        return True
    while isinstance(node, (exp.Cast, exp.Paren)):
        node = node.this
    return isinstance(node, exp.Column) and isinstance(node.this, exp.Identifier) \
        and not (ident(node.this) in KEYWORD_VALUES and not node.this.quoted)


def output_name(node: exp.Expr) -> str:
    if isinstance(node, exp.Alias):
        return ident(node.args["alias"])
    inner = node
    while isinstance(inner, (exp.Cast, exp.Paren)):
        inner = inner.this
    if isinstance(inner, exp.Column) and isinstance(inner.this, exp.Identifier):
        return ident(inner.this)
    if isinstance(inner, exp.Anonymous):
        return ident(inner.this) if isinstance(inner.this, (exp.Identifier, str)) else "?column?"
    if isinstance(inner, exp.Case):
        return "case"
    if isinstance(inner, exp.Func):
        return typed_name(inner)
    return "?column?"



def alias_name_of(alias: exp.TableAlias | None) -> str | None:
    """The name a table alias gives (``AS t``), if it gives one (``AS (a, b)`` does not)."""
    return ident(alias.this) if alias is not None and alias.this is not None else None
