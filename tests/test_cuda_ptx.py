"""PTX lane: every CUDA kernel compiled to PTX with ``numba.cuda.compile_ptx`` for compute
capability 7.5 and 9.0, for every signature the simulator lane launches it with.

The CUDA simulator runs kernels as Python, so it accepts code real CUDA rejects (atomics on
float16, NumPy-style float16 promotion, unsupported math); this lane compiles the real thing. It
needs no GPU, only numba-cuda's ``cu12`` extra (NVVM and libdevice); it is skipped when that is
missing, except under CI, which installs it (``.[dev]``) and fails instead.

Signatures come from ``cuda_cases``: the CUDA builders run on host stand-in arrays for exactly the
simulator lane's cases and training graphs (``case_signatures(all_cases())``,
``training_signatures()``). The kernels are the GPU launch preset's
(block sizes and the matmul tile are closure constants of the kernels).

Device functions (``cuda.jit(device=True)``) are compiled by numba-cuda for "the current device",
which needs a driver; without a GPU the test stands in a compute-capability-7.5 device for them.
Their LLVM IR is linked into each kernel. Each kernel goes through Numba's front end (typing and
lowering to LLVM IR, about 80% of ``compile_ptx``'s time) once, for 7.5, and NVVM compiles that IR
to PTX for each compute capability (:func:`_ptx_for_each_cc`): for these two the front end reads
the compute capability only where both take the same branch (numba-cuda 0.30: atomics from 6.0,
the fast-math ``tanh`` from 7.5), which
:func:`test_one_front_end_gives_the_ptx_of_a_compile_for_each_cc` checks on a sample of kernels.
"""
import os
import re

import pytest
from numba import config

from miniflow.kernels import cpu
from miniflow.kernels.cuda.launch import GPU, SIMULATOR, use_config
from miniflow.ops import all_ops

from cuda_cases import (HOST_STEP_OPS, all_cases, case_signatures, fused_signatures,
                        ptx_unavailable, training_signatures)

CCS = [(7, 5), (9, 0)]
HALF_MATH = re.compile(r"\b(add|sub|mul|div|fma|neg|abs|max|min|ex2|sqrt|rcp)(\.[a-z0-9]+)*"
                       r"\.f16x?2?\b|\b_Z\w*6__half\w*")
"""Float16 arithmetic in PTX: an ``.f16`` instruction, or a call to a ``cuda_fp16`` operator on
``__half`` (how numba-cuda lowers float16 math). Loads, stores and ``cvt`` conversions are fine."""
NUMBERED = re.compile(r"\b(_Z\w+|_cudapy_smem_\d+)\b")
"""A name numbered per compilation in PTX: a mangled (Itanium ABI) symbol, a shared array."""


REASON = ptx_unavailable(CCS[0])
if REASON is not None and not config.ENABLE_CUDASIM and os.environ.get("CI"):
    raise RuntimeError(f"PTX lane cannot run under CI: {REASON}")
pytestmark = [pytest.mark.ptx, pytest.mark.slow,
              pytest.mark.skipif(REASON is not None, reason=str(REASON))]

with use_config(GPU):
    SIGNATURES = {**case_signatures(all_cases(SIMULATOR)), **fused_signatures(SIMULATOR),
                  **training_signatures()} if REASON is None else {}
KEYS = list(SIGNATURES)
SAMPLE = KEYS[::20]
"""The kernels :func:`test_one_front_end_gives_the_ptx_of_a_compile_for_each_cc` also compiles
for each compute capability from the start (every 20th)."""


class _StandInDevice:
    compute_capability = CCS[0]


@pytest.fixture(scope="module", autouse=True)
def _stand_in_device():
    import numba.cuda.dispatcher as dispatcher
    mp = pytest.MonkeyPatch()
    mp.setattr(dispatcher, "get_current_device", lambda: _StandInDevice)
    yield
    mp.undo()


def _id(key):
    py_func, sig = key
    args = ",".join(str(t).replace("array(", "").replace(", 1d, C)", "[]") for t in sig)
    return f"{SIGNATURES[key]}({args})"


def _ptx_for_each_cc(py_func, sig) -> dict:
    """``{cc: PTX}`` of the kernel ``py_func`` for the argument types ``sig``, for every ``cc`` of
    :data:`CCS`: what ``numba.cuda.compile_ptx(py_func, sig, cc=cc)`` does, with its front end
    run once, for the first (numba-cuda's ``compile``: ``_compile_pyfunc_with_fixup``, then
    NVVM per compute capability through the code library's ``get_asm_str(cc=)``)."""
    from numba.cuda.compiler import _compile_pyfunc_with_fixup
    from numba.cuda.core.compiler_lock import global_compiler_lock
    with global_compiler_lock:
        lib, _ = _compile_pyfunc_with_fixup(py_func, sig, device=False, abi="numba", cc=CCS[0])
        return {cc: lib.get_asm_str(cc=cc) for cc in CCS}


