"""The documentation's links lead somewhere: every relative link of the README, the changelog and
the pages under docs/ names a file that exists, and every #anchor a heading of the page it
points into (as GitHub makes anchors from headings). Sections move between pages (issue #27 moved
most of the README to docs/); a link left behind fails here, not in a reader's browser.

No server, no database: plain file reads."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PAGES = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md"),
                *(ROOT / "docs" / "bench").glob("*.md")])

_LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose(text: str) -> list[str]:
    """The page's lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.split("\n"):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text without markup, lower case, punctuation dropped,
    spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)      # a link counts by its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in _prose(page.read_text()):
        heading = _HEADING.match(line)
        if not heading:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[str]:
    targets = []
    for line in _prose(page.read_text()):
        line = re.sub(r"``.*?``|`[^`]*`", "", line)                # a link inside code is not a link
        targets += _LINK.findall(line)
    return targets


def broken(page: Path) -> list[str]:
    problems = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):               # https:, mailto: ...: not ours to check
            continue
        path, _, anchor = target.partition("#")
        into = (page.parent / path).resolve() if path else page
        if not into.exists():
            problems.append(f"{target}: no such file")
        elif anchor and into.suffix == ".md" and anchor not in anchors(into):
            problems.append(f"{target}: no heading of {into.name} makes #{anchor}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_link_leads_somewhere(page):
    assert broken(page) == []


def test_the_check_finds_a_broken_file_and_a_broken_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## A `code` heading: with punctuation\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n[ok](other.md#a-code-heading-with-punctuation) [self](#page)\n"
                    "[gone](missing.md) [bad](other.md#nowhere) [web](https://example.org/x#y)\n"
                    "```\n[in code](missing-too.md)\n```\n`[in a span](missing-three.md)`\n")
    assert [problem.split(":")[0] for problem in broken(page)] == ["missing.md", "other.md#nowhere"]


def test_github_anchors():
    assert slug("Management API (`/api/v1`, admin key)") == "management-api-apiv1-admin-key"
    assert slug("On one machine: `fleet up`") == "on-one-machine-fleet-up"
    assert slug("Raw data: what is kept") == "raw-data-what-is-kept"
