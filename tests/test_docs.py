"""The documentation: docs/configuration.md is what the config model writes now, and every relative
link and anchor in README.md, BENCHMARKS.md and docs/ resolves (GitHub's anchors: the heading in
lower case, spaces to '-', punctuation dropped, a repeated heading numbered)."""

import json
import re
from collections import Counter
from itertools import pairwise
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt

from qml_ray import config_docs
from qml_ray.bench import figures

from conftest import ROOT

PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
PARSER = MarkdownIt("commonmark").enable("table")


def slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor on the page, as GitHub makes them."""
    tokens = PARSER.parse(page.read_text())
    seen, found = Counter(), set()
    for heading, inline in pairwise(tokens):
        if heading.type == "heading_open":
            base = slug("".join(child.content for child in inline.children))
            found.add(f"{base}-{seen[base]}" if seen[base] else base)
            seen[base] += 1
    return found


def links(page: Path) -> list[str]:
    """Every link's and image's target on the page, code left out."""
    targets = []
    for token in PARSER.parse(page.read_text()):
        for child in token.children or []:
            if child.type in ("link_open", "image"):
                targets.append(child.attrs.get("href") or child.attrs["src"])
    return targets


def relative(page: Path) -> list[tuple[Path, str]]:
    """The page's links that stay in the project: the file each names and its anchor ('' for none)."""
    found = []
    for target in links(page):
        parts = urlsplit(target)
        if parts.scheme or parts.netloc:
            continue
        found.append(((page.parent / unquote(parts.path)).resolve() if parts.path else page, parts.fragment))
    return found


def test_the_configuration_page_is_what_the_config_model_writes():
    page = ROOT / "docs" / "configuration.md"
    assert page.read_text() == config_docs.markdown(), "run: python -m qml_ray.config_docs > docs/configuration.md"


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_every_relative_link_and_anchor_resolves(page):
    broken = [
        f"{path.relative_to(ROOT)}#{anchor}" if anchor else str(path.relative_to(ROOT))
        for path, anchor in relative(page)
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in anchors(path))
    ]
    assert not broken, f"{page.relative_to(ROOT)}: links that resolve to nothing: {broken}"


def test_the_link_check_sees_anchors_as_github_makes_them(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Run on GKE\n\n## `--resume`, and more!\n\n## Notes\n\n## Notes\n\n```\n[x](#nowhere)\n```\n")
    assert anchors(page) == {"run-on-gke", "--resume-and-more", "notes", "notes-1"}
    assert links(page) == []


def test_the_benchmark_figures_are_drawn_from_the_recorded_json(tmp_path):
    doc = json.loads((ROOT / "benchmarks" / "circuits-compiled" / "circuits.json").read_text())
    drawn = figures.draw(doc, tmp_path)
    assert [path.name for path in drawn] == ["circuits.png", "peers.png"]
    assert all(path.read_bytes().startswith(b"\x89PNG") for path in drawn)
