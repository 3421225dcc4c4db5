"""The one reader of SQL: PostgreSQL's own lexer and parser (libpg_query, through pglast).

Everything the gateway needs to know about a statement's text comes from here: where its
``:name`` placeholders are, where it ends, what is code and what is a string or a comment,
which functions it calls, its kind. A hand-written scanner can read a dollar quote, an
``E''`` string or a nested comment differently from the server, and every such difference
is a way to smuggle SQL past the analysis; the server's own lexer cannot disagree with the
server. (pglast is the maintained binding of libpg_query, the PostgreSQL parser source
compiled as a library: the same grammar, the same scanner, the same locations.)

The lexer runs with ``standard_conforming_strings`` on, as PostgreSQL's default; data
sessions pin that setting (``execution.pool.session_options``), so the server reads the
text exactly as it is read here.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import orjson
from pglast import parser as pg

from ..errors import GatewayError, bad_request
from .trees import alike, calls, contains, param_locations, relations

MAX_SQL = 100_000
# Deeper nesting than this is refused before any recursive reader sees it: no real query
# needs it, and it keeps every tree walk (ours, sqlglot's, libpg_query's) far from a limit.
MAX_DEPTH = 64

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_COMMENTS = frozenset(("SQL_COMMENT", "C_COMMENT"))
_OPENERS = frozenset(("ASCII_40", "ASCII_91"))      # ( [
_CLOSERS = frozenset(("ASCII_41", "ASCII_93"))      # ) ]
_WRITES = {"InsertStmt": "insert", "UpdateStmt": "update", "DeleteStmt": "delete", "MergeStmt": "merge"}
_WRITE_KEYS = frozenset(_WRITES)
# A row lock (FOR UPDATE, FOR NO KEY UPDATE, FOR SHARE, FOR KEY SHARE) anywhere in a statement:
# a side effect on other sessions, whatever the statement's kind.
_LOCKS = frozenset(("LockingClause",))

# Refusals of more than one place (the analysis, ``gateway.governance.analysis``, words its own alike).
TOO_DEEP = "the statement is nested too deeply to analyse"
ROW_LOCKS = "row locks (FOR UPDATE / FOR SHARE) are not allowed"
SELECT_INTO = "SELECT ... INTO creates a table and is not allowed"
_ONE_STATEMENT = "exactly one statement is allowed"
_NESTED_WRITE = "data-modifying statements inside a statement are not allowed"


def _invalid(message: str) -> GatewayError:
    return bad_request("invalid_sql", message)


def _failed(message: str) -> GatewayError:
    return bad_request("analysis_failed", message)


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement as PostgreSQL reads it, placeholders turned into ``$n``."""

    text: str                        # the statement, up to its last token (no ';', no trailing comment)
    order: tuple[str, ...]           # the parameter name of each $n
    kind: str                        # "read" | "write"
    node: str                        # the parse node: SelectStmt, InsertStmt, ...
    params: tuple[int, ...]          # character offset of each $ placeholder in ``text``, in order
    words: tuple[tuple[str, str], ...]   # ("w", folded word) / ("q", quoted identifier), in order
    calls: frozenset[str]            # function names called (as the parser saw them, lower case)
    relations: frozenset[str]        # relation names read (RangeVar: "name" or "schema.name")
    tree: dict                       # the parse tree (JSON form) of the statement


def _tokens(sql: str) -> list[pg.Token]:
    try:
        return pg.scan(sql)
    except pg.ParseError as error:
        raise _invalid(f"cannot read the statement: {error.args[0]}") from None


def _source(sql: str, token: pg.Token) -> str:
    return sql[token.start:token.end + 1]


def _check_text(sql: object) -> str:
    """``sql`` (a body's field: anything), checked to be statement text."""
    if not isinstance(sql, str) or not sql.strip():
        raise bad_request("invalid_body", "sql must be a non-empty string", errors={"sql": "is required"})
    if len(sql) > MAX_SQL:
        raise _invalid(f"sql is longer than {MAX_SQL} characters")
    if "\x00" in sql:
        raise _invalid("sql contains a NUL character")
    return sql


