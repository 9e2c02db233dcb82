"""The README stays short and every relative link in it and in ``docs/`` leads somewhere.

A newcomer reads the README first: what it is, the two commands, one incident, where to go
next. Everything else lives in ``docs/`` and ``bench/RESULTS.md``; a link that no longer
resolves (a page renamed, an anchor whose heading changed) is a dead end for that reader.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from recovery.config import PROJECT_ROOT

README = PROJECT_ROOT / "README.md"
PAGES = sorted([README, PROJECT_ROOT / "bench" / "RESULTS.md", *(PROJECT_ROOT / "docs").rglob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces to dashes."""
    found = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def test_the_readme_is_at_most_250_lines_and_gives_the_two_commands_first():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail into docs/"
    head = "\n".join(lines[:8])
    assert "make run" in head and "make test" in head


def dead_links(page: Path) -> list[str]:
    dead = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            dead.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            dead.append(f"{target} (no heading #{anchor})")
    return dead


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(PROJECT_ROOT)))
def test_every_relative_link_resolves(page: Path):
    dead = dead_links(page)
    assert not dead, f"{page.relative_to(PROJECT_ROOT)}: dead links: {dead}"


def test_the_link_check_finds_a_missing_page_and_a_missing_heading(tmp_path):
    (tmp_path / "there.md").write_text("# There\n## A section\n")
    page = tmp_path / "p.md"
    page.write_text(
        "# Title\n[a](there.md) [b](there.md#a-section) [c](#title) [d](https://x.org/y)\n"
        "[e](missing.md) [f](there.md#nowhere)\n"
    )
    assert dead_links(page) == ["missing.md (no such file)", "there.md#nowhere (no heading #nowhere)"]
