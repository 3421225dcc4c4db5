"""Parameter patterns on RE2 (gateway/model/patterns.py): linear time, the same full-match
semantics as ``re.fullmatch``, refusals that say why, and the bounds on program and input."""
from __future__ import annotations

import re
import time

import pytest

from gateway.errors import GatewayError
from gateway.model import patterns
from gateway.model.params import ParamBinder, ParamError, ParamSpec, compile_specs
from gateway.model.patterns import MAX_INPUT, MAX_PROGRAM, Pattern, PatternError
from helpers.patterns import EVIL

# Valid for Python's re, impossible in linear time: refused when saved.
UNSUPPORTED = [r"(\w)\1", r"(?=a)a", r"(?!a)b", r"(?<=a)b", r"(?<!a)b", r"(?P<x>a)(?P=x)", r"a++", r"a*+",
               r"\Z", r"(.*a){999}"]


@pytest.mark.parametrize("pattern", sorted(EVIL))
def test_evil_patterns_answer_in_linear_time(pattern):
    compiled = Pattern(pattern)
    started = time.process_time()
    assert not compiled.matches(EVIL[pattern])
    assert compiled.matches("a" * 10_000) == bool(re.fullmatch(pattern, "a" * 10_000))
    assert time.process_time() - started < 0.5


@pytest.mark.parametrize("pattern", UNSUPPORTED)
def test_patterns_needing_backtracking_are_refused_as_unsupported(pattern):
    re.compile(pattern)   # Python's re takes each of them
    with pytest.raises(PatternError) as info:
        Pattern(pattern)
    assert info.value.unsupported, info.value


@pytest.mark.parametrize("pattern", ["(", "[a-", "a{2,1}", "*a"])
def test_invalid_patterns_are_not_called_unsupported(pattern):
    with pytest.raises(PatternError) as info:
        Pattern(pattern)
    assert not info.value.unsupported and "not a valid regular expression" in str(info.value)


# (pattern, value): what re.fullmatch answered, the answer now. A full match of the whole
# value, never a search: a value that merely contains a match is refused.
SEMANTICS = [
    ("[A-Z]{2}", "US"), ("[A-Z]{2}", "USA"), ("[A-Z]{2}", "xUS"), ("[a-z]+", "abc1"), ("[a-z]+", "abc"),
    ("a|ab", "ab"), ("ab|a", "ab"), ("a$", "a\n"), ("^a$", "a"), ("a.c", "a\nc"), ("(?i)abc", "ABC"),
    ("(?s)a.c", "a\nc"), ("", ""), ("x*", ""), ("[0-9]{4}-[0-9]{2}-[0-9]{2}", "2024-01-31"),
    ("[0-9]{4}-[0-9]{2}-[0-9]{2}", "2024-01-31T00"), (r"[^@\s]+@[^@\s]+\.[a-z]{2,}", "x@example.org"),
    (r"[^@\s]+@[^@\s]+\.[a-z]{2,}", "x@example.org trailing"), ("é+", "éé"), (".", "é"), ("a{2,3}", "aaaa"),
]


@pytest.mark.parametrize("pattern, value", SEMANTICS)
def test_full_match_as_re_fullmatch(pattern, value):
    assert Pattern(pattern).matches(value) == (re.fullmatch(pattern, value) is not None)


def test_ascii_classes_and_unicode_properties():
    """The one difference from Python's re, documented: \\d \\w \\s are ASCII on RE2."""
    assert not Pattern(r"\d+").matches("١٢") and re.fullmatch(r"\d+", "١٢")
    assert Pattern(r"\p{N}+").matches("١٢") and Pattern(r"\p{L}+").matches("café")


def test_program_size_is_bounded():
    assert Pattern(r"\p{L}+")   # 1,201 instructions: allowed
    with pytest.raises(PatternError) as info:
        Pattern("(.*a){180}(.*b){20}")
    assert info.value.unsupported and str(MAX_PROGRAM) in str(info.value)


def test_input_length_is_bounded():
    s = ParamSpec("s", {"type": "str", "pattern": "[a-z]*"})
    assert s.coerce_text("a" * MAX_INPUT) == "a" * MAX_INPUT
    with pytest.raises(ParamError, match="pattern"):
        s.coerce_text("a" * (MAX_INPUT + 1))
    unpatterned = ParamSpec("s", {"type": "str"})   # the general cap (65,536) applies, not this one
    assert unpatterned.coerce_text("a" * (MAX_INPUT + 1))


def test_the_worst_check_is_bounded():
    """A pattern at the program bound built to defeat RE2's DFA, against the longest value
    checked: the bound that MAX_INPUT's comment promises (0.2 s measured; 1 s here)."""
    worst = Pattern("(.*a){180}")
    assert worst._regex.programsize <= MAX_PROGRAM
    started = time.process_time()
    worst.matches("a" * MAX_INPUT)
    assert time.process_time() - started < 1.0


def test_unsupported_patterns_answer_their_own_code():
    with pytest.raises(GatewayError) as info:
        compile_specs({"a": {"type": "str", "pattern": r"(\w)\1"}, "b": {"type": "str", "pattern": "[a-z]+"}})
    assert info.value.code == "pattern_unsupported" and set(info.value.extra["errors"]) == {"a"}
    # Mixed with another problem: the general code, every field named.
    with pytest.raises(GatewayError) as info:
        compile_specs({"a": {"type": "str", "pattern": r"(\w)\1"}, "b": {"type": "decimal"}})
    assert info.value.code == "invalid_body" and set(info.value.extra["errors"]) == {"a", "b"}


def test_a_stored_pattern_re2_refuses_loads_and_refuses_values():
    """Saved by a release that ran patterns on Python's re: the catalog still loads, the
    parameter's values are refused (the query must be saved again), the others bind."""
    specs = compile_specs({"a": {"type": "str", "pattern": r"(\w)\1", "required": False}, "n": "int"}, stored=True)
    binder = ParamBinder(specs)
    assert binder.bind({"n": "1"}, from_text=True) == (None, 1)
    with pytest.raises(GatewayError) as info:
        binder.bind({"a": "xx", "n": "1"}, from_text=True)
    assert info.value.code == "param_invalid" and "saved again" in info.value.extra["errors"]["a"]


def test_compiled_once_not_per_call(monkeypatch):
    s = ParamSpec("s", {"type": "str", "pattern": "[a-z]+"})
    monkeypatch.setattr(patterns.re2, "compile", lambda *a, **k: pytest.fail("compiled per call"))
    for _ in range(3):
        assert s.coerce_text("abc") == "abc"
