"""Every relative link of README.md, docs/ and the committed reports leads somewhere: to a file of the
checkout, and, where it names a section of a Markdown page, to a heading of that page."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PAGES += sorted(ROOT.glob("reports/*/README.md"))
CODE_BLOCK = re.compile(r"```.*?```", re.S)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but hyphens dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {github_anchor(h) for h in re.findall(r"^#+ (.*)$", CODE_BLOCK.sub("", page.read_text()), re.M)}


def broken_links(page: Path) -> list[str]:
    broken = []
    for link in re.findall(r"\]\(([^)\s]+)\)", CODE_BLOCK.sub("", page.read_text())):
        if link.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = link.partition("#")
        target = page.parent / path if path else page
        if not target.exists():
            broken.append(f"{link} (no such file)")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(f"{link} (no such heading)")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_every_relative_link_of_a_page_leads_somewhere(page):
    assert broken_links(page) == []


def test_a_broken_link_and_a_missing_heading_are_found(tmp_path):
    (tmp_path / "other.md").write_text("# Fitted presses (`kvbench fit`)\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[a](other.md#fitted-presses-kvbench-fit) [b](other.md#gone) [c](missing.md) [d](https://x.org/y)\n"
        "```\n[e](inside-code.md)\n```\n"
    )
    assert broken_links(page) == ["other.md#gone (no such heading)", "missing.md (no such file)"]
