"""Shared pytest setup: hypothesis profile sized for a 2-core CI machine; the CUDA simulator lane;
how pytest-xdist (``-n auto``) shares the tests out: the longest first, some modules on one worker.

``tests/cuda`` must run in its own process with ``NUMBA_ENABLE_CUDASIM=1`` set before numba is
imported. A session collects it only when it is named on the command line
(``NUMBA_ENABLE_CUDASIM=1 python -m pytest tests/cuda``); the main session runs it in subprocesses
(``test_cuda_simulator_lane.py``) and prints their summary lines at the end.
"""
import os
from pathlib import Path

import pytest
from hypothesis import settings

# The kernel-choice tests (tests/test_tune.py) measure with a fake timer; everywhere else the
# plans take the built-in rules' kernels, so no test depends on how fast this machine runs them
# (and none writes to the user's tuning file).
os.environ.setdefault("MINIFLOW_MATMUL", "numba")

# OpenBLAS's idle worker threads spin for 2**28 cycles (about 0.1 s) after every call before they
# sleep (its THREAD_TIMEOUT). With two test processes on two cores (-n auto), each one's spinning
# BLAS thread takes the core the other process needs: tests/test_cnn.py + test_accumulation.py took
# 28.9 s of user CPU and 16.8 s wall at the default, 12.0 s and 7.0 s at 2**4 cycles (Intel Xeon,
# 2 cores). The timeout changes only how long an idle thread waits, never a result. Set here, before
# any test imports NumPy, so the xdist workers and every subprocess (CLI runs, mpiexec jobs, the
# simulator lane) inherit it; OpenBLAS reads it once, when it loads.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
# The same for Numba's parallel kernels (the tests that run them with BLAS on one thread): Numba's
# threading layer here is OpenMP (GNU libgomp), whose idle threads spin after every parallel
# region before they sleep. Passive threads sleep at once: tests/test_conv.py's parallel variants,
# test_kernels_cpu_paths.py and test_pool.py took 8.8 s of CPU with a warm cache, 7.2 s passive
# (medians of 6, Intel Xeon, 2 cores). Only how an idle thread waits changes, never a result;
# libgomp reads it when it loads, at the first parallel kernel.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

settings.register_profile("ci", max_examples=25, deadline=None)
settings.register_profile("dev", max_examples=10, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

CUDA_LANE = Path(__file__).resolve().parent / "cuda"


def _inside_lane(path: Path) -> bool:
    return path == CUDA_LANE or CUDA_LANE in path.parents


def pytest_ignore_collect(collection_path, config):
    if _inside_lane(Path(collection_path).resolve()):
        here = config.invocation_params.dir
        asked = any(_inside_lane((here / str(a).split("::")[0]).resolve()) for a in config.args)
        return None if asked else True
    return None


LONGEST_FIRST = ("tests/test_train_cnn.py::test_resnet18_reaches_98_percent",
                 "tests/test_cuda_simulator_lane.py::",
                 "tests/test_isa_lane.py::test_kernels_compiled_for_another_cpu",
                 "tests/test_gpu_check.py::test_gpu_check_runs_end_to_end",
                 "tests/test_stability.py::",
                 "tests/test_conv.py::test_parallel_variants",
                 "tests/test_tutorials.py::test_tutorial_runs")
"""Node-id prefixes of the longest tests, longest first, which run before every other test
(seconds of wall time in a fresh clone's ``-n auto`` run, Intel Xeon, 2 cores): the ResNet-18
training runs (float32 once, float16, bfloat16: 311 s), the simulator lane's shards (53-74 s each),
the ISA lanes (50 s, 38 s), ``benchmarks/gpu_check.py`` under the simulator (46 s), the quick
stability study (its fixture 42 s), the parallel convolution kernels (18 s) and the lessons (each
in a subprocess, up to 18 s)."""


ONE_WORKER = {"tests/test_distributed.py": "mpi", "tests/test_data_parallel.py": "mpi",
              "tests/test_amp_training.py": "amp_training",
              "tests/test_cuda_host_path.py": "cuda_host_path", "tests/test_fp16.py": "fp16",
              "tests/test_loss_scale.py": "loss_scale", "tests/test_stability.py": "stability",
              "tests/test_train_cnn.py": "train_cnn"}
"""Test module -> the group whose tests one pytest-xdist worker runs, one after another: the
modules that start ``mpiexec -n 2`` jobs (two jobs at once beside the other worker would
oversubscribe a 2-core machine and push them past their timeouts), and modules whose expensive
module-scoped fixture or cached run (training runs, the quick stability study, a stub-GPU
subprocess, uncached test loops, the float32 LeNet and ResNet-18 runs that each AMP test compares
with) serves several tests, computed once instead of once per worker."""


@pytest.hookimpl(optionalhook=True)      # a hook of pytest-xdist, when it is installed
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's ``load`` scheduling, except that the tests of each :data:`ONE_WORKER` group
    go to one worker as one unit (the ``loadgroup`` idea by module: xdist 3.8's ``xdist_group``
    marks have no effect under pytest 9.2, whose node ids cannot be renamed; pytest-xdist issue
    1386). Other ``--dist`` modes are left to pytest-xdist."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling
    # Units in the order pytest_collection_modifyitems gives them (a group at its first test),
    # not LoadScopeScheduling's default, most tests first, which put every group before
    # LONGEST_FIRST.
    config.option.loadscopereorder = False

    class OneWorkerGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return ONE_WORKER.get(nodeid.split("::", 1)[0], nodeid)

    return OneWorkerGroups(config, log)


def _rank(nodeid: str) -> int:
    """Where a test runs (:func:`pytest_collection_modifyitems`): the index of its
    :data:`LONGEST_FIRST` prefix, then the :data:`ONE_WORKER` groups, then the rest."""
    for k, prefix in enumerate(LONGEST_FIRST):
        if nodeid.startswith(prefix):
            return k
    return len(LONGEST_FIRST) + (nodeid.split("::", 1)[0] not in ONE_WORKER)


def pytest_collection_modifyitems(config, items):
    """Run :data:`LONGEST_FIRST` first, in its order, then the :data:`ONE_WORKER` groups, then
    the rest, each part in collection order: pytest-xdist's workers take the units (a test, or a
    group) in this order, and a long unit taken last keeps one worker busy while the other idles
    (longest processing time first)."""
    items[:] = sorted(items, key=lambda item: _rank(item.nodeid))


def pytest_terminal_summary(terminalreporter, config):
    """Print the ``lane_summary`` lines tests recorded (``record_property``: the simulator lane's
    results), which reach the controller from pytest-xdist's workers with their reports."""
    for reports in terminalreporter.stats.values():
        for report in reports:
            for name, line in getattr(report, "user_properties", ()):
                if name == "lane_summary" and getattr(report, "when", None) == "call":
                    terminalreporter.write_line(line)
