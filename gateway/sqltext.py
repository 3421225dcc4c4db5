"""Saved SQL, prepared once at save time: named ``:param`` placeholders become the
positional ``$n`` form that ``PREPARE`` takes and the ``%(name)s`` form a server-side
cursor takes, and the statement is parsed once to know its kind.

The scanner skips string literals (``'...'``, ``E'...'``), quoted identifiers, dollar
quoting, comments and ``::`` casts, so a ``:word`` inside any of them is left alone.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from .errors import bad_request

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOLLAR_TAG = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")
MAX_SQL = 100_000

READ_KINDS = (exp.Select, exp.Union, exp.Intersect, exp.Except, exp.Values)
WRITE_KINDS = (exp.Insert, exp.Update, exp.Delete, exp.Merge)


@dataclass(slots=True, frozen=True)
class PreparedText:
    positional: str          # $1, $2 ... in order of first appearance
    pyformat: str            # %(name)s, with literal % doubled
    order: tuple[str, ...]   # parameter name for each $n
    kind: str                # "read" or "write"


def _skip_quoted(sql: str, i: int, quote: str) -> int:
    n = len(sql)
    i += 1
    while i < n:
        if sql[i] == quote:
            if i + 1 < n and sql[i + 1] == quote:
                i += 2
                continue
            return i + 1
        if quote == "'" and sql[i] == "\\" and _is_escape_string(sql, i):
            i += 2
            continue
        i += 1
    raise bad_request("invalid_sql", "unterminated quoted text")


def _is_escape_string(sql: str, i: int) -> bool:
    # Backslash escapes only apply inside E'...' strings; find the opening quote.
    start = sql.rfind("'", 0, i)
    while start > 0 and sql[start - 1] == "'":
        start = sql.rfind("'", 0, start - 1)
    return start > 0 and sql[start - 1] in "eE"


def scan(sql: str) -> tuple[list[tuple[int, int, str]], int, int]:
    """Placeholders as (start, end, name); the count of statements after the first; and
    where the first statement ends (its top-level ``;``, or the end of the text)."""
    found, semicolons, end = [], 0, len(sql)
    ended = False  # a top-level ";" was seen: anything but comments after it is a second statement
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if ended and not c.isspace() and not sql.startswith("--", i) and not sql.startswith("/*", i):
            semicolons += 1
            ended = False
        if c in "'\"":
            i = _skip_quoted(sql, i, c)
        elif c == "-" and sql.startswith("--", i):
            j = sql.find("\n", i)
            i = n if j < 0 else j + 1
        elif c == "/" and sql.startswith("/*", i):
            i = _skip_block_comment(sql, i)
        elif c == "$":
            tag = _DOLLAR_TAG.match(sql, i)
            if tag and not (i > 0 and (sql[i - 1].isalnum() or sql[i - 1] == "_")):
                closing = sql.find(tag.group(0), tag.end())
                if closing < 0:
                    raise bad_request("invalid_sql", "unterminated dollar-quoted text")
                i = closing + len(tag.group(0))
            else:
                i += 1
        elif c == ":":
            if sql.startswith("::", i):
                i += 2
                continue
            m = _NAME.match(sql, i + 1)
            if m and not (i > 0 and sql[i - 1] == ":"):
                found.append((i, m.end(), m.group(0)))
                i = m.end()
            else:
                i += 1
        elif c == ";":
            if not ended:
                end = min(end, i)
            ended = True
            i += 1
        else:
            i += 1
    return found, semicolons, end


def _skip_block_comment(sql: str, i: int) -> int:
    depth, i, n = 0, i, len(sql)
    while i < n:
        if sql.startswith("/*", i):
            depth += 1
            i += 2
        elif sql.startswith("*/", i):
            depth -= 1
            i += 2
            if depth == 0:
                return i
        else:
            i += 1
    raise bad_request("invalid_sql", "unterminated comment")


def prepare_text(sql: str, declared: frozenset[str]) -> PreparedText:
    if not isinstance(sql, str) or not sql.strip():
        raise bad_request("invalid_body", "sql must be a non-empty string")
    if len(sql) > MAX_SQL:
        raise bad_request("invalid_sql", f"sql is longer than {MAX_SQL} characters")
    if "\x00" in sql:
        raise bad_request("invalid_sql", "sql contains a NUL character")
    placeholders, semicolons, end = scan(sql)
    if semicolons:
        raise bad_request("multiple_statements", "exactly one statement is allowed")
    sql = sql[:end]  # the statement without its terminating ";" and any comment after it
    order: list[str] = []
    positional, pyformat, last = [], [], 0
    for start, end, name in placeholders:
        if name not in declared:
            raise bad_request("invalid_sql", f"placeholder :{name} is not a declared parameter")
        if name not in order:
            order.append(name)
        positional.append(sql[last:start] + f"${order.index(name) + 1}")
        pyformat.append(sql[last:start].replace("%", "%%") + f"%({name})s")
        last = end
    positional.append(sql[last:])
    pyformat.append(sql[last:].replace("%", "%%"))
    text = "".join(positional).strip()
    return PreparedText(text, "".join(pyformat).strip(), tuple(order),
                        statement_kind(text))


def statement_kind(positional_sql: str) -> str:
    try:
        statements = [s for s in sqlglot.parse(positional_sql, read="postgres") if s is not None]
    except sqlglot.errors.SqlglotError as exc:
        raise bad_request("invalid_sql", f"cannot parse the statement: {str(exc).splitlines()[0]}") from None
    if len(statements) != 1:
        raise bad_request("multiple_statements", "exactly one statement is allowed")
    statement = statements[0]
    if isinstance(statement, WRITE_KINDS):
        return "write"
    if isinstance(statement, READ_KINDS) and not _has_write_inside(statement):
        return "read"
    raise bad_request("invalid_sql", f"statement kind {statement.key.upper()} is not allowed")


def _has_write_inside(statement) -> bool:
    return any(isinstance(node, WRITE_KINDS) for node in statement.walk() if node is not statement) \
        or statement.args.get("into") is not None
