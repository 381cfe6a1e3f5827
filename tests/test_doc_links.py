"""Every link of the docs resolves: relative file links to files of the repository, and #anchors to
headings of the target, slugged as GitHub does. External (http, mailto) links are not fetched."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
CODE = re.compile(r"`[^`\n]*`")
# [text](target) and ![alt](target), the target up to a space (a title may follow) or ")"
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFDEF = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.M)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation but - and _ removed,
    each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w keeps letters and digits of any script, and _
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors GitHub makes for a Markdown file: repeated headings get -1, -2, ..."""
    text = FENCE.sub("", path.read_text())
    seen: Counter[str] = Counter()
    out: set[str] = set(HTML_ANCHOR.findall(text))
    for _, title in HEADING.findall(text):
        slug = github_slug(title)
        out.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return out


def links(path: Path) -> list[str]:
    text = CODE.sub("", FENCE.sub("", path.read_text()))
    return LINK.findall(text) + REFDEF.findall(text)


def broken(path: Path) -> list[str]:
    out = []
    for target in links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            out.append(f"{target}: no file {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}")
        elif REPO not in dest.parents and dest != REPO:
            out.append(f"{target}: outside the repository")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{target}: no heading with the anchor #{anchor} in {dest.relative_to(REPO)}")
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_resolves(doc: Path) -> None:
    assert broken(doc) == []


def test_no_doc_cites_a_file_outside_the_repository() -> None:
    """The reference deployment's facts are summarised in docs/reference-deployment.md."""
    cited = [str(p.relative_to(REPO)) for p in DOCS if "shared/reference/" in p.read_text()]
    assert cited == []


def test_github_slugs() -> None:
    assert github_slug("Baseline vs speculative decoding") == "baseline-vs-speculative-decoding"
    assert github_slug("SLOs, goodput and capacity") == "slos-goodput-and-capacity"
    assert github_slug("`--host` and `/v1`: what's sent") == "--host-and-v1-whats-sent"
    assert github_slug("Per-request tok/s (C=1)") == "per-request-toks-c1"
    assert github_slug("Queue ≥ 0 — running") == "queue--0--running"


def test_the_checker_finds_a_broken_file_link_and_a_broken_anchor(tmp_path: Path) -> None:
    doc = REPO / "docs" / "guide.md"
    assert "docs/guide.md" not in " ".join(broken(doc))  # (the real file is clean: see above)
    text = "# Title\n\n## Two words\n\n[ok](#two-words) [bad](#three-words) [gone](nope.md) [x](guide.md#nowhere)\n"
    probe = REPO / "docs" / "_probe_links.md"
    probe.write_text(text)
    try:
        found = broken(probe)
    finally:
        probe.unlink()
    assert found == [
        "#three-words: no heading with the anchor #three-words in docs/_probe_links.md",
        "nope.md: no file docs/nope.md",
        "guide.md#nowhere: no heading with the anchor #nowhere in docs/guide.md",
    ]
