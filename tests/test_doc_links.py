"""Every relative link in the README and docs/*.md reaches a file that exists and, with a #fragment into a markdown
file, a heading of it (GitHub's anchor rule), so moving text between the README and docs/fidelity-notes.md cannot
leave a dead link."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading's text: lower case, punctuation other than '-' and '_' dropped, spaces to '-'."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(path: Path) -> set[str]:
    out, fenced = set(), False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.add(anchor(line.lstrip("#")))
    return out


def links(path: Path) -> list[tuple[int, str]]:
    out, fenced = [], False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out += [(n, m) for m in LINK.findall(line) if not re.match(r"[a-z]+:", m)]
    return out


def test_anchor_rule():
    assert anchor(" A density × sharing grid") == "a-density--sharing-grid"
    assert anchor(" Hopper's bounds, TensorRT-LLM's KV, and `gemm_eff` at its floor") == \
        "hoppers-bounds-tensorrt-llms-kv-and-gemm_eff-at-its-floor"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    dead = []
    for n, target in links(doc):
        path, _, frag = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            dead.append(f"{doc.name}:{n}: {target} (no such file)")
        elif frag and dest.suffix == ".md" and frag not in headings(dest):
            dead.append(f"{doc.name}:{n}: {target} (no such heading)")
    assert not dead, "\n".join(dead)
