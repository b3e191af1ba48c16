"""The README is a door and docs/ holds the rest: every relative link in README.md and docs/*.md
resolves to a file (or heading) inside the repository, every doc is reachable from the README,
and the README stays short with the two commands a newcomer runs as its first lines."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 200

_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"`[^`\n]*`")
# [text](target) or [text](target "title"); images too. Nested brackets in the text are rare
# enough in these docs that a non-greedy text match does.
_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto: …
# A path of the repository named in inline code: `flows/stages/training.py`, `futureworld/rl/`.
_CODE_PATH = re.compile(
    r"`((?:futureworld|storage|flows|tests|benchmarks|infra)/[\w./-]*?(?:\.\w+|/))`"
)


@dataclass(frozen=True)
class Link:
    source: Path
    line: int
    target: str


@dataclass(frozen=True)
class BrokenLink:
    link: Link
    why: str

    def __str__(self) -> str:
        where = f"{self.link.source.relative_to(ROOT)}:{self.link.line}"
        return f"{where}: ({self.link.target}) {self.why}"


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, with inline code spans blanked."""
    out: list[tuple[int, str]] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, _INLINE_CODE.sub("``", line)))
    return out


def relative_links(path: Path) -> list[Link]:
    """Every link of a markdown file that is not an absolute URL (http:, mailto: …)."""
    links = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        for match in _LINK.finditer(line):
            target = match.group(1)
            if not _EXTERNAL.match(target):
                links.append(Link(path, number, target))
    return links


def heading_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: markup dropped, lower case, punctuation removed, spaces
    to hyphens."""
    text = re.sub(r"[*_`]", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = unicodedata.normalize("NFC", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a markdown file's headings, numbered -1, -2 … when repeated (GitHub's)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _number, line in prose_lines(path.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if not match:
            continue
        anchor = heading_anchor(match.group(2))
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        out.add(anchor if count == 0 else f"{anchor}-{count}")
    return out


def check_link(link: Link, root: Path) -> BrokenLink | None:
    """Why a relative link does not resolve inside `root`, or None when it does."""
    target, _, fragment = link.target.partition("#")
    if target.startswith("/"):
        return BrokenLink(link, "is absolute: link relative to the file")
    resolved = (link.source.parent / target).resolve() if target else link.source
    if not resolved.is_relative_to(root.resolve()):
        return BrokenLink(link, "points outside the repository")
    if not resolved.exists():
        return BrokenLink(link, "does not exist")
    if fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
        return BrokenLink(link, f"has no heading #{fragment}")
    return None


def broken_links(paths: list[Path], root: Path) -> list[BrokenLink]:
    problems = []
    for path in paths:
        for link in relative_links(path):
            problem = check_link(link, root)
            if problem is not None:
                problems.append(problem)
    return problems


def documentation_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def test_every_relative_link_resolves_inside_the_repository() -> None:
    problems = broken_links(documentation_files(), ROOT)
    assert not problems, "\n".join(map(str, problems))


def missing_code_paths(path: Path, root: Path) -> list[str]:
    """Repository paths a markdown file names in inline code (outside fenced blocks) that do
    not exist: a module, test or script the docs point a reader to."""
    missing = []
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        for match in [] if fenced else _CODE_PATH.finditer(line):
            if not (root / match.group(1)).exists():
                missing.append(f"{path.relative_to(root)}:{number}: {match.group(1)}")
    return missing


def test_every_code_path_the_docs_name_exists() -> None:
    missing = [m for path in documentation_files() for m in missing_code_paths(path, ROOT)]
    assert not missing, "\n".join(missing)


def test_every_doc_is_reachable_from_the_readme() -> None:
    reached: set[Path] = set()
    todo = [README]
    while todo:
        path = todo.pop()
        if path in reached:
            continue
        reached.add(path)
        for link in relative_links(path):
            target = (path.parent / link.target.partition("#")[0]).resolve()
            if target.suffix == ".md" and target.is_file() and target.parent == DOCS.resolve():
                todo.append(target)
    docs = {p.resolve() for p in DOCS.glob("*.md")}
    assert docs, "docs/ holds no documentation"
    unreached = sorted(p.name for p in docs - reached)
    assert not unreached, f"docs not linked from README.md (directly or through a doc): {unreached}"


def test_the_readme_is_a_door() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines (at most {MAX_README_LINES}): move detail to docs/"
    )
    assert lines[0].startswith("# ")
    first = "\n".join(lines[:8])
    assert re.search(r"^make demo\b", first, re.MULTILINE), first
    assert re.search(r"^make test\b", first, re.MULTILINE), first
    assert first.index("make demo") < first.index("make test")


def test_the_link_checker_finds_what_is_broken(tmp_path: Path) -> None:
    """The checker itself, on a made-up repository: it must catch a missing file, a missing
    heading, a link out of the repository and an absolute path, and must not read links inside
    code or absolute URLs."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "outside.md").write_text("# Outside\n")
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "a.md").write_text("# A title\n\n## Second: part, two\n\n## A title\n")
    readme = repo / "README.md"
    readme.write_text(
        "\n".join(
            [
                "# Repo",
                "[ok](docs/a.md) [ok anchor](docs/a.md#second-part-two)",
                "[repeated heading](docs/a.md#a-title-1) [own heading](#repo)",
                "[missing](docs/b.md) [bad anchor](docs/a.md#nowhere)",
                "[escapes](../outside.md) [absolute](/etc/hosts)",
                "[web](https://example.com/x.md) `[code](docs/nothing.md)`",
                "```",
                "[fenced](docs/nothing.md)",
                "```",
            ]
        )
    )
    found = {(p.link.target, p.why) for p in broken_links([readme], repo)}
    assert found == {
        ("docs/b.md", "does not exist"),
        ("docs/a.md#nowhere", "has no heading #nowhere"),
        ("../outside.md", "points outside the repository"),
        ("/etc/hosts", "is absolute: link relative to the file"),
    }


def test_heading_anchors_follow_github() -> None:
    assert heading_anchor("Why the numbers moved, and how the demo got faster") == (
        "why-the-numbers-moved-and-how-the-demo-got-faster"
    )
    assert heading_anchor("Forecast time, re-forecasts and provisional rewards") == (
        "forecast-time-re-forecasts-and-provisional-rewards"
    )
    assert heading_anchor("The update (formulas)") == "the-update-formulas"
    assert heading_anchor("`backfill` and **rewards**") == "backfill-and-rewards"


def test_the_code_path_checker_finds_a_missing_module(tmp_path: Path) -> None:
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "context.py").write_text("")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "`flows/context.py` and `flows/` exist; `flows/gone.py` does not.\n"
        "```\nflows/also_gone.py in a fence is not a reference: `flows/fenced.py`\n```\n"
        "`reports/demo/` is not a repository path.\n"
    )
    assert missing_code_paths(doc, tmp_path) == ["doc.md:1: flows/gone.py"]
