"""The kernel cases the ISA lane (``tests/test_isa_lane.py``) runs in every build and compares:
matmuls reaching every path of ``kernels.cpu.matmul`` (the register tile with rows and columns
past its blocks for 16-, 8- and 4-lane vectors and 4- and 6-row tiles, the transposed copies,
``dot_block_kernel``, ``rows_times_kernel``, BLAS, the non-finite count), convolutions under
im2col, and the half-type casts of every float16 and bfloat16 pattern; float32,
float16 and bfloat16.

``python tests/isa_cases.py OUT.npz`` writes every case's outputs and the kernels that made them
(the build's: ``NUMBA_CPU_NAME`` in its environment); :func:`run` gives the same in-process."""
from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from op_cases import Case, host_buffers, make_node, results  # noqa: E402

MATMULS = [
    # (m, k, n, transpose_a, transpose_b)
    (3, 300, 1000, False, True),        # dot_block_kernel (a forward at batch 3)
    (3, 1000, 300, False, False),       # rows_times_kernel
    (16, 300, 200, False, False),       # the register tile: input gradient
    (17, 64, 203, False, False),        # rows past the 4- and 6-row blocks; columns past tiles
    (23, 32, 136, False, False),        # 6-row blocks, then a block of 4, then one row
    (301, 13, 1100, True, False),       # a weight gradient dy.T @ x, past every block
    (1024, 256, 256, True, False),      # a big strided dy.T: copied first
    (19, 64, 128, False, True),         # a short k: W.T copied first
    (64, 32, 16, False, True),          # small: BLAS
]
CONVS = [
    # (n, c, h, w, o, kernel, stride, padding)
    (2, 3, 9, 8, 4, 3, 1, 1),
    (2, 4, 7, 7, 6, 1, 2, 0),
]
DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


def _step_names(steps) -> list:
    return [fn.py_func.__qualname__.split(".")[0] if hasattr(fn, "py_func")
            else getattr(fn, "__name__", type(fn).__name__).split()[0] for fn, _ in steps]


def _run_case(case: Case) -> tuple:
    """``(outputs, kernel names)`` of ``case`` on the CPU builders."""
    from miniflow.kernels import cpu
    node = make_node(case)
    ins, outs = host_buffers(case, node)
    steps = cpu.builder_for(node.op)(node, ins, outs)
    for fn, args in steps:
        fn(*args)
    return results(case, node, ins, outs), _step_names(steps)


def _cases():
    """``(name, Case, k)`` for every case (``k``: the length of each output's sums)."""
    r = np.random.default_rng(0)
    for (m, k, n, ta, tb) in MATMULS:
        a = r.uniform(-1, 1, (k, m) if ta else (m, k))
        b = r.uniform(-1, 1, (n, k) if tb else (k, n))
        for short, dt in DTYPES.items():
            attrs = {"transpose_a": ta, "transpose_b": tb}
            yield (f"matmul {m}x{k}x{n} ta={ta:d} tb={tb:d} {short}",
                   Case("matmul", [a.astype(dt), b.astype(dt)], attrs), k)
    a, b = r.uniform(-1, 1, (16, 300)), r.uniform(-1, 1, (300, 200))
    a[::7], b[:, ::5], a[3, 2], b[4, 9] = 300.0, 300.0, np.inf, np.nan
    for short, dt in DTYPES.items():
        yield (f"matmul counted 16x300x200 {short}",
               Case("matmul", [a.astype(dt), b.astype(dt)], {"count_not_finite": True}), 300)
    for (n, c, h, w, o, kk, s, p) in CONVS:
        x = r.uniform(-1, 1, (n, c, h, w))
        wt = r.uniform(-1, 1, (o, c, kk, kk))
        attrs = {"kernel_size": kk, "strides": s, "padding_before": p, "dilation_rate": 1,
                 "groups": 1}
        for short, dt in (("f32", np.float32), ("f16", np.float16)):
            yield (f"conv2d {n}x{c}x{h}x{w} o={o} k={kk} s={s} p={p} {short}",
                   Case("conv2d", [x.astype(dt), wt.astype(dt)], attrs), c * kk * kk)
    every = np.arange(65536, dtype=np.uint32)
    wide = np.concatenate([every.astype(np.uint16).view(np.float16).astype(np.float32),
                           (every << 16).view(np.float32),     # every bfloat16, exactly
                           (every << 16 | 0x8000).view(np.float32),    # ... and halfway above
                           r.standard_normal(4096).astype(np.float32)])
    for short, dt, name in (("f16", np.float16, "float16"),
                            ("bf16", ml_dtypes.bfloat16, "bfloat16")):
        bits = every.astype(np.uint16).view(dt)
        yield f"cast {short} -> f32", Case("cast", [bits], {"dtype": "float32"}), 1
        yield f"cast f32 -> {short}", Case("cast", [wide], {"dtype": name}), 1


def run() -> dict:
    """``{name: (outputs, kernel names, k)}`` of every case in this process's build."""
    return {name: (*_run_case(case), k) for name, case, k in _cases()}


def save(path: str) -> None:
    """Write :func:`run` to ``path`` (``.npz``: ``<name>/<i>`` outputs, bfloat16 as its uint16
    bits, ``<name>/kernels``, ``<name>/k``)."""
    arrays = {}
    for name, (outs, kernels, k) in run().items():
        for i, o in enumerate(outs):
            arrays[f"{name}/{i}"] = o.view(np.uint16) if o.dtype == ml_dtypes.bfloat16 else o
        arrays[f"{name}/kernels"] = np.array(kernels)
        arrays[f"{name}/k"] = np.array(k)
    np.savez(path, **arrays)


if __name__ == "__main__":
    save(sys.argv[1])
