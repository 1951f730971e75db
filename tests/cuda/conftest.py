"""The CUDA lane: every CUDA kernel against the CPU kernel, run under numba's CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``) or on a real GPU (``benchmarks/gpu_check.py``).

The simulator must be switched on before numba is imported, so this lane runs in its own process:

    NUMBA_ENABLE_CUDASIM=1 python -m pytest tests/cuda -q

(the main suite does that for you: ``tests/test_cuda_simulator_lane.py``, in shards:
``MINIFLOW_CUDA_LANE_SHARD=i/n`` keeps every n-th case of the collection from the i-th, 0-based).
"""
import os

import pytest
from numba import config
from miniflow.runtime.backend import cuda_status

_USABLE, _WHAT = cuda_status()
if not _USABLE:
    pytest.exit(f"tests/cuda needs the CUDA simulator or a GPU ({_WHAT}); run it as "
                f"NUMBA_ENABLE_CUDASIM=1 python -m pytest tests/cuda -q", returncode=4)


def pytest_configure(config):
    _shard()                    # a bad MINIFLOW_CUDA_LANE_SHARD stops the session here
    # Simulated threads compute with NumPy scalars: float16 overflow and 0/0 warn there (the results
    # are the IEEE ones the GPU gives); the samples themselves overflow to inf on purpose.
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning")


def _shard() -> tuple[int, int] | None:
    """``(index, count)`` from ``MINIFLOW_CUDA_LANE_SHARD`` (``"i/n"``, ``0 <= i < n``); None when
    it is not set. Anything else stops the session with what was expected."""
    value = os.environ.get("MINIFLOW_CUDA_LANE_SHARD")
    if not value:
        return None
    try:
        index, count = (int(part) for part in value.split("/"))
    except ValueError:
        index, count = -1, 0
    if not 0 <= index < count:
        raise pytest.UsageError(f"MINIFLOW_CUDA_LANE_SHARD must be 'i/n' with 0 <= i < n, got "
                                f"{value!r}")
    return index, count


def pytest_collection_modifyitems(config, items):
    """Keep the shard's cases (:func:`_shard`): every n-th of the collection, from the i-th, so
    each shard gets a share of every test's parameters."""
    shard = _shard()
    if shard is None:
        return
    index, count = shard
    kept = items[index::count]
    config.hook.pytest_deselected(items=[item for k, item in enumerate(items)
                                         if k % count != index])
    items[:] = kept
