"""The CUDA kernel of ``fused_elementwise``: a numba-cuda kernel generated from the node's
expression, lowered by ``kernels.common.codegen`` exactly as the CPU kernel is (same rounding
of every result, so both backends agree with their unfused kernels) and cached on disk the same way.

For ``relu(add(x0, x1))`` over f16 ``[64,128]`` with ``x1: f16[128]`` (a row) the kernel is::

    @jit
    def kernel(x0, x1, out0, rows, cols):
        for i in range(cuda.grid(1), rows * cols, cuda.gridsize(1)):
            r = i // cols
            c = i - r * cols
            a0 = float32(x0[i])
            a1 = float32(x1[c])
            v0 = float32(float16(float32(add(a0, a1))))
            v1 = float32(float16(float32(relu(v0))))
            y0 = v1
            out0[i] = float16(y0)

(float32 results are ``round_float32(...)``: see :data:`CUDA`.)

A 1-D grid-stride loop (``launch.flat_steps``); loads widen to the compute type
(``common``), a float16 round trip is one ``cvt`` each way; scalar functions are the ops'
scalar functions (imported from their declaring module) compiled as device functions
(``common.device``).

Several one-dimensional nodes of one expression whose one-element inputs are the same values
(with AMP: every gradient's ``mul(f32(x0), x1)``, its cast and unscale by the one ``1/scale``)
run as one launch (:data:`GROUPS`, ``runtime.plan.grouped_nodes``): the generated kernel
(``multi=True``) takes tuples of the per-tensor inputs and outputs and runs the grid-stride loop
over their concatenation, as the multi-tensor updates do (``update``); the loop body is the same.
"""
from __future__ import annotations

import functools

from .common import flat
from .launch import chunks, flat_steps
from ..common import codegen
from ..common.table import GroupBuilder
from ...dtype import as_dtype
from ...ops.fused import broadcast_kinds, parse

__all__ = ["BUILDERS", "GROUPS", "CUDA", "fused_source", "build_fused_elementwise",
           "build_multi_fused_elementwise"]


def _load(array: str, index: str, dtype) -> str:
    if not dtype.is_float:
        return f"{array}[{index}]"
    if dtype.name == "bfloat16":
        return f"bf16_to_f32({array}[{index}])"
    return f"{'float64' if dtype.name == 'float64' else 'float32'}({array}[{index}])"


CUDA = codegen.Dialect(load=_load, store="{array}[{index}] = {dtype}({value})",
                       f16="float32(float16({value}))", f16_wide="float32(float16({value}))",
                       bf16="bf16_to_f32(to_bf16({value}))",
                       bf16_wide="bf16_to_f32(to_bf16({value}))", exact="round_{dtype}({value})")
"""The CUDA spelling of loads, stores and rounding: numba types as conversions; bfloat16 through
``common.bf16_to_f32`` and ``common.to_bf16`` (which rounds float64 once too); every float32 or
float64 result through ``common.round_float32`` / ``round_float64``, an add of -0.0 with
explicit rounding that NVVM does not contract into a neighbouring multiply (NVVM fuses a
multiply and an add into one FMA by default, which rounds once where the unfused kernels round
twice)."""


def _tuple_name(param: str) -> str:
    """The multi-tensor kernel's tuple parameter for ``x<k>`` / ``out<k>``: ``xs<k>`` /
    ``outs<k>``."""
    return "xs" + param[1:] if param.startswith("x") else "outs" + param[3:]


