"""``dropout`` on CUDA: a grid-stride kernel draws each element's bits from the counter-based
stream (``miniflow.ops.dropout.dropout_bits``, compiled as a device function), writes ``mask``
and ``y = x * mask * scale``; a one-thread kernel then advances the stream's offset (a separate
launch, so no thread reads the offset after it moved)."""
from __future__ import annotations

import functools

from numba import cuda, types

from ...ops.dropout import GOLDEN, dropout_bits, dropout_scale, keep_threshold
from .common import device, flat, jit, short, types_of
from .launch import flat_steps

__all__ = ["dropout_kernel", "advance_kernel", "BUILDERS"]

_bits = device(dropout_bits)


@functools.cache
def dropout_kernel(ld, ct, st):
    """``kernel(x, state, y, mask, threshold, scale)``: ``keep = dropout_bits(seed * GOLDEN +
    offset + i) >= threshold``, ``mask[i] = keep``, ``y[i] = x[i] * keep * scale``."""

    @jit
    def kernel(x, state, y, mask, threshold, scale):
        base = types.uint64(state[0]) * types.uint64(GOLDEN) + types.uint64(state[1])
        t = types.uint64(threshold)
        for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
            m = ct(1) if _bits(base + types.uint64(i)) >= t else ct(0)
            mask[i] = st(m)
            y[i] = st(ld(x[i]) * m * ct(scale))

    return kernel


@functools.cache
def advance_kernel():
    """``kernel(state, n)``: ``state[1] += n`` (one thread)."""

    @jit
    def kernel(state, n):
        if cuda.grid(1) == 0:
            state[1] += n

    return kernel


def build_dropout(node, ins, outs):
    """``y, mask = dropout(x, state)``, then the stream's offset advanced by ``x.size``."""
    x, state = ins
    y, mask = outs
    rate = node.attrs["rate"]
    steps = flat_steps(dropout_kernel(*types_of(x)), x.size,
                       (flat(x), flat(state), flat(y), flat(mask), keep_threshold(rate),
                        dropout_scale(rate)), f"dropout {short(x.dtype)}")
    return steps + flat_steps(advance_kernel(), 1, (flat(state), int(x.size)), "dropout_advance")


BUILDERS = {"dropout": build_dropout}
"""Op type -> builder."""
