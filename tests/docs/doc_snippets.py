"""The code spans, code blocks and links of the docs (README.md, examples/cua_agent/README.md, docs/*.md,
docs/notes/*.md), each
with where it stands: what the docs tests check (a module of its own: test modules import no other test module).
"""

from __future__ import annotations

import dataclasses
import re
from functools import lru_cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# docs/notes/ holds dated working notes (the gate's history, the CI ledger): checked as the user docs are.
DOCS = [REPO / "README.md", REPO / "examples/cua_agent/README.md", *sorted((REPO / "docs").glob("*.md")),
        *sorted((REPO / "docs/notes").glob("*.md"))]
# Code blocks in these languages are not shell command lines (their `a=b` are Python or YAML).
NOT_SHELL = {"python", "py", "yaml", "yml", "json", "jsonc", "js", "javascript", "tcl", "html", "css"}


@dataclasses.dataclass(frozen=True)
class Snippet:
    doc: Path
    line: int
    kind: str        # "span", "block" (a code block line) or "link"
    text: str
    lang: str = ""

    def where(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"


FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")
SPAN = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


@lru_cache(maxsize=None)
def snippets(doc: Path) -> tuple[Snippet, ...]:
    out: list[Snippet] = []
    prose: list[tuple[int, str]] = []
    fence, lang = None, ""
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence, lang = m.group(1), m.group(2).lower()
            prose.append((number, ""))
        elif fence is not None and line.strip().startswith(fence):
            fence = None
            prose.append((number, ""))
        elif fence is not None:
            out.append(Snippet(doc, number, "block", line, lang))
            prose.append((number, ""))
        else:
            prose.append((number, line))
    text = "\n".join(line for _, line in prose)
    starts = [0]
    for _, line in prose:
        starts.append(starts[-1] + len(line) + 1)

    def line_of(offset: int) -> int:
        lo, hi = 0, len(prose) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return prose[lo][0]

    for m in SPAN.finditer(text):
        out.append(Snippet(doc, line_of(m.start()), "span", " ".join(m.group(2).split())))
    for m in LINK.finditer(SPAN.sub(lambda s: " " * len(s.group(0)), text)):
        out.append(Snippet(doc, line_of(m.start()), "link", m.group(1)))
    return tuple(out)


def all_snippets() -> list[Snippet]:
    return [s for doc in DOCS for s in snippets(doc)]