def fused_source(expr: str, input_dtypes, kinds, two_dims: bool, multi: bool = False):
    """``(source, numbers)`` of the generated module (as ``kernels.cpu.fused.fused_source``);
    ``multi``: the multi-tensor kernel (one dimension; the ``"full"`` inputs ``xs<k>`` and the
    outputs ``outs<k>`` are tuples, one array per tensor)."""
    low = codegen.lower(parse(expr), list(input_dtypes), kinds, two_dims, CUDA)
    size = "rows * cols" if two_dims else "n"
    loop = [f"for i in range(cuda.grid(1), {size}, cuda.gridsize(1)):"]
    if two_dims:
        loop += ["    r = i // cols", "    c = i - r * cols"]
    if multi:
        per_tensor = [p for p in low.params if p.startswith("out")]
        per_tensor += [f"x{k}" for k, kind in enumerate(kinds) if kind == "full"]
        low.params = [_tuple_name(p) if p in per_tensor else p for p in low.params if p != "n"]
        loop = ["start, stride = cuda.grid(1), cuda.gridsize(1)", "offset = 0",
                "for t in range(len(outs0)):",
                *(f"    {p} = {_tuple_name(p)}[t]" for p in per_tensor),
                "    n = out0.size", "    first = (start - offset) % stride", "    offset += n",
                "    for i in range(first, n, stride):"]
    functions = codegen.functions(low)
    imports = ["from numba import cuda", "from numba.types import float16, float32, float64", "",
               "from miniflow.kernels.cuda.common import (bf16_to_f32, device, jit, round_float32,",
               "                                          round_float64, to_bf16)",
               "bfloat16 = to_bf16                      # the store of a bfloat16 output",
               *codegen.function_imports(functions, alias="_"), "",
               *(f"{fn.__name__} = device(_{fn.__name__})" for fn in functions)]
    source = codegen.module_source("miniflow.kernels.cuda.fused", low, input_dtypes, kinds, imports,
                                   "@jit", loop)
    return source, [v for v, _ in low.numbers]


@functools.cache
def _kernel(expr: str, input_dtypes: tuple, kinds: tuple, two_dims: bool, multi: bool = False):
    """``(kernel, numbers)`` for :func:`fused_source`'s arguments (memoised per process)."""
    source, numbers = fused_source(expr, input_dtypes, kinds, two_dims, multi)
    return codegen.load_source("fused_cuda", source).kernel, numbers


def build_fused_elementwise(node, ins, outs):
    """``outs = expr(ins)`` elementwise, inputs broadcast: one grid-stride launch."""
    size = outs[0].size
    if size == 0:
        return []
    dims, kinds = broadcast_kinds(outs[0].shape, [a.shape for a in ins])
    kernel, numbers = _kernel(node.attrs["expr"], tuple(as_dtype(a.dtype) for a in ins),
                              tuple(kinds), len(dims) == 2)
    args = (*(flat(a) for a in ins), *numbers, *(flat(o) for o in outs), *dims)
    return flat_steps(kernel, size, args, f"fused[{node.attrs['expr']}]")


def _one_dim_scalars(node):
    """The indices of a one-dimensional, non-empty ``fused_elementwise`` node's one-element
    inputs (its group shares them), or None for another node (it joins no group)."""
    if node.outputs[0].size == 0:
        return None
    dims, kinds = broadcast_kinds(node.outputs[0].shape, [v.shape for v in node.inputs])
    if len(dims) != 1:
        return None
    return tuple(k for k, kind in enumerate(kinds) if kind == "scalar")


def build_multi_fused_elementwise(nodes, ins, outs):
    """The one-dimensional ``fused_elementwise`` nodes ``nodes`` (one expression, input dtypes
    and one-element inputs) as launches of the multi-tensor kernel."""
    _, kinds = broadcast_kinds(outs[0][0].shape, [a.shape for a in ins[0]])
    kernel, numbers = _kernel(nodes[0].attrs["expr"], tuple(as_dtype(a.dtype) for a in ins[0]),
                              tuple(kinds), False, True)
    full = [k for k, kind in enumerate(kinds) if kind == "full"]
    steps = []
    for part in chunks(list(range(len(nodes))), len(full) + len(outs[0])):
        args = [tuple(flat(ins[j][k]) for j in part) if k in full else flat(ins[part[0]][k])
                for k in range(len(kinds))]
        args += [*numbers, *(tuple(flat(outs[j][o]) for j in part) for o in range(len(outs[0])))]
        steps += flat_steps(kernel, sum(outs[j][0].size for j in part), tuple(args),
                            f"fused[{nodes[0].attrs['expr']}] x{len(part)}")
    return steps


BUILDERS = {"fused_elementwise": build_fused_elementwise}
"""Op type -> builder."""
GROUPS = {"fused_elementwise": GroupBuilder(build_multi_fused_elementwise,
                                            select=_one_dim_scalars)}
"""Op type -> ``GroupBuilder`` of several of its nodes as one launch."""
