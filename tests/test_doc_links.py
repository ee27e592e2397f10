"""Every relative link of the docs (README.md, docs/*.md, pipelines/README.md, benchmarks/RESULTS.md) names a file
or folder that exists, and no docs page outgrows a reference page's length."""

from __future__ import annotations

import re

import pytest

from tests.doc_blocks import DOC_FILES, REPO

LINKED = [*DOC_FILES, "benchmarks/RESULTS.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def relative_links(file: str) -> list[str]:
    text = (REPO / file).read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)  # links inside code blocks are code
    targets = [t.split("#", 1)[0] for t in LINK.findall(text)]
    return [t for t in targets if t and not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto:


@pytest.mark.parametrize("file", LINKED)
def test_every_relative_link_names_a_file_that_exists(file):
    base = (REPO / file).parent
    missing = [t for t in relative_links(file) if not (base / t).exists()]
    assert not missing, f"{file}: links to {missing}, which do not exist"


def test_readme_and_docs_pages_keep_to_their_length():
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= 300
    long = {p.name: n for p in (REPO / "docs").glob("*.md")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 600}
    assert not long, f"docs pages over 600 lines: {long}"
