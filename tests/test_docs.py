"""The documentation matches the code and stands alone: ``docs/extending.md`` names only files and
functions that exist, the Python blocks of ``docs/`` run (each in the namespace of the module it
says it belongs to) and do what the text says, the README shows the code before the stability
study and links the checklists, and no file in the repository points outside it.

The run markers follow the idea of Python's ``doctest`` (the documentation's examples are
executed), with whole blocks instead of prompts."""
import importlib
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import miniflow as mf

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


RUN_MARKER = re.compile(r"<!-- run: (\S+\.py) -->\n```python\n(.*?)```", re.S)
"""A Python block of a doc, preceded by the file whose namespace it runs in."""


def _python_blocks(path: Path) -> list:
    """``(module file, code)`` of every Python block in ``path``, in order; every Python block
    must carry a run marker."""
    text = path.read_text()
    blocks = RUN_MARKER.findall(text)
    assert len(blocks) == text.count("```python"), (
        f"{path.name}: every ```python block needs a <!-- run: miniflow/....py --> line above it")
    return blocks


def _run_block(module_file: str, code: str, builders: dict) -> dict:
    """Run ``code`` in a copy of the namespace of the module ``module_file`` names (so the
    names the file imports are there; ``BUILDERS`` is the fresh dict ``builders``, so nothing is
    added to the real module); returns the namespace."""
    module = importlib.import_module(module_file.removesuffix(".py").replace("/", "."))
    namespace = {**vars(module), "BUILDERS": builders}
    exec(compile(code, f"{module_file} (docs/extending.md)", "exec"), namespace)
    return namespace


def _sum_pool_oracle(x: np.ndarray, k: int) -> np.ndarray:
    """Sum over non-overlapping ``k x k`` windows, in float64 (stride ``k``, no padding)."""
    n, c, h, w = x.shape
    return x.astype(np.float64).reshape(n, c, h // k, k, w // k, k).sum(axis=(3, 5))


def test_the_pool_like_op_of_extending_md_runs_as_written(monkeypatch):
    """The worked example adds a pool-like op in four places (the op's module, one kernel file
    per backend, the nn layer) and no shared builder signature; run, it trains nothing but
    computes the window sums, eagerly and in a graph, against NumPy."""
    from miniflow.kernels import cpu, cuda
    from miniflow.ops import unregister
    blocks = _python_blocks(EXTENDING)
    assert [f for f, _ in blocks] == ["miniflow/ops/pool.py", "miniflow/kernels/cpu/pool.py",
                                      "miniflow/kernels/cuda/pool.py", "miniflow/nn/pooling.py"]
    try:
        _run_block(*blocks[0], builders={})
        added = {}
        for (file, code), package in zip(blocks[1:3], (cpu, cuda)):
            fresh = {}
            _run_block(file, code, fresh)
            assert set(fresh) == {"example_sum_pool_2d"}, (file, fresh)
            for name, build in fresh.items():
                monkeypatch.setitem(package.KERNELS, name, build)
            added[package.__name__] = fresh
        layer = _run_block(*blocks[3], builders={})["SumPool2d"](2)

        class Pool(mf.nn.Graph):
            def __init__(self):
                super().__init__()
                self.pool = layer

            def build(self, x):
                return self.pool(x)

        mf.set_backend("cpu")
        x = np.random.default_rng(0).standard_normal((2, 3, 6, 8)).astype(np.float32)
        want = _sum_pool_oracle(x, 2)
        np.testing.assert_allclose(layer(mf.tensor(x)).numpy(), want, rtol=1e-6, atol=1e-6)
        graph = Pool()
        np.testing.assert_allclose(graph(x).numpy(), want, rtol=1e-6, atol=1e-6)
        assert [n.op.name for n in graph.ir.nodes] == ["example_sum_pool_2d"]
        from miniflow.ir import evaluate
        np.testing.assert_allclose(evaluate(graph.ir, [x])["output0"], want, rtol=1e-12)
    finally:
        unregister("example_sum_pool_2d")