@pytest.mark.parametrize("key", KEYS, ids=[_id(k) for k in KEYS])
def test_kernel_compiles_to_ptx(key):
    for cc, ptx in _ptx_for_each_cc(*key).items():
        assert f".target sm_{cc[0]}{cc[1]}" in ptx
        assert "atom." not in ptx, "kernels use no atomics (reductions go through shared memory)"
        half_math = HALF_MATH.search(ptx)
        assert half_math is None, f"float16 arithmetic ({half_math.group(0)}) for " \
                                  f"sm_{cc[0]}{cc[1]}: compute in float32"


def _unnamed(ptx: str) -> str:
    """``ptx`` with each :data:`NUMBERED` name replaced by its rank of first appearance: a symbol
    carries a per-compilation counter and an ABI tag of the compile flags (the compute capability
    among them), a shared array a counter, which differ between two compilations of the same code."""
    names = {}
    return NUMBERED.sub(lambda m: f"sym{names.setdefault(m.group(0), len(names))}", ptx)


def test_one_front_end_gives_the_ptx_of_a_compile_for_each_cc():
    """:func:`_ptx_for_each_cc` gives, for every compute capability, the PTX of a whole
    ``compile_ptx`` for it (on :data:`SAMPLE`, symbol names aside: :func:`_unnamed`): the front end
    takes no branch on the compute capability between those of :data:`CCS`."""
    from numba import cuda
    for key in SAMPLE:
        shared = _ptx_for_each_cc(*key)
        for cc in CCS:
            whole = cuda.compile_ptx(*key, cc=cc)[0]
            assert _unnamed(whole) == _unnamed(shared[cc]), f"{_id(key)} for sm_{cc[0]}{cc[1]}"


def test_every_op_is_compiled():
    """Every op with a CPU kernel launches at least one CUDA kernel in the cases compiled here
    (but those whose CUDA steps are host steps)."""
    from miniflow.kernels import cuda
    with_cpu = {name for name, op in all_ops().items() if cpu.builder_for(op) is not None}
    missing = sorted(name for name in with_cpu if cuda.builder_for(all_ops()[name]) is None)
    assert not missing, f"ops with a CPU kernel but no CUDA kernel: {missing}"
    no_samples = sorted(n for n, d in all_ops().items() if not (d.samples and d.samples()))
    assert not no_samples, f"ops without samples: {no_samples}; register samples= in miniflow/ops"
    with use_config(GPU):
        launched = {c.op for c in all_cases(SIMULATOR) if case_signatures([c])}
    assert launched >= with_cpu - set(HOST_STEP_OPS), \
        f"never launched: {sorted(with_cpu - launched - set(HOST_STEP_OPS))}"
    assert not launched & set(HOST_STEP_OPS)


def test_gpu_sized_cases_add_no_signature():
    """The GPU-sized cases (benchmarks/gpu_check.py runs them) add no signature to compile."""
    with use_config(GPU):
        gpu = case_signatures(all_cases(GPU))
    extra = sorted(f"{name}{key[1]}" for key, name in gpu.items() if key not in SIGNATURES)
    assert not extra, f"add cases with these signatures to tests/cuda_cases.py: {extra}"


def _fmas(ptx: str) -> list:
    return re.findall(r"\bfma(\.[a-z0-9]+)*\.f(32|64)\b", ptx)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fused_multiply_add_chain_is_not_contracted(dtype):
    """``add(mul(x0, x1), x2)``: the unfused graph rounds the product before the add (two
    kernels), so the fused kernel must not compute it as one FMA (one rounding). The same
    arithmetic written plainly is contracted by NVVM: the control shows this test sees an FMA."""
    from numba import cuda, types
    from miniflow.dtype import as_dtype
    from miniflow.kernels.cuda.fused import _kernel
    kernel, _ = _kernel("add(mul(x0, x1), x2)", (as_dtype(dtype),) * 3, ("full",) * 3, False)
    t = getattr(types, dtype)[::1]
    ptx, _ = cuda.compile_ptx(kernel.py_func, (t, t, t, t, types.int64), cc=CCS[1])
    assert f"mul.rn.f{dtype[-2:]}" in ptx or f"mul.f{dtype[-2:]}" in ptx
    assert not _fmas(ptx), f"fused kernel contracts mul+add into an FMA: {_fmas(ptx)}"

    def plain(x0, x1, x2, out, n):
        i = cuda.grid(1)
        if i < n:
            out[i] = x0[i] * x1[i] + x2[i]

    control, _ = cuda.compile_ptx(plain, (t, t, t, t, types.int64), cc=CCS[1])
    assert _fmas(control), "NVVM no longer contracts a*b+c: this test would not see an FMA"
