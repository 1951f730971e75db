"""Jupyter (``miniflow.notebook``, ``miniflow.ir_html``; the ``notebook`` extra): the lessons are
jupytext percent-format notebooks that still run as scripts (tests/test_tutorials.py runs them
so), lesson 01 runs as a notebook in a real kernel and shows its key fact, and the IR renders as
HTML colored by AMP color.

Followed: jupytext's own round-trip tests (``tests/test_read_simple_percent.py``: a percent
script read into cells) and nbclient's execution tests (run a notebook, read the outputs);
IPython's rich display protocol for ``_repr_html_``.
"""
import html
import re
import sys
import types
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from miniflow import notebook, optim
from miniflow.amp import GradScaler, white_identity
from miniflow.experiments.mlp import TrainGraph, mlp
from miniflow.extras import MissingExtraError

TUTORIALS = Path(__file__).resolve().parent.parent / "tutorials"
LESSONS = sorted(TUTORIALS.glob("[0-9][0-9]_*.py"))


@pytest.mark.parametrize("lesson", LESSONS, ids=[p.name for p in LESSONS])
def test_every_lesson_is_a_percent_notebook_whose_cells_compile(lesson):
    pytest.importorskip("jupytext")
    nb = notebook.to_notebook(lesson)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert len(code) >= 3, f"{lesson.name}: {len(code)} code cells; split it with # %% lines"
    assert nb.metadata["kernelspec"]["name"] == "python3"
    for k, cell in enumerate(code):
        compile(cell.source, f"{lesson.name} cell {k}", "exec")   # each cell stands alone
    source = lesson.read_text()
    if "argparse" in source:   # a kernel's argv are its own: the lesson must not parse them
        assert "parse_args(script_args())" in source
    assert "__file__" not in source.replace('"__file__"', "")   # a notebook has none


@pytest.mark.slow
def test_lesson_01_runs_as_a_notebook_and_shows_its_key_fact(tmp_path):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = notebook.execute(TUTORIALS / "01_lazy_graph.py", cwd=tmp_path, timeout=300)
    shown = "".join(notebook.cell_text(c) for c in nb.cells if c.cell_type == "code")
    assert "compile_count after 2 calls with the same input shape: 1\n" in shown
    assert "compile_count after calling with the batch of 8 again: 2 " in shown
    html_outputs = [o["data"]["text/html"] for c in nb.cells if c.cell_type == "code"
                    for o in c.outputs if "text/html" in o.get("data", {})]
    assert len(html_outputs) == 1 and 'class="miniflow-ir"' in html_outputs[0]


@pytest.mark.slow
def test_a_lesson_run_as_a_notebook_from_another_folder_finds_its_own(tmp_path):
    """``execute(lesson, cwd=elsewhere)``: ``script_dir`` gave the kernel's working folder, so
    lessons 3, 8, 11 and 12, which start themselves in a child process, ran a file that is not
    there (lesson 8: "can't open file '<cwd>/08_add_an_op.py'"), and default outputs went to
    ``<cwd>/../tutorial-output``. The lesson's folder is its own now, as for a script."""
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    lesson, elsewhere = tmp_path / "lessons" / "lesson.py", tmp_path / "elsewhere"
    lesson.parent.mkdir()
    elsewhere.mkdir()
    lesson.write_text("# %%\nimport os\nfrom miniflow.notebook import script_dir\n"
                      "print(script_dir(globals()), os.getcwd())\n")
    nb = notebook.execute(lesson, cwd=elsewhere, timeout=120)
    shown = "".join(notebook.cell_text(c) for c in nb.cells if c.cell_type == "code")
    assert shown == f"{lesson.parent} {elsewhere}\n"


class _Lines(HTMLParser):
    """The node lines of ``graph_html``: (data-amp-color, data-op, text) per node div."""

    def __init__(self):
        super().__init__()
        self.rows, self._attrs, self._depth = [], None, 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "div" and "data-amp-color" in attrs:
            self._attrs, self._text, self._depth = attrs, "", 1
        elif self._attrs is not None:
            self._depth += 1

    def handle_endtag(self, tag):
        if self._attrs is not None:
            self._depth -= 1
            if self._depth == 0:
                self.rows.append((self._attrs, self._text))
                self._attrs = None

    def handle_data(self, data):
        if self._attrs is not None:
            self._text += data


