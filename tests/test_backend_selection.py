"""Backend selection without a GPU: the default is cpu, ``MINIFLOW_BACKEND=cuda`` is a clear error
(no driver traceback), ``MINIFLOW_BACKEND`` in any case, a bad name is an error naming the variable,
``miniflow info`` reports versions and the GPU."""
import os
import subprocess
import sys

import pytest

import miniflow as mf
from miniflow.environment import EnvironmentValueError
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


def test_without_a_driver_library_no_process_imports_numba_cuda_to_pick_cpu():
    """``cuda_status`` first tries the driver libraries numba-cuda would load
    (``backend._DRIVER_LIBRARIES``, its ``locate_driver_and_loader``); where none loads it gives
    numba-cuda's own reason, and a process picks the cpu backend and trains without importing
    ``numba.cuda`` (0.3 s) or, through it, ``ml_dtypes`` (0.6 s more)."""
    pytest.importorskip("numba_cuda")
    from numba import cuda
    from numba.cuda.cudadrv import driver

    from miniflow.runtime import backend
    assert backend.NO_DRIVER == " ".join(driver.DRIVER_NOT_FOUND_MSG.split())
    if sys.platform.startswith("linux"):
        assert tuple(driver.locate_driver_and_loader()[1]) == backend._DRIVER_LIBRARIES
    if not backend._no_driver_library():
        pytest.skip("a CUDA driver library loads here")
    assert not cuda.is_available() and cuda_status() == (False, backend.NO_DRIVER)
    script = ("import sys, numpy as np, miniflow as mf\n"
              "from miniflow.experiments.mlp import TrainGraph, mlp\n"
              "m = mlp((4, 8, 3))\n"
              "g = TrainGraph(m, mf.optim.SGD(m.parameters(), lr=0.1))\n"
              "g(mf.tensor(np.ones((2, 4), np.float32)), mf.tensor(np.array([0, 2])))\n"
              "print(mf.get_backend().name, 'numba.cuda' in sys.modules, 'ml_dtypes' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "MINIFLOW_BACKEND"}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["cpu", "False", "False"], r.stdout


@pytest.mark.parametrize("value,name", [("CPU", "cpu"), (" Cuda ", "cuda"), ("cpu\n", "cpu")])
def test_miniflow_backend_accepts_any_case_and_spaces(value, name, monkeypatch):
    monkeypatch.setenv("MINIFLOW_BACKEND", value)
    assert default_backend_name() == name


def test_bad_miniflow_backend_names_the_variable_and_the_valid_values(monkeypatch):
    monkeypatch.setenv("MINIFLOW_BACKEND", "gpu")
    with pytest.raises(EnvironmentValueError, match=r"^miniflow: MINIFLOW_BACKEND='gpu' is not one "
                       r"of cpu, cuda \(any case\): .* unset, cuda when a GPU is usable"):
        default_backend_name()
    assert issubclass(EnvironmentValueError, ValueError)


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
        "miniflow: MINIFLOW_BACKEND='gpu' is not one of cpu, cuda (any case): the backend graphs "
        "and eager ops run on; unset, cuda when a GPU is usable, else cpu"]


def test_backend_flag_cuda_without_a_gpu_names_the_flag_not_the_variable(monkeypatch):
    """``miniflow train --backend cuda`` without a GPU said "Use the cpu backend: unset
    MINIFLOW_BACKEND or set MINIFLOW_BACKEND=cpu", a variable the user had not set; the error
    names the flag and its cpu value (MINIFLOW_BACKEND=cuda keeps the variable's advice)."""
    import miniflow.runtime.backend as backend
    from miniflow.cli import choose_backend
    monkeypatch.delenv("MINIFLOW_BACKEND", raising=False)
    monkeypatch.setattr(backend, "cuda_status", lambda: (False, "no driver"))
    with pytest.raises(BackendUnavailableError) as info:
        choose_backend("train", "cuda")
    message = str(info.value)
    assert message.startswith("miniflow train: --backend cuda, but no CUDA device was found "
                              "(no driver); give --backend cpu, or leave --backend out")
    assert "MINIFLOW_BACKEND" not in message and mf.get_backend().name == "cpu"
    monkeypatch.setenv("MINIFLOW_BACKEND", "cuda")
    with pytest.raises(BackendUnavailableError, match="MINIFLOW_BACKEND=cpu"):
        choose_backend("train", None)


def test_cuda_is_available_says_whether_this_process_runs_on_cuda():
    """The PyTorch MNIST example's ``use_cuda = torch.cuda.is_available()`` then
    ``torch.device("cuda" if use_cuda else "cpu")`` (``miniflow.cuda`` was missing): True on
    the CUDA backend only, so the device it picks is always the process's."""
    import miniflow as mf
    on_cuda = mf.get_backend().name == "cuda"
    assert mf.cuda.is_available() is on_cuda and mf.cuda.device_count() == int(on_cuda)
    device = mf.device("cuda" if mf.cuda.is_available() else "cpu")
    assert mf.zeros(2, device=device).device.type == device.type   # cuda:0 on cuda, as torch
