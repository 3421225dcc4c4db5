"""The check that two SQL readers agree. The analysis walks sqlglot's parse tree; PostgreSQL
runs what its own parser reads (``gateway.sql``). So sqlglot's tokens must name the same
words in the same order, with parameters at the same places; every name sqlglot's
tokenizer saw must survive into its parse tree; and every relation PostgreSQL's tree names
must be one the analysis resolved. Nothing PostgreSQL runs can then hide from the walker
inside what sqlglot took for a string, a comment or a clause it dropped."""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from sqlglot import exp
from sqlglot.tokens import Token

from ...sql import Statement
from ...sql.reader import fold
from ...sql.trees import nodes
from .refusals import failed

_STRING_TOKENS = frozenset(("STRING", "BYTE_STRING", "HEREDOC_STRING", "NATIONAL_STRING", "BIT_STRING",
                            "HEX_STRING", "RAW_STRING", "UNICODE_STRING"))
# Any character past ASCII counts as a letter (as PostgreSQL's lexer has it). Spelled as a negated
# ASCII class: the range \u0080-\U0010ffff is the same set, but compiling it cost every worker's
# boot 4.8 ms of CPU (0.2 ms this way).
WORD_FULL = re.compile(r"(?:[A-Za-z_]|[^\x00-\x7f])(?:[A-Za-z0-9_$]|[^\x00-\x7f])*\Z")


def sqlglot_words(tokens: Iterable[Token]) -> list[tuple[str, str]]:
    """The words (identifiers and keywords) of sqlglot's tokens, in the reader's form."""
    words = []
    for token in tokens:
        kind = token.token_type.name
        if kind in _STRING_TOKENS:
            continue
        if kind == "IDENTIFIER":
            words.append(("q", token.text))
            continue
        for part in token.text.split():
            if WORD_FULL.match(part):
                words.append(("w", fold(part)))
    return words


def readers_agree(statement: Statement, tokens: Sequence[Token]) -> None:
    """sqlglot's tokens must name the same words, in the same order, and put parameters at
    the same places as PostgreSQL's parser: nothing PostgreSQL runs can hide from the parse
    tree inside what sqlglot took for a string or a comment (or the other way round)."""
    if sqlglot_words(tokens) != list(statement.words):
        raise failed("the statement reads differently to the SQL analyser and to PostgreSQL "
                      "(quoting or comments it cannot follow)")
    params = tuple(t.start for t in tokens if t.token_type.name == "PARAMETER")
    if params != statement.params:
        raise failed("the statement's parameters read differently to the SQL analyser and to PostgreSQL")


# Keywords sqlglot tokenizes as plain words but keeps as structure, not as names.
_STRUCTURAL_WORDS = frozenset({"within", "nulls", "first", "last", "at", "time", "zone", "local", "conflict",
                               "nothing", "matched", "both", "leading", "trailing", "placing", "ties",
                               "ordinality", "escape", "symmetric", "asymmetric", "do", "no", "key", "of",
                               "unbounded", "preceding", "following", "current", "row", "rows", "range",
                               "groups", "exclude", "others"})


def names_survive(tokens: Sequence[Token], root: exp.Expr) -> None:
    """Every name sqlglot's tokenizer saw (other than a function name) must be in the parse
    tree: a clause the parser dropped cannot take a table or column out of the analysis."""
    names: set[str] = set()
    for node in root.walk():
        if isinstance(node, exp.Identifier):
            names.add(str(node.this).lower())
        elif isinstance(node, exp.Var):
            names.add(str(node.this).lower())
        elif isinstance(node, exp.Anonymous) and isinstance(node.this, str):
            names.add(node.this.lower())
    for position, token in enumerate(tokens):
        if token.token_type.name not in ("VAR", "IDENTIFIER"):
            continue
        following = tokens[position + 1] if position + 1 < len(tokens) else None
        if following is not None and following.token_type.name == "L_PAREN":
            continue
        if token.text.lower() not in names and token.text.lower() not in _STRUCTURAL_WORDS:
            raise failed(f"the parser dropped {token.text!r} from the statement")


def relations_agree(tree: dict, tables: Iterable[tuple[str, str]]) -> None:
    """Every relation PostgreSQL's parse tree names (a ``RangeVar``) is one the analysis
    resolved and checked (or a CTE): a construct sqlglot reads otherwise can never take a
    relation, a catalog's above all, past the allow-lists."""
    resolved = set(tables)
    names = {name for _, name in resolved}
    ctes = {node["CommonTableExpr"].get("ctename") for node in nodes(tree) if "CommonTableExpr" in node}
    for node in nodes(tree):
        rel = node.get("RangeVar")
        if not isinstance(rel, dict):
            continue
        name, schema_name = rel.get("relname"), rel.get("schemaname")
        if rel.get("catalogname") is not None:
            raise failed("a relation qualified with a database name")
        if schema_name is not None:
            if (schema_name, name) not in resolved:
                raise failed(f"relation {schema_name}.{name} reads differently to the SQL analyser and to PostgreSQL")
        elif name not in names and name not in ctes:
            raise failed(f"relation {name} reads differently to the SQL analyser and to PostgreSQL")


