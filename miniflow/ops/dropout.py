"""``dropout`` (OneFlow's op name, gray in its AMP lists; PyTorch's ``nn.functional.dropout``:
Srivastava et al., "Dropout", JMLR 2014, with the inverted scaling ``1 / (1 - rate)``).

``dropout(x, state)`` {rate} -> ``y, mask``: ``mask[i] = 1`` where element ``i`` is kept (with
probability ``1 - rate``), else 0, in x's dtype (OneFlow's mask is bool; no miniflow graph
value is bool); ``y = x * mask * scale`` with ``scale = 1 / (1 - rate)`` (0 for ``rate = 1``: all
dropped, as PyTorch), so a NaN stays NaN even where dropped, as ``x * mask`` in PyTorch.

``state`` is the int64 ``[seed, offset]`` of a counter-based random stream, written in place:
element ``i`` draws :func:`dropout_bits` of ``seed * GOLDEN + offset + i``, then
``offset += x.size``. The same (seed, offset) gives the
same mask on every backend and in the reference, so a run resumed from a checkpoint that saved
the state (``miniflow.random.RngState``) drops exactly what the uninterrupted run dropped.

The bits are SplitMix64's output function (Steele, Lea and Flood, "Fast splittable pseudorandom
number generators", OOPSLA 2014; the finalizer of Java's ``SplittableRandom``) in wrapping uint64
arithmetic, its top 53 bits kept: a uniform integer in ``[0, 2^53)``. An element is kept when its
bits are at least ``floor(rate * 2^53)`` (:func:`keep_threshold`). A counter-based generator: the
mask of element ``i`` depends only on ``(seed, offset, i)``, never on the order threads run in (the
role of the (seed, offset) Philox streams of PyTorch's and OneFlow's CUDA dropout); the kernels
compile :func:`dropout_bits` itself.

Gradient: ``dx = dy * mask * scale`` (``broadcast_mul`` and ``scalar_mul``; OneFlow's
``dropout_grad`` computes the same product).
"""
from __future__ import annotations

import numbers

import numpy as np

from ..dtype import int64
from .common import check_arity, check_float, float_samples, fmt, rand
from .registry import register

__all__ = ["GOLDEN", "MIX1", "MIX2", "keep_threshold", "dropout_bits", "dropout_scale",
           "dropout_mask"]

GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB


def keep_threshold(rate: float) -> int:
    """``floor(rate * 2^53)``: elements whose bits are below it are dropped (``rate`` in [0, 1])."""
    return int(rate * float(1 << 53))


def dropout_bits(z):
    """SplitMix64's finalizer of ``z`` (uint64, already ``seed * GOLDEN + counter``), shifted to
    its top 53 bits. A plain function of uint64 scalars (or NumPy uint64 arrays), compiled by each
    backend's kernel."""
    z = (z ^ (z >> 30)) * MIX1
    z = (z ^ (z >> 27)) * MIX2
    return (z ^ (z >> 31)) >> 11


def dropout_scale(rate: float) -> float:
    """``1 / (1 - rate)``, 0 for ``rate = 1``."""
    return 0.0 if rate >= 1.0 else 1.0 / (1.0 - rate)


def dropout_mask(seed: int, offset: int, size: int, rate: float) -> np.ndarray:
    """The float64 keep mask of ``size`` elements from stream ``(seed, offset)`` (NumPy uint64
    arithmetic, wrapping: the bits every kernel computes)."""
    with np.errstate(over="ignore"):
        z = (np.uint64(seed % (1 << 64)) * np.uint64(GOLDEN) + np.uint64(offset % (1 << 64))
             + np.arange(size, dtype=np.uint64))
    return (dropout_bits(z) >= np.uint64(keep_threshold(rate))).astype(np.float64)


def _norm(inputs, attrs):
    rate = attrs.get("rate", 0.5)
    if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not 0.0 <= rate <= 1.0:
        raise ValueError(f"dropout: rate (PyTorch's p) must be a probability in [0, 1], "
                         f"got {rate!r}")
    return {"rate": float(rate)}


def _infer(inputs, attrs):
    op = "dropout"
    check_arity(op, inputs, 2)
    x, state = inputs
    check_float(op, x)
    if state.dtype is not int64 or state.shape != (2,):
        raise TypeError(f"dropout: state {fmt(state)} must be the int64 [seed, offset] of a "
                        f"random stream, shape [2] (nn.Dropout passes miniflow.random's)")
    return [(x.shape, x.dtype), (x.shape, x.dtype)]


def _reference(arrays, attrs):
    x, state = arrays
    mask = dropout_mask(int(state[0]), int(state[1]), x.size, attrs["rate"]).reshape(x.shape)
    new = state.copy()
    new[1] += x.size
    return [x * mask * dropout_scale(attrs["rate"]), mask, new]


def _grad(node, gs, emit):
    if gs[0] is None:
        return [None, None]
    scale = dropout_scale(node.attrs["rate"])
    return [emit("scalar_mul", emit("broadcast_mul", gs[0], node.outputs[1]), scalar=scale),
            None]


def _samples():
    def make(dt):
        r = np.random.default_rng(41)
        st = np.array([12345, 0], np.int64)
        return [([rand(6, 50, dtype=dt, r=r), st], {"rate": 0.3}),
                ([rand(4, 7, dtype=dt, r=r), np.array([-7, 1 << 40], np.int64)], {"rate": 0.5}),
                ([rand(3, 3, dtype=dt, r=r), st], {"rate": 0.0}),
                ([rand(3, 3, dtype=dt, r=r), st], {"rate": 1.0}),
                ([rand(0, 3, dtype=dt, r=r), st], {"rate": 0.5}),
                ([np.array([np.nan, np.inf, -1.0, 2.0], dt), st], {"rate": 0.5})]
    return float_samples(make)


register("dropout", _infer, normalize=_norm, grad=_grad, reference=_reference, samples=_samples,
         amp="gray", writes=(1,),
         doc="y = x * mask / (1 - rate), mask from the counter-based stream state (advanced in "
             "place)")
