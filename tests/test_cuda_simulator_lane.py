"""Runs the CUDA simulator lane (``tests/cuda``) in its own process, so that one command,
``python -m pytest -q``, runs every lane: ``NUMBA_ENABLE_CUDASIM`` must be set before numba is
imported, which this process has already done without it."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from numba import config

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 1800
"""A hang becomes a failure well inside CI's 90 minutes; the lane (about 1,070 kernel cases since
bfloat16) took 525 s on 2 cores at load 11-15."""


@pytest.mark.cuda_sim
@pytest.mark.slow
@pytest.mark.skipif(config.ENABLE_CUDASIM, reason="already under the simulator: run tests/cuda")
def test_cuda_simulator_lane(lane_summary):
    env = {k: v for k, v in os.environ.items() if k != "MINIFLOW_BACKEND"}
    env["NUMBA_ENABLE_CUDASIM"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pytest", "tests/cuda", "-q", "-p",
                        "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=TIMEOUT_S)
    lines = r.stdout.strip().splitlines() or [""]
    lane_summary.append(f"CUDA simulator lane (tests/cuda, own process, "
                        f"{time.perf_counter() - t0:.0f} s): {lines[-1].strip('= ')}")
    assert r.returncode == 0, f"simulator lane failed (exit {r.returncode}):\n" \
                              f"{r.stdout[-8000:]}\n{r.stderr[-4000:]}"