def placeholders(sql: str) -> list[str]:
    """The ``:name`` placeholders of ``sql``, in order of appearance (repeats included)."""
    _check_text(sql)
    return [name for _, _, name in _placeholders(sql, _tokens(sql))]


def _placeholders(sql: str, tokens: Sequence[pg.Token]) -> list[tuple[int, int, str]]:
    """(start, end, name) of each ``:name``: a ':' token directly followed, with nothing
    between, by a word token. Everything inside strings, comments and quoted identifiers is
    a single token to PostgreSQL's lexer, so it can never be taken for a placeholder."""
    found = []
    for i, token in enumerate(tokens[:-1]):
        if token.name != "ASCII_58":
            continue
        following = tokens[i + 1]
        text = _source(sql, following)
        if following.start == token.end + 1 and _NAME.match(text):
            found.append((token.start, following.end + 1, text))
    return found


def read(sql: object, declared: frozenset[str] | None = None) -> Statement:
    """Read one saved or ad-hoc statement (``sql`` as a body gave it: anything not text is
    refused). ``declared`` names the parameters a saved query declares (None: an ad-hoc
    statement, whose placeholders are its parameters)."""
    sql = _check_text(sql)
    tokens = _tokens(sql)
    _check_depth(tokens)
    if any(t.name == "PARAM" for t in tokens):
        raise _invalid("positional parameters ($1) are not accepted: name them (:name)")
    end = _statement_end(tokens)
    found = [p for p in _placeholders(sql, tokens) if p[1] <= end]
    order: list[str] = []
    parts, offsets, last, shift = [], [], 0, 0
    for start, stop, name in found:
        if declared is not None and name not in declared:
            raise _invalid(f"placeholder :{name} is not a declared parameter")
        if name not in order:
            order.append(name)
        marker = f"${order.index(name) + 1}"
        parts.append(sql[last:start])
        offsets.append(start + shift)
        shift += len(marker) - (stop - start)
        parts.append(marker)
        last = stop
    parts.append(sql[last:end])
    text = "".join(parts)
    lead = len(text) - len(text.lstrip())
    return read_positional(text[lead:], tuple(order), tuple(o - lead for o in offsets))


def read_positional(text: str, order: tuple[str, ...] = (), offsets: tuple[int, ...] | None = None) -> Statement:
    """Read a statement already in positional form (``$n``). ``offsets``, when given, are
    where the caller put its ``$n`` markers: PostgreSQL's parser must find a parameter at
    exactly those places and nowhere else."""
    tokens = _tokens(text)
    _check_depth(tokens)
    _statement_end(tokens)
    if offsets is None:
        offsets = tuple(t.start for t in tokens if t.name == "PARAM")
        if any(t.name == "PARAM" and not _source(text, t)[1:].isdigit() for t in tokens):
            raise _invalid("a malformed positional parameter")
    tree = _parse_one(text)
    node, body = next(iter(tree.items()))
    found = sorted(param_locations(tree))
    wanted = sorted(_byte_offsets(text, offsets))
    if found != wanted:
        raise _failed("the statement's placeholders are not where PostgreSQL reads parameters")
    kind = _kind(node, body)
    return Statement(text, order, kind, node, tuple(offsets), _words(text, tokens), calls(tree),
                     relations(tree), tree)


def _byte_offsets(text: str, offsets: Iterable[int]) -> list[int]:
    """Character offsets as the byte offsets PostgreSQL's parser reports locations in."""
    if text.isascii():
        return list(offsets)
    return [len(text[:o].encode()) for o in offsets]


def _statement_end(tokens: Iterable[pg.Token]) -> int:
    """Where the first statement's last token ends; a second statement is refused."""
    end, closed = 0, False
    for token in tokens:
        if token.name in _COMMENTS:
            continue
        if token.name == "ASCII_59":
            closed = True
            continue
        if closed:
            raise bad_request("multiple_statements", _ONE_STATEMENT)
        end = token.end + 1
    if end == 0:
        raise _invalid("the statement is empty")
    return end


