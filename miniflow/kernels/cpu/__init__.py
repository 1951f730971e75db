"""The CPU backend's kernels: :data:`KERNELS` (op type -> builder) and :func:`builder_for`, which
also derives the builder of every elementwise op from its scalar function (the builder contract:
``miniflow.runtime.backend.Backend``).

Arrays are C-contiguous NumPy buffers (float16 as ``np.float16``; kernels see its ``uint16`` bits,
``fp16``). Modules, mirrored in ``kernels.cuda``: ``common`` (the ``jit`` decorator, the
serial/parallel choice, flat views), ``elementwise`` (map / zip / broadcast / cast), ``movement``
(reshape, transpose, broadcast_like, fills: ``np.copyto``), ``reduce`` (reduce_sum, softmax family,
cross entropy), ``matmul`` (NumPy's BLAS and register-blocked loops), ``update`` (SGD, Adam),
``loss_scale`` (the loss-scale stage), ``clip`` (gradient clipping), ``collective`` (all-reduce,
broadcast), ``fused`` (generated kernels of ``fused_elementwise``), ``conv`` (im2col + BLAS,
Winograd F(2x2, 3x3)), ``normalization`` (batch norm, layer norm), ``pool`` (max, average,
adaptive average), ``indexing`` (gather and its scatter-add, slice, tril, masked_fill, one-axis
max / argmax), ``dropout`` (counter-based masks); CPU only: ``target`` (the CPU Numba compiles
for: its features, vector width and matmul register tile), ``fp16`` (float16 and bfloat16
conversions), ``simd`` (the target's float32 vectors for the matmul micro-kernel), ``tune``
(kernel choices measured on this machine, cached on disk), ``special`` (float32 erf and exp without
libm calls, for the scalar functions' helpers). Builders shared with the CUDA backend
come from ``kernels.common``.

Precision: f16 and f32 compute in float32, f64 in float64; sums accumulate in that type; matmul on
half types multiplies in float32 (operands widened as they load) and rounds the product to the half
type once (a GPU fp16 GEMM's contract).
"""
from __future__ import annotations

from . import (clip, collective, conv, dropout, elementwise, fused, indexing, loss_scale, matmul,
               movement, normalization, pool, reduce, special, update)
from ..common import table

__all__ = ["KERNELS", "builder_for"]

KERNELS, builder_for = table.backend_kernels(__name__, [
    clip, collective, conv, dropout, elementwise, fused, indexing, loss_scale, matmul, movement,
    normalization, pool, reduce, update])
"""``KERNELS``: op type -> builder of the ops whose kernels are not derived from a scalar function
(merged from the ``BUILDERS`` of the families, ``table.FAMILIES``); ``builder_for(op)``: its
builder, found or derived."""
