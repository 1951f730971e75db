"""Gradient clipping by the global norm on every backend (semantics in ``miniflow.ops.clip``):
the per-element accumulation, the combination of partial results, the final norm and the clip
factor as scalar bodies (plain Python on float64 scalars, compiled by ``register_jitable`` on the
CPU and ``cuda.jit(device=True)`` on CUDA), and the builder.

``p`` is the norm type: ``inf`` (the max of ``|g|``, NaN propagating), 1, 2, or any ``p > 0``
(the sum of ``|g|^p``, then its ``1/p``-th power).
"""
from __future__ import annotations

import math

from ...ops.clip import CLIP_EPS

__all__ = ["norm_accumulate", "norm_combine", "norm_finish", "clip_coefficient", "clip_builder"]


def norm_accumulate(acc, x, p):
    """``acc`` with the element ``x`` added: ``max(acc, |x|)`` (NaN propagates) for ``p = inf``,
    else ``acc + |x|^p``."""
    a = abs(x)
    if p == math.inf:
        return a if (a > acc or a != a) else acc
    if p == 1.0:
        return acc + a
    if p == 2.0:
        return acc + a * a
    return acc + a ** p


def norm_combine(a, b, p):
    """Two partial results together: their max (NaN propagates) for ``p = inf``, else their sum."""
    if p == math.inf:
        return b if (b > a or b != b) else a
    return a + b


def norm_finish(acc, p):
    """The norm from the combined result: itself for ``p = inf`` or 1, ``sqrt`` for 2, else
    ``acc ** (1 / p)``."""
    if p == math.inf or p == 1.0:
        return acc
    if p == 2.0:
        return math.sqrt(acc)
    return acc ** (1.0 / p)


def clip_coefficient(norm, max_norm, skip):
    """``min(max_norm / (norm + 1e-6), 1)`` (NaN stays NaN), or 1 when ``skip != 0``."""
    if skip != 0:
        return 1.0
    c = max_norm / (norm + CLIP_EPS)
    return 1.0 if c > 1.0 else c


def clip_builder(clip_steps):
    """The ``clip_grad_norm`` builder over a backend's ``clip_steps(skip_if, grads, total, coef,
    max_norm, norm_type)`` (``grads`` a tuple of the gradient arrays)."""
    def build_clip_grad_norm(node, ins, outs):
        """``total_norm, clip_coef = clip_grad_norm(skip_if, g0, g1, ...) {max_norm,
        norm_type}``."""
        return clip_steps(ins[0], tuple(ins[1:]), outs[0], outs[1],
                          float(node.attrs["max_norm"]), float(node.attrs["norm_type"]))
    return build_clip_grad_norm
