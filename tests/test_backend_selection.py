"""Backend selection without a GPU: the default is cpu, ``MINIFLOW_BACKEND=cuda`` is a clear error
(no driver traceback), ``miniflow info`` reports versions and the GPU."""
import os
import subprocess
import sys

import pytest

import miniflow as mf
from miniflow.runtime.backend import BackendUnavailableError, cuda_status, default_backend_name

HAS_GPU = cuda_status()[0]
no_gpu = pytest.mark.skipif(HAS_GPU, reason="a CUDA device is present")


def _cli(*args, **env):
    full = {k: v for k, v in os.environ.items() if k != "MINIFLOW_BACKEND"}
    full.update(env)
    return subprocess.run([sys.executable, "-m", "miniflow", *args], capture_output=True, text=True,
                          env=full, timeout=300)


@no_gpu
def test_default_backend_is_cpu_without_a_gpu(monkeypatch):
    monkeypatch.delenv("MINIFLOW_BACKEND", raising=False)
    assert default_backend_name() == "cpu"


@no_gpu
def test_set_backend_cuda_without_a_gpu_says_what_to_do():
    expected = r"no CUDA device was found.*MINIFLOW_BACKEND=cpu.*set_backend\('cpu'\)"
    with pytest.raises(BackendUnavailableError, match=expected):
        mf.set_backend("cuda")
    assert mf.get_backend().name == "cpu"


@no_gpu
def test_miniflow_backend_cuda_without_a_gpu_is_a_message_not_a_traceback():
    r = _cli("train", "--epochs", "1", MINIFLOW_BACKEND="cuda")
    assert r.returncode == 2
    assert "no CUDA device was found" in r.stderr and "MINIFLOW_BACKEND=cpu" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_info_reports_versions_gpu_and_cache():
    r = _cli("info")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "numba-cuda" in out and "backend: " in out and "kernels from the Numba cache: " in out
    assert ("GPU: no GPU (" in out) != HAS_GPU
