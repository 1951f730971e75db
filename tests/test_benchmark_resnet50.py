"""A one-step smoke run of ``benchmarks/resnet50.py`` at a small input shape (the benchmark itself
is not part of the tests): it trains, prints OneFlow's CI lines in their exact format, and, with
PyTorch installed, PyTorch's line and the relative speed, from the same weights (equal first
losses)."""
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import resnet50  # noqa: E402

try:
    import torch  # noqa: F401
except ImportError:
    torch = None

LINE = r"{name} resnet50 time: (\d+\.\d)ms \(= (\d+\.\d)ms / 1, input_shape=\[2, 3, 64, 64\]\)"


def _threads() -> tuple:
    """Numba's thread count and ``{path: thread count}`` of every BLAS / OpenMP library loaded
    (threadpoolctl)."""
    import numba
    from threadpoolctl import threadpool_info

    import miniflow.kernels.cpu  # noqa: F401  (first: it picks Numba's threading layer)
    return numba.get_num_threads(), {i["filepath"]: i["num_threads"] for i in threadpool_info()}


@pytest.mark.parametrize("dtype", ["fp32", "amp"])
def test_one_step_at_a_small_input_shape(dtype, capsys):
    """The run pins every pool to ``--threads 1`` and gives the caller's counts back at the end
    (before: this process's Numba and BLAS stayed on one thread, and a later test in the same
    pytest worker ran no parallel kernel)."""
    args = ["--batch", "2", "--times", "1", "--warmup", "1", "--image-size", "64", "--dtypes",
            dtype, "--threads", "1", "--no-save"] + ([] if torch is not None else ["--no-torch"])
    numba_before, libs_before = _threads()
    assert resnet50.main(args) == 0
    numba_after, libs_after = _threads()
    assert numba_after == numba_before
    assert {path: libs_after[path] for path in libs_before} == libs_before
    out = capsys.readouterr().out
    mine = re.search(LINE.format(name="miniflow"), out)
    assert mine and mine.group(1) == mine.group(2), out
    losses = re.search(r"first losses: miniflow (\d+\.\d+)(?:, PyTorch (\d+\.\d+))?", out)
    assert losses and 5.0 < float(losses.group(1)) < 10.0, out     # ~ log(1000) at the start
    if torch is None:
        return
    theirs = re.search(LINE.format(name="PyTorch"), out)
    rel = re.search(r"Relative speed: (\d+\.\d\d) \(= (\d+\.\d)ms / (\d+\.\d)ms\)", out)
    assert theirs and rel and rel.group(2) == theirs.group(1) and rel.group(3) == mine.group(1)
    tol = 1e-3 if dtype == "fp32" else 5e-2        # float16 activations under AMP
    assert abs(float(losses.group(1)) - float(losses.group(2))) < tol * float(losses.group(2))
