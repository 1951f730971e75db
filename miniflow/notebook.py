"""The lessons as Jupyter notebooks (the ``notebook`` extra: ``pip install -e ".[notebook]"``).

The lessons (``tutorials/*.py``) are in jupytext's percent format: ``# %%`` starts a code cell,
``# %% [markdown]`` a text cell, so Jupyter (with jupytext) and VS Code open each one as a
notebook while ``python tutorials/01_lazy_graph.py`` still runs it as a script. In a notebook
the IR shows as HTML (``Graph._repr_html_``, ``miniflow.ir_html``).

:func:`script_args`, :func:`script_dir` and :func:`source` let one lesson file run both ways: a
Jupyter kernel's ``sys.argv`` holds the kernel's own options, a notebook has no ``__file__``
(Jupyter runs it in its folder), and ``inspect.getsource`` finds no class defined in a cell.
:func:`out_folder` makes a lesson's ``--out`` folder, or says why it cannot (a usage error).
:func:`to_notebook` and :func:`execute` convert and run a lesson as a notebook (jupytext, then
nbclient), as the tests do.
"""
from __future__ import annotations

import inspect
import linecache
import os
import sys
from pathlib import Path

from .extras import require

__all__ = ["in_notebook", "script_args", "script_dir", "LESSON_DIR", "out_folder", "source",
           "to_notebook", "execute", "cell_text"]


def in_notebook() -> bool:
    """Whether this code runs in a Jupyter (IPython) kernel."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def script_args() -> list | None:
    """What a lesson's ``argparse`` should parse: None (``sys.argv[1:]``) as a script, ``[]``
    (the defaults) in a notebook, whose ``sys.argv`` are the kernel's."""
    return [] if in_notebook() else None


LESSON_DIR = "MINIFLOW_LESSON_DIR"
"""The environment variable :func:`execute` gives its kernel: the lesson's folder, which the
kernel's working folder (``cwd``) need not be."""


def script_dir(module_globals: dict) -> Path:
    """The folder of the running lesson: its file's folder as a script (``__file__`` in
    ``module_globals``); in a notebook the folder :func:`execute` names (:data:`LESSON_DIR`),
    else the working folder (Jupyter starts the kernel in the notebook's folder)."""
    file = module_globals.get("__file__")
    if file:
        return Path(file).resolve().parent
    return Path(os.environ[LESSON_DIR]) if os.environ.get(LESSON_DIR) else Path.cwd()


def out_folder(parser, path: Path) -> Path:
    """Make a lesson's ``--out`` folder ``path`` (with its parents) and return it; a path that
    cannot be that folder (a file, a folder under a file, no permission) is ``parser``'s usage
    error (exit code 2) naming ``--out``, the path and why, not a traceback."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        why = ("it is a file" if path.is_file() else
               f"it cannot be made: {e.strerror or e}")
        parser.error(f"--out {path}: {why}; give a folder (made if missing)")
    return path


def source(obj) -> str:
    """``inspect.getsource(obj)``, also for a class defined in a notebook cell (Python before
    3.13 looks a class up in its module's file, and a notebook's ``__main__`` has none): the
    block that starts at the ``class`` line above its first method, in that cell's text.

    Raises:
        OSError / TypeError: as ``inspect.getsource``, when no source is found.
    """
    try:
        return inspect.getsource(obj)
    except OSError:
        methods = [f for f in vars(obj).values() if inspect.isfunction(f)] \
            if inspect.isclass(obj) else []
        if not methods:
            raise
        code = methods[0].__code__
        lines = linecache.getlines(code.co_filename)
        start = next((i for i in range(code.co_firstlineno - 1, -1, -1)
                      if lines[i].lstrip().startswith(f"class {obj.__name__}")), None)
        if start is None:
            raise
        return "".join(inspect.getblock(lines[start:]))


def to_notebook(path):
    """The lesson at ``path`` (a percent-format ``.py``) as an ``nbformat`` notebook.

    Raises:
        miniflow.extras.MissingExtraError: jupytext is not installed.
    """
    jupytext = require("jupytext", "notebook", "miniflow.notebook")
    return jupytext.read(os.fspath(path), fmt="py:percent")


def execute(path, *, timeout: int = 600, cwd=None):
    """Convert the lesson at ``path`` with :func:`to_notebook` and run every cell in a fresh
    Python kernel (nbclient), in ``cwd`` (default: the lesson's folder); returns the executed
    notebook (outputs filled in). The lesson finds its own folder wherever ``cwd`` is
    (:func:`script_dir`), as a script does: lessons that start themselves in a child process
    or write to ``tutorial-output/`` by default work from any ``cwd``.

    Raises:
        miniflow.extras.MissingExtraError: jupytext, nbclient or ipykernel is not installed.
        nbclient.exceptions.CellExecutionError: a cell raised (naming the cell and the error).
    """
    nbclient = require("nbclient", "notebook", "miniflow.notebook")
    require("ipykernel", "notebook", "miniflow.notebook")
    nb = to_notebook(path)
    lesson_dir = os.fspath(Path(path).resolve().parent)
    folder = os.fspath(cwd or lesson_dir)
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                     resources={"metadata": {"path": folder}})
    client.execute(env={**os.environ, LESSON_DIR: lesson_dir})
    return nb


def cell_text(cell) -> str:
    """The text a code cell showed: its streams, plain-text results and HTML results."""
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out["text"])
        for kind in ("text/plain", "text/html"):
            if kind in out.get("data", {}):
                parts.append(out["data"][kind])
    return "".join(parts)
