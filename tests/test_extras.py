"""The optional extras (``miniflow.extras``, ``pyproject.toml``): the core install pulls none of
their packages, ``dev`` pulls all of them, and a feature without its extra fails with one sentence
naming it (PyTorch's and pandas' optional-dependency errors are the model:
``pandas.compat._optional.import_optional_dependency``)."""
import re
import sys
import tomllib
from pathlib import Path

import pytest

from miniflow.extras import MissingExtraError, require

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
TOOL_EXTRAS = ("onnx", "netron", "tensorboard", "notebook")


def _names(requirements) -> set:
    """The distribution names of requirement strings (``"onnx>=1.16,<2"`` -> ``"onnx"``)."""
    return {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower().replace("_", "-")
            for r in requirements}


def test_the_core_install_pulls_no_tool_package():
    extras = PYPROJECT["project"]["optional-dependencies"]
    tools = set().union(*(_names(extras[e]) for e in TOOL_EXTRAS))
    assert tools >= {"onnx", "onnxruntime", "netron", "tensorboardx", "tensorboard", "jupytext",
                     "nbclient", "ipykernel"}
    assert not tools & _names(PYPROJECT["project"]["dependencies"])
    assert {f"miniflow[{e}]" for e in TOOL_EXTRAS} <= set(extras["dev"])


def test_a_missing_package_names_its_extra_in_one_sentence(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(MissingExtraError) as e:
        require("tensorboardX", "tensorboard", "miniflow.logging")
    message = str(e.value)
    assert message.startswith("miniflow.logging needs the 'tensorboardX' package")
    assert 'pip install -e ".[tensorboard]"' in message and message.count(". ") == 0
    assert isinstance(e.value, ImportError)


def test_require_returns_the_module():
    assert require("json", "none", "a test") is sys.modules["json"]
