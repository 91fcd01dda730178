"""Every relative link and anchor in README.md, CHANGELOG.md and docs/*.md resolves.

A link to a file must name a file or folder of the repository; a ``#anchor`` must be the
slug of a heading in its target, slugged the way GitHub does: lower case, spaces to '-',
punctuation dropped except '-' and '_' (an en dash is dropped, so ``a – b`` is ``a--b``),
a repeated slug numbered ``-1``, ``-2``. Lines in fenced code blocks and inline code are
neither headings nor links (a heading's inline code is read as text).
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

from support import REPO

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
FENCE = re.compile(r"^\s{0,3}(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (markdown links and code marks read as text)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").strip().lower()
    kept = "".join(c for c in text
                   if c in " -_" or unicodedata.category(c)[0] in "LN"
                   or unicodedata.category(c) in {"Mn", "Mc"})
    return kept.replace(" ", "-")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def anchors(text: str) -> set[str]:
    """Every anchor a page offers: its headings' slugs, numbered when repeated, and <a id>."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose_lines(text):
        found.update(HTML_ANCHOR.findall(line))
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> list[str]:
    """Every link target on a page, in order, inline and reference style."""
    found: list[str] = []
    for line in prose_lines(text):
        found.extend(LINK.findall(INLINE_CODE.sub("", line)))
        match = REFERENCE.match(line)
        if match:
            found.append(match.group(1))
    return found


def broken(page: Path, repo: Path) -> list[str]:
    """The links on ``page`` that name no file of ``repo`` or no anchor in their target."""
    bad: list[str] = []
    for target in links(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # http:, https:, mailto:: not ours to check
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists() or repo.resolve() not in (dest, *dest.parents):
            bad.append(f"{page.name}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            bad.append(f"{page.name}: {target} (no such heading)")
    return bad


def pages(repo: Path) -> list[Path]:
    """The pages a user reads: the README, the changelog and docs/*.md."""
    return [p for p in (repo / "README.md", repo / "CHANGELOG.md") if p.exists()] + sorted(
        (repo / "docs").glob("*.md"))


@pytest.mark.parametrize("heading, expected", [
    ("Recovery modes", "recovery-modes"),
    ("`tftctl ckpt`", "tftctl-ckpt"),
    ("Blocked ranks – at scale", "blocked-ranks--at-scale"),
    ("Phases: `recovery.wrap_optimizer`", "phases-recoverywrap_optimizer"),
    ("Last words (TTP)", "last-words-ttp"),
    ("Addresses: `--node_addr`", "addresses---node_addr"),
    ("`tftrun` — command line", "tftrun--command-line"),
    ("See [the CLI](cli.md) now", "see-the-cli-now"),
])
def test_slug_follows_github(heading: str, expected: str) -> None:
    assert slug(heading) == expected


def test_a_broken_link_or_anchor_is_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text(
        "# B – two\n\n## Same\n\n## Same\n\n```\n# Not a heading\n```\n")
    (tmp_path / "docs" / "a.md").write_text(
        "[ok](b.md#b--two) [ok](b.md#same-1) [ok](#here) `[code](nowhere.md)`\n\n# Here\n\n"
        "[gone](c.md) [dash](b.md#b-two) [third](b.md#same-2) [code](b.md#not-a-heading)\n"
        "[ref]: ../README.md\n[web](https://example.com/x.md)\n")
    assert broken(tmp_path / "docs" / "a.md", tmp_path) == [
        "a.md: c.md (no such file)",
        "a.md: b.md#b-two (no such heading)",
        "a.md: b.md#same-2 (no such heading)",
        "a.md: b.md#not-a-heading (no such heading)",
        "a.md: ../README.md (no such file)",
    ]


def test_every_link_in_the_docs_resolves() -> None:
    found = [bad for page in pages(REPO) for bad in broken(page, REPO)]
    assert not found, "broken links:\n" + "\n".join(found)
