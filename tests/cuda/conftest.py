"""The CUDA lane: every CUDA kernel against the CPU kernel, run under numba's CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``) or on a real GPU (``benchmarks/gpu_check.py``).

The simulator must be switched on before numba is imported, so this lane runs in its own process:

    NUMBA_ENABLE_CUDASIM=1 python -m pytest tests/cuda -q

(the main suite does that for you: ``tests/test_cuda_simulator_lane.py``).
"""
import pytest
from miniflow.runtime.backend import cuda_status

_USABLE, _WHAT = cuda_status()
if not _USABLE:
    pytest.exit(f"tests/cuda needs the CUDA simulator or a GPU ({_WHAT}); run it as "
                f"NUMBA_ENABLE_CUDASIM=1 python -m pytest tests/cuda -q", returncode=4)



def pytest_configure(config):
    # Simulated threads compute with NumPy scalars: float16 overflow and 0/0 warn there (the results
    # are the IEEE ones the GPU gives); the samples themselves overflow to inf on purpose.
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning")
