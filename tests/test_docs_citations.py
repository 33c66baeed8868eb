"""Every document the code cites ships in docs/, with the sections cited."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CITATION = re.compile(r"docs/([\w.-]+\.md)(?:\)?\s*§\s*(\d+(?:\.\d+)?)(?:-(\d+))?)?")
OUTSIDE = re.compile(r"clover-model\.md|shared/docs|(?<![\w/])(?:tool-calls|peer-tools|performance)\.md")


def _sources() -> list[Path]:
    files = [ROOT / "README.md"]
    for folder in ("runtime", "clover_cli", "tests", "benchmarks"):
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md", ".js", ".html")]
    return [p for p in files if p.is_file() and p != Path(__file__)]


def _sections(doc: Path) -> set[str]:
    """Section numbers of a document's numbered headings (`## 4. …` → "4", `### 2.1 …` → "2.1")."""
    return set(re.findall(r"^#{2,4} (\d+(?:\.\d+)?)\.? ", doc.read_text(encoding="utf-8"), flags=re.M))


def test_cited_documents_and_sections_exist() -> None:
    cited = 0
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        for m in CITATION.finditer(text):
            doc = ROOT / "docs" / m.group(1)
            assert doc.is_file(), f"{path.relative_to(ROOT)} cites {m.group(0)!r}, which the repository lacks"
            cited += 1
            if m.group(2):
                first = m.group(2)
                wanted = [first] if not m.group(3) else [str(n) for n in range(int(first), int(m.group(3)) + 1)]
                missing = set(wanted) - _sections(doc)
                assert not missing, f"{path.relative_to(ROOT)} cites {m.group(0)!r}: no section {sorted(missing)}"
    assert cited >= 10


def test_no_citation_of_documents_outside_the_repository() -> None:
    for path in _sources():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            assert not OUTSIDE.search(line), f"{path.relative_to(ROOT)}:{n} cites a document not in docs/: {line}"
