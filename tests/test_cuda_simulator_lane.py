"""Runs the CUDA simulator lane (``tests/cuda``) in processes of its own, so that one command, the
README's ``python -m pytest -q -n auto``, runs every lane: ``NUMBA_ENABLE_CUDASIM``
must be set before numba is imported, which this process has already done without it.

The lane runs as :data:`SHARDS` processes, one test each (``tests/cuda/conftest.py`` keeps the
shard's cases when ``MINIFLOW_CUDA_LANE_SHARD`` says ``"index/SHARDS"``: the cases of one op in one
shard, so its CPU oracle's kernels compile in one process): under pytest-xdist they overlap with
the rest of the suite and with each other instead of keeping one worker busy for the whole lane.
Together they run every case once.
"""
import subprocess
import sys
import time
from pathlib import Path

import pytest
from numba import config

from mpi_harness import child_env

ROOT = Path(__file__).resolve().parent.parent
SHARDS = 4
"""Processes the lane is split into (each collects the whole lane and runs a quarter of it)."""
TIMEOUT_S = 1800
"""A hang becomes a failure well inside CI's 90 minutes; the whole lane (about 1,070 kernel cases
since bfloat16) took 525 s in one process on 2 cores at load 11-15."""


@pytest.mark.cuda_sim
@pytest.mark.slow
@pytest.mark.skipif(config.ENABLE_CUDASIM, reason="already under the simulator: run tests/cuda")
@pytest.mark.parametrize("shard", range(SHARDS), ids=lambda i: f"shard{i}of{SHARDS}")
def test_cuda_simulator_lane(shard, record_property):
    # One thread per pool (``child_env``): the shards' CPU oracles share 2 cores with the other
    # test process, and no thread count changes a result (see tests/test_isa_lane.py's _env).
    env = {k: v for k, v in child_env().items() if k != "MINIFLOW_BACKEND"}
    env["NUMBA_ENABLE_CUDASIM"] = "1"
    env["MINIFLOW_CUDA_LANE_SHARD"] = f"{shard}/{SHARDS}"
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pytest", "tests/cuda", "-q", "-p",
                        "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=TIMEOUT_S)
    lines = r.stdout.strip().splitlines() or [""]
    record_property("lane_summary", f"CUDA simulator lane, shard {shard + 1} of {SHARDS} "
                                    f"(tests/cuda, own process, {time.perf_counter() - t0:.0f} s): "
                                    f"{lines[-1].strip('= ')}")
    assert r.returncode == 0, f"simulator lane shard {shard + 1} of {SHARDS} failed (exit " \
                              f"{r.returncode}):\n{r.stdout[-8000:]}\n{r.stderr[-4000:]}"
