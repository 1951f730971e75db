"""The documentation matches the code and stands alone: every relative link of the README and of
``docs/`` (and of ``tutorials/README.md``, ``benchmarks/README.md``) leads to a file that exists
and, with a ``#anchor``, to one of its headings; every Python block of the README and of ``docs/``
runs (``docs/extending.md``'s each in the namespace of the module it says it belongs to, the
others in order after the README's, in a scratch folder) and does what the text says;
``docs/extending.md`` names only files and functions that exist; the README is a front door
(short, the code first, the two Quickstart commands, a link to every doc and lesson); and no file
in the repository points outside it.

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
README = ROOT / "README.md"
DOCS = ROOT / "docs"
EXTENDING = DOCS / "extending.md"
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


def _section(text: str, header: str) -> str:
    """The body of the ``## header`` section of a Markdown text."""
    return text.split(f"\n## {header}\n", 1)[1].split("\n## ", 1)[0]


def test_layout_md_names_every_module_of_the_top_level_models_data_and_experiments():
    """docs/layout.md ("find where something lives") named no file of the GPT: models/gpt.py,
    data/stdlib.py, experiments/train_gpt.py, attention_study.py, cli_gpt.py. Every module of
    those folders is now named there, by its file name or a ``prefix*.py`` pattern."""
    import fnmatch
    names = set(re.findall(r"[\w*]+\.py", (DOCS / "layout.md").read_text()))
    folders = ("miniflow", "miniflow/models", "miniflow/data", "miniflow/experiments")
    unnamed = [f.relative_to(ROOT).as_posix() for folder in folders
               for f in sorted((ROOT / folder).glob("*.py"))
               if f.name not in ("__init__.py", "__main__.py")
               and not any(fnmatch.fnmatch(f.name, n) for n in names)]
    assert not unnamed, f"docs/layout.md does not name {unnamed}"


def test_the_readme_is_a_front_door():
    """At most ~170 lines: what miniflow is, the example and its IR, the two Quickstart commands
    (the second the one CI runs), then links to every doc, lesson and the benchmarks."""
    readme = README.read_text()
    assert len(readme.splitlines()) <= 170, "README.md: keep it a front door; move text to docs/"
    headers = re.findall(r"^## (.+)$", readme, re.M)
    assert headers == ["What it looks like", "Quickstart", "Where to read next"], headers
    commands = [ln for ln in re.findall(r"```bash\n(.*?)```", _section(readme, "Quickstart"),
                                        re.S)[0].splitlines() if ln and not ln.startswith("#")]
    assert len(commands) == 2, commands
    fresh = "python3 -m venv .venv && . .venv/bin/activate && pip install -e "
    assert commands[0] == fresh + ". && miniflow stability", commands[0]
    assert 'add_parser("stability"' in (ROOT / "miniflow" / "cli.py").read_text()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    install, test = commands[1].removeprefix(fresh).split(" && ")
    assert install == '".[dev]"' and 'python -m pip install -q -e ".[dev]"' in ci, commands[1]
    assert test == ci[-1] == "python -m pytest -q -n auto", (test, ci[-1])
    linked = {target.partition("#")[0] for target in _links(README)}
    wanted = {"tutorials/README.md", "benchmarks/README.md", "docs/stability/summary.md",
              *(p.relative_to(ROOT).as_posix() for p in DOCS.glob("*.md")),
              *(p.relative_to(ROOT).as_posix() for p in (ROOT / "tutorials").glob("[0-9]*.py"))}
    assert not wanted - linked, f"README.md links none of {sorted(wanted - linked)}"
    assert "(extending.md)" in (DOCS / "architecture.md").read_text()
    assert "(../docs/extending.md)" in (ROOT / "tutorials" / "README.md").read_text()