def _amp_graph():
    class Step(TrainGraph):
        def build(self, x, y):   # white_identity: an identity node to mark
            from miniflow import nn
            loss = nn.functional.cross_entropy(white_identity(self.model(x)), y)
            loss.backward()
            return loss

    model = mlp((8, 16, 4))
    graph = Step(model, optim.SGD(model.parameters(), lr=0.1))
    graph.config.enable_amp(True)
    graph.set_grad_scaler(GradScaler())
    return graph, (np.zeros((4, 8), np.float32), np.zeros(4, np.int64))


def test_repr_html_colors_every_node_of_an_amp_graph_and_marks_casts_and_identities():
    graph, inputs = _amp_graph()
    ir = graph.lower(*inputs, after="amp")
    text = ir._repr_html_()
    parser = _Lines()
    parser.feed(text)
    assert len(parser.rows) == len(ir.nodes)
    names = ir.names()
    for node, (attrs, shown) in zip(ir.nodes, parser.rows):
        assert attrs["data-amp-color"] == node.meta["amp_color"] and attrs["data-op"] == node.op.name
        mark = "CAST" if node.op.name == "cast" else "ID" if "identity" in node.op.name else ""
        assert shown == "  " + node.format(names) + (mark and f" {mark}")   # as printed
        background = re.search(r"background:(#[0-9a-f]{6})", attrs["style"]).group(1)
        assert background == {"white": "#ffffff", "black": "#000000", "gray": "#b3b3b3",
                              "clear": "#add8e6", "unlisted": "#f0e68c",
                              "cast": "#ffd700"}[node.meta["amp_color"]]
    colors = [a["data-amp-color"] for a, _ in parser.rows]
    assert {"white", "cast", "black"} <= set(colors)
    assert colors.count("cast") == sum(n.op.name == "cast" for n in ir.nodes) > 0
    assert any(a["data-op"] == "amp_white_identity" for a, _ in parser.rows)
    legend = text[text.rindex('<div style="font-size:11px'):]
    assert all(f">{html.escape(t)}<" in legend for t in ("white: float16", "black: float32",
                                                         "cast inserted by AMP"))
    assert "no AMP color" not in legend   # only the colors the graph uses
    final = graph.lower(*inputs)   # made after AMP by later passes: no color
    assert 'data-amp-color="none"' in final._repr_html_()


def test_repr_html_escapes_the_printed_text():
    from miniflow.ir import Graph
    from miniflow.ops import emitter
    g = Graph()
    x = g.add_input("a<b&c", (2,), "float32")
    g.set_outputs([emitter(g)("relu", x)])
    text = g._repr_html_()
    assert "a&lt;b&amp;c" in text and "a<b" not in text


def test_script_args_and_dir_as_a_script_and_in_a_kernel(monkeypatch, tmp_path):
    assert not notebook.in_notebook() and notebook.script_args() is None
    assert notebook.script_dir({"__file__": str(tmp_path / "lesson.py")}) == tmp_path
    shell = type("ZMQInteractiveShell", (), {})()
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(notebook.LESSON_DIR, raising=False)
    assert notebook.in_notebook() and notebook.script_args() == []
    assert notebook.script_dir({"__name__": "__main__"}) == tmp_path
    monkeypatch.setenv(notebook.LESSON_DIR, str(tmp_path / "lessons"))   # execute(..., cwd=)
    assert notebook.script_dir({"__name__": "__main__"}) == tmp_path / "lessons"


def test_without_the_notebook_extra_conversion_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "jupytext", None)
    with pytest.raises(MissingExtraError, match=r'pip install -e "\.\[notebook\]"'):
        notebook.to_notebook(LESSONS[0])


def test_source_finds_a_class_defined_in_a_cell_like_file(tmp_path):
    """A class whose module has no file (a notebook cell): ``notebook.source`` finds its block
    through its first method's code, where ``inspect.getsource`` raises OSError."""
    import linecache
    text = "x = 1\n\nclass Cell:\n    '''doc'''\n\n    def f(self):\n        return 2\n\ny = 3\n"
    name = "<ipython-input-cell>"
    linecache.cache[name] = (len(text), None, text.splitlines(True), name)
    space = {"__name__": "__main__"}
    exec(compile(text, name, "exec"), space)
    with pytest.raises(OSError):
        __import__("inspect").getsource(space["Cell"])
    assert notebook.source(space["Cell"]) == "class Cell:\n    '''doc'''\n\n    def f(self):\n" \
        "        return 2\n"
    assert notebook.source(notebook.source).startswith("def source(obj)")
