"""The CUDA simulator's ``cuda.shared.array`` made thread-safe (``kernels.cuda.simulator``):
with a thread switch forced between each simulated thread's lookup of the call site and its store
(what CPython's switch interval does now and then on a loaded machine), a block still gets one
shared array per site, and the tiled matmul still gives the gradients finite differences give."""
import threading
import time

import numpy as np
import pytest
from numba import config, cuda

import miniflow as mf
from miniflow.kernels.cuda import simulator
from miniflow.testing import check_grad

pytestmark = pytest.mark.skipif(not config.ENABLE_CUDASIM,
                                reason="numba's CUDA simulator only (a GPU has no such race)")


def _patch_allocations(monkeypatch, after_lookup) -> list:
    """Every launch's shared-array dict calls ``after_lookup()`` after each lookup (where another
    simulated thread may run); returns the list of call sites stored, one entry per store."""
    from numba.cuda.simulator import kernelapi
    stores = []

    class Patched(dict):
        def get(self, key, default=None):
            found = super().get(key, default)
            after_lookup()
            return found

        def __setitem__(self, key, value):
            stores.append(key)
            super().__setitem__(key, value)

    init = kernelapi.FakeCUDAShared.__init__

    def patched_init(self, *args):
        init(self, *args)
        self._allocations = Patched()

    monkeypatch.setattr(kernelapi.FakeCUDAShared, "__init__", patched_init)
    return stores


@pytest.fixture
def interleaved(monkeypatch):
    """Every lookup yields to the other simulated threads (1 ms); the list of stores."""
    return _patch_allocations(monkeypatch, lambda: time.sleep(1e-3))


@cuda.jit
def _block_sum(out):
    sm = cuda.shared.array(4, np.float64)
    t = cuda.threadIdx.x
    sm[t] = t + 1.0
    cuda.syncthreads()
    out[t] = sm[0] + sm[1] + sm[2] + sm[3]


def test_a_block_gets_one_shared_array_per_site_when_threads_interleave(interleaved):
    out = np.zeros(4)
    _block_sum[1, 4](out)
    assert len(interleaved) == 1, f"{len(interleaved)} arrays stored for one call site"
    np.testing.assert_array_equal(out, [10.0] * 4)


def test_the_simulators_own_shared_array_races_when_threads_interleave(monkeypatch):
    """Without the fix, a block whose 4 threads all look the site up before any stores (a barrier
    after the lookup makes that interleaving certain, whatever the machine's load) gets an array
    per thread (so the test above can fail)."""
    from numba.cuda.simulator import kernelapi
    simulator.install()                         # (a no-op: importing miniflow's kernels did it)
    after_lookup = threading.Barrier(4, timeout=30)  # every thread looks up before any stores
    stores = _patch_allocations(monkeypatch, after_lookup.wait)
    monkeypatch.setattr(kernelapi.FakeCUDAShared, "array", simulator._ORIGINAL[0])
    _block_sum[1, 4](np.zeros(4))
    assert len(stores) == 4, f"{len(stores)} arrays stored for one call site by 4 threads"


@pytest.mark.parametrize("transpose_b", [False, True])
def test_tiled_matmul_gradients_with_interleaved_threads(interleaved, transpose_b):
    """The lane's flaky case (finite differences 133868 against -0.546 once): the tiled matmul's
    two shared tiles under a thread switch after every lookup."""
    mf.set_backend("cuda")
    rng = np.random.default_rng(0)
    b = rng.uniform(-1, 1, (2, 3) if transpose_b else (3, 2))
    check_grad("matmul", [rng.uniform(-1, 1, (2, 3)), b], {"transpose_b": transpose_b})
    assert interleaved
