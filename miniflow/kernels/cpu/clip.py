"""CPU kernel of gradient clipping by the global norm, ``clip_grad_norm`` (semantics in
``miniflow.ops.clip``): one serial pass over every gradient, accumulating in float64 with the
scalar bodies of ``kernels.common.clip``."""
from __future__ import annotations

import numpy as np

from .common import flat, jit, jitable
from .fp16 import load
from ..common.clip import (clip_builder, clip_coefficient, norm_accumulate, norm_combine,
                           norm_finish)

__all__ = ["clip_kernel", "BUILDERS"]

_accumulate, _combine = jitable(norm_accumulate), jitable(norm_combine)
_finish, _coefficient = jitable(norm_finish), jitable(clip_coefficient)


@jit(False)
def clip_kernel(skip_if, grads, total, coef, max_norm, p):
    """``total[0]``: the p-norm of all of ``grads`` (a tuple of 1-D views of one dtype);
    ``coef[0]``: the clip factor (1 when ``skip_if[0] != 0``)."""
    acc = 0.0
    for k in range(len(grads)):
        g = grads[k]
        part = 0.0
        for i in range(g.size):
            part = _accumulate(part, np.float64(load(g, i)), p)
        acc = _combine(acc, part, p)
    norm = _finish(acc, p)
    total[0] = norm
    coef[0] = _coefficient(norm, max_norm, skip_if[0])


def clip_steps(skip_if, grads, total, coef, max_norm, p):
    """One call of :func:`clip_kernel`."""
    return [(clip_kernel, (skip_if.reshape(-1), tuple(flat(g) for g in grads), total, coef,
                           max_norm, p))]


BUILDERS = {"clip_grad_norm": clip_builder(clip_steps)}
"""Op type -> builder for gradient clipping."""
