"""The docs stand on their own: every relative link of every Markdown file reaches a file
(and, for a Markdown page, a heading), and every invariant the code, tests or docs cite
(I1..I14) is defined in docs/design/invariants.md."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[2]
INVARIANTS = ROOT / "docs" / "design" / "invariants.md"
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CITATION = re.compile(r"(?<![\w-])I(1[0-9]|[1-9])(?![\w-])")
# Recorded third-party data: its Markdown and its invariant-like strings are not ours.
NOT_OURS = ("tests/fixtures/",)


def tracked(*patterns: str) -> list[Path]:
    """The repository's own files (git ls-files: no virtualenv, no caches), plus new ones not yet committed."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", *patterns],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / line for line in out.splitlines()
            if line and not line.startswith(NOT_OURS) and (ROOT / line).is_file()]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: dict[str, int] = {}
    names = set()
    for line in FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            count = found.get(base, 0)
            names.add(base if count == 0 else f"{base}-{count}")
            found[base] = count + 1
    return names


def broken_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code is not a link
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-zA-Z][a-zA-Z+.-]*:", target):  # http:, https:, mailto: ...
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target} (no heading #{fragment})")
    return broken


def test_every_relative_link_of_every_markdown_file_reaches_its_target() -> None:
    pages = tracked("*.md")
    assert ROOT / "README.md" in pages
    problems = {str(p.relative_to(ROOT)): broken_links(p) for p in pages}
    problems = {page: links for page, links in problems.items() if links}
    assert not problems, f"links that point nowhere: {problems}"


def test_the_link_check_sees_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# A heading\n", encoding="utf-8")
    page.write_text("[ok](there.md#a-heading) [gone](missing.md) [bad](there.md#nope) `[code](x.md)`\n"
                    "```\n[fenced](nowhere.md)\n```\n[web](https://example.org/x)\n", encoding="utf-8")
    assert broken_links(page) == ["missing.md (no such file)", "there.md#nope (no heading #nope)"]


def defined_invariants() -> set[str]:
    text = INVARIANTS.read_text(encoding="utf-8")
    return {f"I{n}" for n in re.findall(r"^#{2,3} I(\d+)\b", text, re.M)}


def citations() -> dict[str, set[str]]:
    cited: dict[str, set[str]] = {}
    for path in tracked("*.py", "*.md", "*.sql", "*.sh", "*.yaml", "*.yml", "*.html", "*.toml", "*.ini"):
        for number in CITATION.findall(path.read_text(encoding="utf-8", errors="replace")):
            cited.setdefault(f"I{number}", set()).add(str(path.relative_to(ROOT)))
    return cited


def test_every_cited_invariant_is_defined_in_the_design_docs() -> None:
    defined = defined_invariants()
    assert {f"I{n}" for n in range(1, 15)} <= defined, "docs/design/invariants.md must define I1..I14"
    undefined = {name: sorted(files) for name, files in citations().items() if name not in defined}
    assert not undefined, f"invariants cited but not defined in docs/design/invariants.md: {undefined}"


def test_the_code_cites_the_invariants_it_keeps() -> None:
    """The citations are the point of the page: the library refers to the invariants by name."""
    cited_in_library = {name for name, files in citations().items()
                        if any(f.startswith("plugins/partner_harvest/") for f in files)}
    assert {"I4", "I10", "I11", "I12"} <= cited_in_library
