"""Every relative link in the README, docs/ and benchmarks/results/ resolves.

A moved or renamed file or section otherwise leaves a link that only a reader finds broken.
Anchors are checked against the target's headings under GitHub's slug rules.
"""
from __future__ import annotations

import re
import sys
import unicodedata
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
               *(ROOT / "benchmarks" / "results").glob("*.md")])

#: An inline link or image: `[text](target)` or `[text](target "title")`.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lower-cased, punctuation dropped, spaces to
    hyphens (github-slugger keeps letters, digits, marks, `-` and `_`)."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text).strip().lower()
    kept = (ch for ch in text
            if ch in "-_ " or unicodedata.category(ch)[0] in "LNM")
    return "".join(kept).replace(" ", "-")


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """The file's lines outside fenced code blocks, numbered from 1."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, repeats numbered as GitHub numbers them."""
    seen: Counter[str] = Counter()
    found = set()
    for _, line in prose_lines(path):
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            found.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
            seen[base] += 1
    return found


def broken_links(path: Path) -> list[str]:
    """Each relative link of `path` whose file or heading does not exist, as
    'file:line: target: why'."""
    problems = []
    for number, line in prose_lines(path):
        for match in LINK.finditer(CODE_SPAN.sub("", line)):
            target = match.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                continue  # http(s), mailto: not checked here
            file_part, _, anchor = target.partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(ROOT)}:{number}: {target}"
            if not resolved.exists():
                problems.append(f"{where}: no file {resolved.relative_to(ROOT)}; fix the path")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                problems.append(f"{where}: no heading with anchor #{anchor} in "
                                f"{resolved.relative_to(ROOT)}; link an existing heading")
    return problems


def test_slug_follows_github():
    assert slug("The paper's setups `paper-core` and `paper-extended` (issue 34)") == \
        "the-papers-setups-paper-core-and-paper-extended-issue-34"
    assert slug("The default plan under one GPU type 30 % slower") == \
        "the-default-plan-under-one-gpu-type-30--slower"
    assert slug("`coral profile` past the cache") == "coral-profile-past-the-cache"


def test_a_broken_link_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "b.md").write_text("# Title\n\n## Repeat\n\n## Repeat\n", encoding="utf-8")
    doc = tmp_path / "a.md"
    doc.write_text("[ok](b.md#repeat-1) [gone](c.md) [bad](b.md#nope) `[code](x.md)`\n"
                   "```\n[fenced](y.md)\n```\n[web](https://example.com) [self](#a)\n",
                   encoding="utf-8")
    problems = broken_links(doc)
    assert [p.split(": ")[1] for p in problems] == ["c.md", "b.md#nope", "#a"]


def test_the_results_index_lists_every_results_file():
    results = ROOT / "benchmarks" / "results"
    index = (results / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"\]\(([\w.-]+\.md)\)", index))
    assert listed == {p.name for p in results.glob("*.md")} - {"README.md"}


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []
