"""``dropout`` on the CPU: one Numba loop draws each element's bits from the counter-based stream
(``miniflow.ops.dropout.dropout_bits``), writes ``mask`` and ``y = x * mask * scale`` (in the
compute type, rounded once), then advances the stream's offset in place. Elements are independent,
so the parallel variant gives the same bits."""
from __future__ import annotations

import functools

import numpy as np

from ...ops.dropout import GOLDEN, dropout_bits, dropout_scale, keep_threshold
from .common import flat, jit, jitable, loop_for, use_parallel
from .fp16 import load, store, to_compute

__all__ = ["dropout_kernel", "BUILDERS"]

_bits = jitable(dropout_bits)


@functools.cache
def dropout_kernel(parallel: bool):
    """``kernel(x, state, y, mask, threshold, scale)``: for every element ``i``, ``keep =
    dropout_bits(seed * GOLDEN + offset + i) >= threshold``, ``mask[i] = keep``, ``y[i] = x[i] *
    keep * scale``; then ``state[1] += x.size`` (``state = [seed, offset]``, int64)."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, state, y, mask, threshold, scale):
        base = np.uint64(state[0]) * np.uint64(GOLDEN) + np.uint64(state[1])
        t = np.uint64(threshold)
        s = to_compute(y, scale)
        one, zero = to_compute(y, 1.0), to_compute(y, 0.0)
        for i_ in loop(x.size):
            i = np.int64(i_)
            m = one if _bits(base + np.uint64(i)) >= t else zero
            store(mask, i, m)
            store(y, i, load(x, i) * m * s)
        state[1] += x.size

    return kernel


def build_dropout(node, ins, outs):
    """``y, mask = dropout(x, state)``; ``state`` advanced in place."""
    x, state = ins
    y, mask = outs
    rate = node.attrs["rate"]
    return [(dropout_kernel(use_parallel(x.size)),
             (flat(x), state.reshape(-1), flat(y), flat(mask), keep_threshold(rate),
              dropout_scale(rate)))]


BUILDERS = {"dropout": build_dropout}
"""Op type -> builder."""
