"""The classic catastrophic-backtracking patterns, each with an input that makes a backtracking
engine (Python's re) run for longer than anyone waits: a match that fails at the very end."""

EVIL = {
    r"^(a+)+$": "a" * 10_000 + "!",
    r"(a|aa)+$": "a" * 10_000 + "!",
    r"(a|a?)+$": "a" * 10_000 + "!",
    r"(.*a){20}": "a" * 10_000 + "!",
    r"^(\w+\s?)*$": "a " * 5_000 + "!",
}
