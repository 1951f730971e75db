"""Backend selection without a GPU: the default is cpu, ``MINIFLOW_BACKEND=cuda`` is a clear error
(no driver traceback), ``MINIFLOW_BACKEND`` in any case, a bad name is an error naming the variable,
``miniflow info`` reports versions and the GPU."""
import os
import subprocess
import sys

import pytest

import miniflow as mf
from miniflow.runtime.backend import (BackendUnavailableError, UnknownBackendError, cuda_status,
                                      default_backend_name)

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


@pytest.mark.parametrize("value,name", [("CPU", "cpu"), (" Cuda ", "cuda"), ("cpu\n", "cpu")])
def test_miniflow_backend_accepts_any_case_and_spaces(value, name, monkeypatch):
    monkeypatch.setenv("MINIFLOW_BACKEND", value)
    assert default_backend_name() == name


def test_bad_miniflow_backend_names_the_variable_and_the_valid_values(monkeypatch):
    monkeypatch.setenv("MINIFLOW_BACKEND", "gpu")
    with pytest.raises(UnknownBackendError, match=r"MINIFLOW_BACKEND='gpu' is not a backend; set "
                       r"it to one of cpu, cuda \(any case\), or unset it"):
        default_backend_name()


@pytest.mark.parametrize("name", ["gpu", "CPU", None, ["cpu"]])
def test_set_backend_unknown_name_lists_the_valid_ones(name):
    with pytest.raises(UnknownBackendError, match=r"set_backend: unknown backend .*; choose one "
                       r"of 'cpu', 'cuda'"):
        mf.set_backend(name)
    assert issubclass(UnknownBackendError, ValueError)


def test_train_with_a_bad_miniflow_backend_is_one_line_and_exit_2():
    r = _cli("train", "--epochs", "1", MINIFLOW_BACKEND="gpu")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "miniflow: MINIFLOW_BACKEND='gpu' is not a backend; set it to one of cpu, cuda (any case), "
        "or unset it to use cuda when a GPU is usable, else cpu"]
