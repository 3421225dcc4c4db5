"""A parameter's ``pattern``, on a linear-time engine (RE2, through ``google-re2``).

Python's ``re`` backtracks: ``^(a+)+$`` against 29 ``a`` and a ``!`` took 27 s of CPU, and two
such calls held every thread of their worker. RE2 matches in time linear in the input (and
in the compiled program's size), whatever the pattern, so a pattern is compiled once, when
its query is saved or a worker loads its catalog, and never per call. What RE2 cannot run in
linear time (backreferences, lookarounds, possessive quantifiers, ``\\Z``) is refused when
saved, with the reason RE2 gives.

The match is a full match, as it was with ``re.fullmatch``: the whole value, not a part of
it. RE2's classes ``\\d``, ``\\w``, ``\\s`` and ``\\b`` are ASCII (Python's are Unicode for
text); ``\\p{L}``, ``\\p{N}`` name the Unicode ones.

Linear is not free: the worst a pattern can cost grows with the value's length times the
program's size (measured here, a DFA-defeating ``(.*a){180}`` at 1,984 instructions: 166 ms
on 16,384 characters, 636 ms on 65,536), so both are bounded: ``MAX_PROGRAM`` when saved,
``MAX_INPUT`` when a value is checked.
"""
from __future__ import annotations

import re

import re2

# The value length a pattern is matched against: a longer value is refused before any
# match. It keeps the worst check (the program bound below, a pattern built to defeat RE2's
# DFA) near 0.2 s of CPU; ordinary patterns (an email, a date, \p{L}+) take under 1 ms there.
MAX_INPUT = 16_384
# RE2 instructions a compiled pattern may have: \p{L}+ is 1,201, an email or IBAN pattern
# under 100; (.*a){999} (10,993) is refused.
MAX_PROGRAM = 2_000
# RE2's own memory bound per pattern (its default); a pattern over it does not compile.
_MAX_MEM = 8 << 20


class PatternError(ValueError):
    """A pattern that cannot be saved; ``unsupported``: valid for Python's ``re`` but not
    runnable in linear time (versus not a regular expression at all)."""

    def __init__(self, message: str, unsupported: bool) -> None:
        super().__init__(message)
        self.unsupported = unsupported


def _options() -> re2.Options:
    options = re2.Options()
    options.max_mem = _MAX_MEM
    options.log_errors = False   # a refused pattern is the caller's answer, not a line on stderr
    return options


_OPTIONS = _options()


class Pattern:
    """A compiled pattern: ``matches(value)`` is a full match of the whole value."""

    __slots__ = ("text", "_regex")

    def __init__(self, text: str) -> None:
        try:
            regex = re2.compile(text, _OPTIONS)
        except re2.error as exc:
            raise PatternError(*_why(text, exc)) from None
        if regex.programsize > MAX_PROGRAM:
            raise PatternError(f"pattern compiles to {regex.programsize} RE2 instructions, more than "
                               f"{MAX_PROGRAM}: its checks could cost too much CPU", True)
        self.text = text
        self._regex = regex

    def matches(self, value: str) -> bool:
        return self._regex.fullmatch(value) is not None


def _why(text: str, exc: re2.error) -> tuple[str, bool]:
    reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
    try:
        re.compile(text)   # compiles only (never matches): no backtracking happens here
    except (re.error, RecursionError, OverflowError):
        return f"pattern is not a valid regular expression: {reason}", False
    return (f"pattern cannot run on the linear-time engine (RE2: no backreferences, lookarounds or possessive "
            f"quantifiers, at most 1000 repetitions): {reason}", True)
