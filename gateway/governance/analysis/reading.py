"""The statement read twice: by PostgreSQL's parser (``gateway.sql``: what the server runs)
and by sqlglot's PostgreSQL dialect (the tree the walker follows), the two checked against
each other before anything is walked."""
from __future__ import annotations

from sqlglot import exp
from sqlglot.dialects.postgres import Postgres
from sqlglot.tokens import Token

from ...errors import GatewayError
from ...sql import MAX_SQL, Statement, read_positional
from .agree import readers_agree
from .refusals import TOO_DEEP, failed


def postgres_reading(sql: object) -> Statement:
    """PostgreSQL's reading of the statement (its parser, through ``gateway.sql``)."""
    if isinstance(sql, Statement):
        return sql
    if not isinstance(sql, str) or not sql.strip():
        raise failed("the statement is empty")
    if len(sql) > MAX_SQL:
        raise failed(f"the statement is longer than {MAX_SQL} characters")
    if "\x00" in sql:
        raise failed("the statement contains a NUL character")
    try:
        return read_positional(sql.strip())
    except GatewayError as error:
        if error.code == "invalid_sql":   # analysed directly: every unreadable text is analysis_failed
            raise failed(error.message) from None
        raise


def sqlglot_reading(statement: Statement) -> tuple[list[Token], exp.Expr]:
    """sqlglot's tokens of the statement and its one parsed statement, once its words and
    parameters are PostgreSQL's."""
    sql = statement.text
    dialect = Postgres()
    try:
        tokens = dialect.tokenize(sql)
    except Exception as error:  # sqlglot's TokenError and anything else it raises
        raise failed(f"cannot read the statement: {str(error).splitlines()[0][:200]}") from None
    readers_agree(statement, tokens)
    try:
        statements = [s for s in dialect.parser().parse(tokens, sql)
                      if s is not None and type(s).__name__ != "Semicolon"]
    except RecursionError:
        raise failed(TOO_DEEP) from None
    except Exception as error:
        raise failed(f"cannot parse the statement: {str(error).splitlines()[0][:200]}") from None
    if len(statements) != 1:   # PostgreSQL read exactly one (gateway.sql): the readers disagree
        raise failed("the statement's end reads differently to the SQL analyser and to PostgreSQL")
    root = statements[0]
    if isinstance(root, exp.Command):   # sqlglot gave up on a statement that starts like a query
        raise failed(f"cannot parse the statement ({str(root.this).upper()} ...)")
    return tokens, root
