"""README.md and docs/: every relative link points at a file that exists (and at a heading that
exists, where it names one), and the README opens with the two commands."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# [text](target) outside code; the target ends at the first space or closing parenthesis
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def links(text: str) -> list[str]:
    """The link targets of a markdown page, code blocks and code spans left out."""
    return LINK.findall(CODE_SPAN.sub("", FENCE.sub("", text)))


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for the headings of ``page``: lower case, punctuation dropped, spaces as
    hyphens."""
    text = FENCE.sub("", page.read_text())
    headings = re.findall(r"^#+\s+(.*?)\s*$", text, re.MULTILINE)
    return {re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", h.replace("`", "").lower()))
            for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files_that_exist(page):
    broken = []
    for target in links(page.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def test_the_link_check_finds_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](page.md#title) [gone](missing.md) `[code](nowhere.md)`\n"
                    "```\n[fenced](nowhere.md)\n```\n")
    assert links(page.read_text()) == ["page.md#title", "missing.md"]
    assert anchors(page) == {"title"}


def test_the_readme_opens_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    first_block = FENCE.search(text).group(0).splitlines()[1:-1]
    assert [line.split("#")[0].split() for line in first_block] == [["make", "demo"],
                                                                    ["make", "test"]]


def test_the_readme_has_the_generated_standings_block():
    lines = (ROOT / "README.md").read_text().splitlines()
    begin, end = lines.index("<!-- standings:begin -->"), lines.index("<!-- standings:end -->")
    assert begin < end