def _check_depth(tokens: Iterable[pg.Token]) -> None:
    depth = 0
    for token in tokens:
        if token.name in _OPENERS:
            depth += 1
            if depth > MAX_DEPTH:
                raise _failed(f"the statement is nested more than {MAX_DEPTH} levels deep")
        elif token.name in _CLOSERS:
            depth -= 1


def parse_tree(text: str) -> dict:
    """The parse tree (JSON form) of one statement; refusals are typed, never a 500."""
    return _parse_one(text)


def _parse_one(text: str) -> dict:
    try:
        doc = orjson.loads(pg.parse_sql_json(text))
    except pg.ParseError as error:
        if "stack depth" in str(error.args[0]):
            raise _failed(TOO_DEEP) from None
        raise _invalid(f"cannot parse the statement: {error.args[0]}") from None
    except (RecursionError, orjson.JSONDecodeError):
        raise _failed(TOO_DEEP) from None
    statements = doc.get("stmts") or []
    if len(statements) != 1:
        raise bad_request("multiple_statements", _ONE_STATEMENT)
    return statements[0]["stmt"]


def _kind(node: str, body: dict) -> str:
    if contains(body, _LOCKS):
        raise bad_request("sql_not_allowed", ROW_LOCKS)
    if node in _WRITES:
        if contains(body, _WRITE_KEYS):
            raise bad_request("sql_not_allowed", _NESTED_WRITE)
        return "write"
    if node == "SelectStmt":
        if body.get("intoClause") is not None:
            raise bad_request("sql_not_allowed", SELECT_INTO)
        if contains(body, _WRITE_KEYS):
            raise bad_request("sql_not_allowed", _NESTED_WRITE)
        return "read"
    word = node[:-4] if node.endswith("Stmt") else node
    raise bad_request("sql_not_allowed", f"statement kind {word.upper()} is not allowed")


def write_op(statement: Statement) -> str | None:
    return _WRITES.get(statement.node)


def paged(statement: Statement) -> Statement:
    """The read wrapped for paging, with LIMIT and OFFSET as two more parameters. The
    wrapped text is read again, and the statement inside must be the very one analysed."""
    n = len(statement.order)
    head = "SELECT * FROM (\n"
    text = f"{head}{statement.text}\n) AS _gw_page LIMIT ${n + 1} OFFSET ${n + 2}"
    tail = len(head) + len(statement.text) + len("\n) AS _gw_page LIMIT ")
    offsets = tuple(len(head) + o for o in statement.params) + (tail, tail + len(f"${n + 1} OFFSET "))
    wrapped = read_positional(text, statement.order + ("_gw_limit", "_gw_offset"), offsets)
    try:
        inner = wrapped.tree["SelectStmt"]["fromClause"][0]["RangeSubselect"]["subquery"]
    except (KeyError, IndexError, TypeError):
        inner = None
    if inner is None or not alike(statement.tree, inner):
        raise _failed("the statement does not stay whole inside the paging wrapper")
    return wrapped


# --- words, for cross-checking another reader --------------------------------------------
def fold(word: str) -> str:
    # PostgreSQL folds only ASCII letters of an unquoted identifier (in a UTF-8 database).
    return word.translate(_ASCII_LOWER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _words(text: str, tokens: Iterable[pg.Token]) -> tuple[tuple[str, str], ...]:
    words = []
    for token in tokens:
        if token.name in ("UIDENT", "USCONST"):
            raise _failed("Unicode-escaped strings and identifiers (U&'...', U&\"...\") are not accepted")
        source = _source(text, token)
        if token.name == "IDENT":
            if source.startswith('"'):
                words.append(("q", source[1:-1].replace('""', '"')))
            else:
                words.append(("w", fold(source)))
        elif token.kind != "NO_KEYWORD":
            words.append(("w", fold(source)))
    return tuple(words)


def words_of(text: str) -> tuple[tuple[str, str], ...]:
    return _words(text, _tokens(text))
