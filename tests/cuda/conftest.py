"""The CUDA lane: every CUDA kernel against the CPU kernel, run under numba's CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``) or on a real GPU (``benchmarks/gpu_check.py``).

The simulator must be switched on before numba is imported, so this lane runs in its own process:

    NUMBA_ENABLE_CUDASIM=1 python -m pytest tests/cuda -q

(the main suite does that for you: ``tests/test_cuda_simulator_lane.py``, in shards:
``MINIFLOW_CUDA_LANE_SHARD=i/n`` keeps the i-th of n shards, 0-based: :func:`_shard_of`).
"""
import os
from collections import Counter

import pytest
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


def _op(item) -> str | None:
    """The op of a kernel case (its ``case`` parameter), None for any other test."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return getattr(params.get("case"), "op", None)


def _shard_of(items: list, count: int) -> list:
    """The shard of each item: the cases of one op all in one shard (its CPU oracle's kernels,
    one signature per dtype and rank, compile once, not once in each shard that runs at the same
    time), ops dealt largest first to the shard with the fewest cases so far; every other test
    dealt in turn. The four shards, two at a time, cold cache: 119 s of wall and 168 s of CPU,
    against 137 and 198 s with every fourth case in each shard (AMD Zen 4, 2 cores)."""
    ops = Counter(op for op in map(_op, items) if op is not None)
    load, home = [0] * count, {}
    for op, n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])):
        home[op] = min(range(count), key=load.__getitem__)
        load[home[op]] += n
    shards, others = [], 0
    for item in items:
        op = _op(item)
        if op is None:
            shards.append(others % count)
            others += 1
        else:
            shards.append(home[op])
    return shards


def pytest_collection_modifyitems(config, items):
    """Keep the shard's cases (:func:`_shard`, :func:`_shard_of`)."""
    shard = _shard()
    if shard is None:
        return
    index, count = shard
    shards = _shard_of(items, count)
    config.hook.pytest_deselected(items=[item for item, s in zip(items, shards) if s != index])
    items[:] = [item for item, s in zip(items, shards) if s == index]