FENCED = re.compile(r"^```.*?^```[^\n]*$", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
LINKED_DOCS = [README, *sorted(DOCS.glob("*.md")), ROOT / "tutorials" / "README.md",
               ROOT / "benchmarks" / "README.md"]


def _links(path: Path) -> list:
    """The targets of the Markdown links and images of ``path``, outside code blocks and spans."""
    prose = re.sub(r"(`+).+?\1", "", FENCED.sub("", path.read_text()), flags=re.S)
    return LINK.findall(prose)


def _anchors(path: Path) -> set:
    """The anchors GitHub gives the headings of ``path``: the text lower-cased, backticks and
    punctuation other than ``-`` and ``_`` dropped, spaces to ``-``; a repeat gets ``-1``, ``-2``."""
    seen, anchors = {}, set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", FENCED.sub("", path.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


@pytest.mark.parametrize("doc", LINKED_DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_leads_to_a_file_and_heading(doc):
    broken = []
    for target in _links(doc):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue                                     # https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.is_relative_to(ROOT) or not dest.exists():
            broken.append(f"{target}: no such file in the repository")
        elif anchor and (dest.suffix != ".md" or anchor not in _anchors(dest)):
            broken.append(f"{target}: {dest.name} has no heading with anchor #{anchor}")
    assert not broken, f"{doc.relative_to(ROOT)}: {broken}"


def test_the_anchor_rule_is_githubs(tmp_path):
    path = tmp_path / "case.md"
    path.write_text("# A `b` c\n## Data parallel (world size 2)\n```\n# not a heading\n```\n"
                    "## ResNet-50 (OneFlow CI's benchmark)\n# A b c\n")
    assert _anchors(path) == {"a-b-c", "data-parallel-world-size-2",
                              "resnet-50-oneflow-cis-benchmark", "a-b-c-1"}


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


RUN_MARKER = re.compile(r"<!-- run(?P<how>[^>]*?) -->\n```python\n(?P<code>.*?)```", re.S)
"""A Python block of a doc and how it runs: ``<!-- run -->`` in order after the README's blocks,
``<!-- run (needs MODULE) -->`` the same when ``MODULE`` imports (an optional extra), and
``<!-- run: miniflow/....py -->`` in the namespace of that module (``docs/extending.md``)."""
RUN_DOCS = [README, *sorted(p for p in DOCS.glob("*.md")
                            if p != EXTENDING and "```python" in p.read_text())]


def _marked_blocks(path: Path) -> list:
    """``(how, code)`` of every Python block in ``path``, in order (``code`` after as many blank
    lines as precede it in ``path``, so a traceback names the doc's line); every Python block must
    carry a run marker."""
    text = path.read_text()
    blocks = [(m["how"].strip(), "\n" * text.count("\n", 0, m.start("code")) + m["code"])
              for m in RUN_MARKER.finditer(text)]
    assert len(blocks) == text.count("```python"), (
        f"{path.name}: every ```python block needs a <!-- run --> line above it")
    return blocks


def _python_blocks(path: Path) -> list:
    """``(module file, code)`` of every Python block in ``path`` (each marked with its module)."""
    blocks = _marked_blocks(path)
    assert all(how.startswith(": ") for how, _ in blocks), f"{path.name}: {blocks}"
    return [(how.removeprefix(": "), code) for how, code in blocks]


def _run_in_order(path: Path, namespace: dict) -> None:
    """Run the blocks of ``path`` in ``namespace``, in order (``needs``: skip without it)."""
    for how, code in _marked_blocks(path):
        needs = re.fullmatch(r"\(needs ([\w.]+)\)", how)
        assert how == "" or needs, f"{path.name}: only docs/extending.md runs blocks in a module"
        if needs:
            pytest.importorskip(needs.group(1))
        exec(compile(code, str(path.relative_to(ROOT)), "exec"), namespace)


def _usage_did_what_it_says(namespace: dict, folder: Path) -> None:
    assert namespace["losses"].shape == (4,)            # the 4 micro-batch losses
    assert namespace["sampler"].epoch == 1
    for written in ("amp.dot", "ckpt.safetensors", "model.safetensors", "gpt.safetensors"):
        assert (folder / written).is_file(), written
    text = namespace["text"]                            # the GPT's sample, from its state dict
    assert text.startswith("import ") and len(text) == len("import ") + 100


def _tools_did_what_it_says(namespace: dict, folder: Path) -> None:
    assert list((folder / "runs").rglob("events.out.tfevents*")), sorted(folder.rglob("*"))


AFTERWARDS = {"usage.md": _usage_did_what_it_says, "tools.md": _tools_did_what_it_says}
"""What a doc's blocks leave behind, checked after they ran."""


@pytest.mark.parametrize("doc", RUN_DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_python_blocks_of_the_readme_and_docs_run(doc, tmp_path, monkeypatch, capsys):
    """In a scratch folder, the README's blocks then ``doc``'s, in one namespace, as a reader who
    follows the README into the doc would run them."""
    from miniflow import distributed as dist
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(dist._STATE, "world", None)      # usage.md's dist.init(): rank 0 of 1
    namespace = {"__name__": "__docs__"}
    _run_in_order(README, namespace)
    assert "sgd_update(%model.0.weight" in capsys.readouterr().out     # the IR it prints
    if doc != README:
        _run_in_order(doc, namespace)
        if doc.name in AFTERWARDS:
            AFTERWARDS[doc.name](namespace, tmp_path)
    assert not set(AFTERWARDS) - {p.name for p in RUN_DOCS}


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
