"""The CPU kernel of ``fused_elementwise``: a Numba function generated from the node's expression
(``kernels.common.codegen`` lowers it and caches the module on disk).

One kernel per (expression with its numbers as arguments, input dtypes, broadcast kinds, loop
shape, serial or parallel). For ``relu(add(x0, x1))`` over f32 ``[64,128]`` with ``x1: f32[128]``
(a row) the generated kernel is::

    @jit(False)
    def kernel(x0, x1, out0, rows, cols):
        for r_ in range(rows):
            r = np.int64(r_)
            x0r = x0[r * cols:(r + 1) * cols]
            out0r = out0[r * cols:(r + 1) * cols]
            for c in range(cols):
                a0 = load(x0r, c)
                a1 = load(x1, c)
                v0 = float32(add(a0, a1))
                v1 = float32(relu(v0))
                y0 = v1
                store(out0r, c, y0)

Inputs arrive as 1-D kernel views (float16 as uint16 bits, bfloat16 as int16 bits, ``common.flat``); ``load`` widens,
``store`` rounds once (``fp16``). Two dims when some input is a row or a column, else one flat loop
over ``n`` elements. The parallel variant (``prange`` over rows or elements) is chosen by size
(``common.use_parallel``).
"""
from __future__ import annotations

import functools

from .common import flat, jitable, use_parallel
from ..common import codegen
from ...dtype import as_dtype
from ...ops.fused import broadcast_kinds, parse

__all__ = ["BUILDERS", "CPU", "fused_source", "build_fused_elementwise"]

CPU = codegen.Dialect(load=lambda array, index, dtype: f"load({array}, {index})",
                      store="store({array}, {index}, {value})", f16="widen(narrow({value}))",
                      f16_wide="widen(narrow64(float64({value})))",
                      bf16="widen_bf16(narrow_bf16({value}))",
                      bf16_wide="widen_bf16(narrow64_bf16({value}))")
"""The CPU spelling of loads, stores and half rounding (``fp16``)."""

ROW_SLICES = {**codegen.FLAT, "full": ("r", "c")}
"""Two dims: full inputs and outputs are read and written through their row's slice ``x<k>r`` at
column ``c``; indexing the whole array at ``r * cols + c`` keeps LLVM from vectorizing the loop
in the parallel variant (5x slower)."""


def fused_source(expr: str, input_dtypes, kinds, two_dims: bool, parallel: bool):
    """``(source, numbers)``: the generated module for ``expr`` and the values of its numbers in
    the order the kernel takes them.

    ``input_dtypes``: the inputs' DTypes; ``kinds``: their broadcast kinds
    (``ops.fused.broadcast_kinds``); ``two_dims``: loop over ``(rows, cols)``, else over ``n``.
    """
    program = parse(expr)
    low = codegen.lower(program, list(input_dtypes), kinds, two_dims, CPU,
                        ROW_SLICES if two_dims else codegen.FLAT)
    functions = codegen.functions(low)
    for fn in functions:
        jitable(fn)
    loop = "prange" if parallel else "range"
    if two_dims:
        sliced = [f"x{k}" for k, kind in enumerate(kinds) if kind == "full"]
        sliced += [f"out{k}" for k in range(len(program.outputs))]
        head = [f"for r_ in {loop}(rows):", "    r = np.int64(r_)",
                *(f"    {a}r = {a}[r * cols:(r + 1) * cols]" for a in sliced),
                "    for c in range(cols):"]
    else:
        head = [f"for i in {loop}(n):"]
    imports = ["import numpy as np", "from numba import prange",
               "from numpy import float32, float64", "",
               "from miniflow.kernels.cpu.common import jit",
               "from miniflow.kernels.cpu.fp16 import (load, narrow, narrow64, narrow64_bf16,",
               "                                       narrow_bf16, store, widen, widen_bf16)"]
    imports += codegen.function_imports(functions)
    source = codegen.module_source("miniflow.kernels.cpu.fused", low, input_dtypes, kinds, imports,
                                   f"@jit({parallel})", head)
    return source, [v for v, _ in low.numbers]


@functools.cache
def _kernel(expr: str, input_dtypes: tuple, kinds: tuple, two_dims: bool, parallel: bool):
    """``(kernel, numbers)`` for :func:`fused_source`'s arguments (memoised per process)."""
    source, numbers = fused_source(expr, input_dtypes, kinds, two_dims, parallel)
    return codegen.load_source("fused_cpu", source).kernel, numbers


def build_fused_elementwise(node, ins, outs):
    """``outs = expr(ins)`` elementwise, inputs broadcast: one call of the generated kernel."""
    if outs[0].size == 0:
        return []
    dims, kinds = broadcast_kinds(outs[0].shape, [a.shape for a in ins])
    dtypes = tuple(as_dtype(a.dtype) for a in ins)
    kernel, numbers = _kernel(node.attrs["expr"], dtypes, tuple(kinds), len(dims) == 2,
                              use_parallel(outs[0].size))
    return [(kernel, (*(flat(a) for a in ins), *numbers, *(flat(o) for o in outs), *dims))]


BUILDERS = {"fused_elementwise": build_fused_elementwise}
"""Op type -> builder."""
