"""A PostgreSQL-faithful lexer, used to cross-check sqlglot's reading of a statement.

The analysis trusts sqlglot's parse tree only where PostgreSQL would see the same code:
this lexer follows PostgreSQL's scanner (``scan.l``) for what is code and what is not
(strings, escape strings, dollar quoting, quoted identifiers, nested comments), and the
analysis refuses a statement when the identifiers and keywords found here differ from the
ones in sqlglot's tokens. A function name hidden from sqlglot inside what it took for a
string or a comment (or the other way round) is then a refusal, never a bypass.

Plain ``'...'`` strings are lexed twice, as with ``standard_conforming_strings`` on and as
with it off: a statement whose code differs between the two is refused too, so the result
does not depend on that server setting.
"""
from __future__ import annotations

import re

from ..errors import bad_request

# PostgreSQL: ident_start [A-Za-z\200-\377_], ident_cont [A-Za-z\200-\377_0-9\$]
_WORD = re.compile(r"[A-Za-z_\u0080-\U0010ffff][A-Za-z0-9_$\u0080-\U0010ffff]*")
_DOLLAR = re.compile(r"\$([A-Za-z_\u0080-\U0010ffff][A-Za-z0-9_\u0080-\U0010ffff]*)?\$")
_PARAM = re.compile(r"\$[0-9]+")
_NUMBER = re.compile(r"0[xX][0-9A-Fa-f_]+|0[oO][0-7_]+|0[bB][01_]+|"
                     r"(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)(?:[eE][+-]?[0-9]+)?")
_SPACE = " \t\n\r\f\v"


class Lexed:
    """What PostgreSQL sees as code: ``words`` is a list of (kind, text) where kind is
    ``w`` (an unquoted word, lower-cased) or ``q`` (a quoted identifier, exact);
    ``calls`` holds the words followed by ``(``; ``statements`` counts statements."""

    __slots__ = ("words", "calls", "statements", "strings", "first")

    def __init__(self, words, calls, statements, strings, first):
        self.first = first       # the first token: a word (lower-cased), or a punctuation character
        self.words = words
        self.calls = calls
        self.statements = statements
        self.strings = strings


def _fail(message: str):
    return bad_request("analysis_failed", message)


def lex(sql: str, standard_strings: bool = True) -> Lexed:
    words: list[tuple[str, str]] = []
    calls: set[str] = set()
    strings = 0
    statements = 0
    pending = False          # code seen since the last ';'
    last_word: str | None = None
    first: str | None = None
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c in _SPACE:
            i += 1
            continue
        if c == "-" and sql.startswith("--", i):
            j = sql.find("\n", i)
            i = n if j < 0 else j + 1
            continue
        if c == "/" and sql.startswith("/*", i):
            i = _skip_comment(sql, i)
            continue
        if c == ";":
            if pending:
                statements += 1
            pending = False
            last_word = None
            i += 1
            continue
        pending = True
        if first is None:
            m = _WORD.match(sql, i)
            first = m.group(0).lower() if m else c
        if c == "(":
            if last_word is not None:
                calls.add(last_word)
            last_word = None
            i += 1
            continue
        last_word = None
        if c == "'":
            i = _skip_string(sql, i, backslash=not standard_strings)
            strings += 1
        elif c == '"':
            i, text = _quoted_identifier(sql, i)
            words.append(("q", text))
            last_word = text.lower()
        elif c == "$":
            m = _PARAM.match(sql, i)
            if m:
                i = m.end()
                continue
            m = _DOLLAR.match(sql, i)
            if m is None:
                raise _fail("a stray '$' in the statement")
            end = sql.find(m.group(0), m.end())
            if end < 0:
                raise _fail("unterminated dollar-quoted text")
            i = end + len(m.group(0))
            strings += 1
        elif _WORD.match(sql, i):
            m = _WORD.match(sql, i)
            word = m.group(0)
            low = word.lower()
            j = m.end()
            if j < n and sql[j] == "'" and low in ("e", "b", "x", "n"):
                i = _skip_string(sql, j, backslash=(low == "e") or not standard_strings)
                strings += 1
            elif low == "u" and sql.startswith("&", j) and j + 1 < n and sql[j + 1] in "'\"":
                raise _fail("Unicode-escaped strings and identifiers (U&'...', U&\"...\") are not accepted")
            else:
                words.append(("w", low))
                last_word = low
                i = j
        elif c.isdigit() or (c == "." and i + 1 < n and sql[i + 1].isdigit()):
            m = _NUMBER.match(sql, i)
            i = m.end() if m and m.end() > i else i + 1
        else:
            i += 1  # operators and punctuation
    if pending:
        statements += 1
    return Lexed(words, calls, statements, strings, first)


def _skip_comment(sql: str, i: int) -> int:
    depth, n = 0, len(sql)
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
    raise _fail("unterminated comment")


def _skip_string(sql: str, i: int, backslash: bool) -> int:
    n = len(sql)
    i += 1
    while i < n:
        c = sql[i]
        if c == "'":
            if i + 1 < n and sql[i + 1] == "'":
                i += 2
                continue
            return i + 1
        if c == "\\" and backslash:
            i += 2
            continue
        i += 1
    raise _fail("unterminated quoted text")


def _quoted_identifier(sql: str, i: int) -> tuple[int, str]:
    n = len(sql)
    j = i + 1
    parts = []
    while j < n:
        k = sql.find('"', j)
        if k < 0:
            break
        parts.append(sql[j:k])
        if k + 1 < n and sql[k + 1] == '"':
            parts.append('"')
            j = k + 2
            continue
        text = "".join(parts)
        if not text:
            raise _fail("zero-length quoted identifier")
        return k + 1, text
    raise _fail("unterminated quoted identifier")


# --- sqlglot's view of the same text ------------------------------------------------------
_STRING_TOKENS = frozenset(("STRING", "BYTE_STRING", "HEREDOC_STRING", "NATIONAL_STRING", "BIT_STRING",
                            "HEX_STRING", "RAW_STRING", "UNICODE_STRING"))
_WORD_FULL = re.compile(r"[A-Za-z_\u0080-\U0010ffff][A-Za-z0-9_$\u0080-\U0010ffff]*\Z")


def sqlglot_words(tokens) -> list[tuple[str, str]]:
    words = []
    for token in tokens:
        kind = token.token_type.name
        if kind in _STRING_TOKENS:
            continue
        if kind == "IDENTIFIER":
            words.append(("q", token.text))
            continue
        for part in token.text.split():
            if _WORD_FULL.match(part):
                words.append(("w", part.lower()))
    return words


def cross_check(sql: str, tokens) -> Lexed:
    """PostgreSQL's view of ``sql``, after checking that sqlglot's ``tokens`` agree with it
    (and that the standard_conforming_strings setting cannot change it)."""
    on = lex(sql, standard_strings=True)
    try:
        off = lex(sql, standard_strings=False)
    except Exception:
        off = None
    if off is None or on.words != off.words or on.statements != off.statements:
        raise _fail("a backslash in a plain string literal makes the statement read differently "
                    "depending on standard_conforming_strings; use E'...' for escapes")
    if sqlglot_words(tokens) != on.words:
        raise _fail("the statement reads differently to the SQL analyser and to PostgreSQL "
                    "(quoting or comments it cannot follow)")
    return on
