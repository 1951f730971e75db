"""The documentation matches the code and stands alone: ``docs/extending.md`` names only files and
functions that exist, the README shows the code before the stability study and links the
checklists, and no file in the repository points outside it."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXTENDING = ROOT / "docs" / "extending.md"
OUTSIDE = ("../" + "shared", "STYLE" + ".md", "ARCHITECTURE" + ".md", "REFERENCE" + ".md")
"""Files outside the repository that older versions cited (spelled in two parts, so that this file
does not cite them either)."""


def _code_spans(text: str) -> list:
    """The contents of the inline code spans of a Markdown text (any number of backticks)."""
    return [m.group(2).strip() for m in re.finditer(r"(`+)(.+?)\1", text, re.S)]


def _sources() -> str:
    """The text of every Python module and test, and pyproject.toml."""
    paths = [*(ROOT / "miniflow").rglob("*.py"), *(ROOT / "tests").rglob("*.py"),
             ROOT / "pyproject.toml"]
    return "\n".join(p.read_text() for p in paths)


def test_every_path_in_extending_md_exists():
    paths = [s for s in _code_spans(EXTENDING.read_text())
             if re.fullmatch(r"(miniflow|tests|tutorials|docs)/[\w./]*|pyproject\.toml", s)]
    assert len(paths) > 40, paths
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"docs/extending.md names files that do not exist: {missing}"


def test_every_name_in_extending_md_is_in_the_code():
    """Every identifier in a code span (``register``, ``derived_builder(op)``, ``ctx.print_ir``,
    ``OpDef.amp``) occurs in the sources, so a rename that leaves the checklist behind fails."""
    source = _sources()
    names = set()
    for span in _code_spans(EXTENDING.read_text()):
        head = re.match(r"[A-Za-z_][\w.]*(?=\(|$| ->)", span)
        if head and "/" not in span and not re.search(r"\.(py|md|cpp|toml|txt)$", span):
            names.update(p for p in head.group(0).split(".") if p)
    assert len(names) > 80, sorted(names)
    missing = sorted(n for n in names if not re.search(rf"\b{re.escape(n)}\b", source))
    assert not missing, f"docs/extending.md names what the code does not have: {missing}"


def test_the_readme_shows_the_code_first_and_links_the_checklists():
    readme = (ROOT / "README.md").read_text()
    headers = re.findall(r"^## (.+)$", readme, re.M)
    assert headers.index("What it looks like") < headers.index(
        "The main job: training stability with and without the loss-scale fix")
    assert "docs/extending.md" in readme
    assert "(extending.md)" in (ROOT / "docs" / "architecture.md").read_text()
    assert "(../docs/extending.md)" in (ROOT / "tutorials" / "README.md").read_text()


def _repository_files() -> list:
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / line for line in out.splitlines() if (ROOT / line).is_file()]


def test_no_file_references_anything_outside_the_repository():
    found = []
    for path in _repository_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue                      # figures
        found += [f"{path.relative_to(ROOT)}: {word}" for word in OUTSIDE if word in text]
    assert not found, found
