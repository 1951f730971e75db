"""Gradient clipping by the global norm: OneFlow's ``ClipGradientByGlobalNorm`` (its optimizer
pass, ``autograd.cpp``), with the rule of ``torch.nn.utils.clip_grad_norm_``.

* ``clip_grad_norm(skip_if, g0, g1, ...) -> (total_norm [1], clip_coef [1])``
  {max_norm, norm_type}: the p-norm of all gradients together, ``p = norm_type``:
  ``total_norm = (sum_k sum_i |g_k[i]|^p)^(1/p)``, ``max_k,i |g_k[i]|`` for ``p = inf`` (equal to
  PyTorch's norm of the per-tensor norms), accumulated in float64; and the factor every gradient
  is multiplied by, ``clip_coef = min(max_norm / (total_norm + 1e-6), 1)`` (PyTorch's
  ``clip_coef_clamped``; OneFlow adds the same 1e-6 and clamps at 1). When ``skip_if[0] != 0``
  the step is skipped by the grad scaler: ``clip_coef = 1``, a skipped step clips nothing (the
  norm is still reported: inf or NaN). Both outputs have the gradients' dtype (float32 master
  gradients, or float64); NaN gradients give a NaN norm and factor, as in PyTorch.

The optimizer pass (``miniflow.passes.optimizer``) emits it per optimizer whose param group sets
``clip_grad_max_norm``, on the unscaled master gradients after the loss-scale stage's
non-finite count, and multiplies each gradient by ``clip_coef`` (``scalar_mul_by_tensor``).
"""
from __future__ import annotations

import math

import numpy as np

from ..dtype import float32, float64, int64
from .common import fmt, rand
from .registry import register

CLIP_EPS = 1e-6
"""Added to the norm before dividing (PyTorch's and OneFlow's)."""


def _norm(inputs, attrs):
    try:
        max_norm, norm_type = float(attrs["max_norm"]), float(attrs.get("norm_type", 2.0))
    except KeyError:
        raise ValueError("clip_grad_norm: missing attribute 'max_norm'") from None
    if not (math.isfinite(max_norm) and max_norm > 0):
        raise ValueError(f"clip_grad_norm: max_norm must be a finite number > 0, got {max_norm!r}")
    if not norm_type > 0:
        raise ValueError(f"clip_grad_norm: norm_type must be > 0 (inf for the max norm), got "
                         f"{norm_type!r}")
    return {"max_norm": max_norm, "norm_type": norm_type}


def _infer(inputs, attrs):
    if len(inputs) < 2:
        raise ValueError(f"clip_grad_norm: expects skip_if and at least one gradient, got "
                         f"{len(inputs)} input(s)")
    skip_if, grads = inputs[0], inputs[1:]
    if skip_if.dtype is not int64 or skip_if.shape != (1,):
        raise TypeError(f"clip_grad_norm: skip_if {fmt(skip_if)} must be i64[1]")
    dt = grads[0].dtype
    for g in grads:
        if g.dtype not in (float32, float64) or g.dtype is not dt:
            raise TypeError("clip_grad_norm: the gradients must share one dtype, float32 or "
                            "float64 (master gradients), got " + ", ".join(fmt(g) for g in grads))
    return [((1,), dt), ((1,), dt)]


def _reference(arrays, attrs):
    """The norm in float64 over all gradients, then PyTorch's clamped coefficient."""
    skip_if, grads = arrays[0], arrays[1:]
    p = attrs["norm_type"]
    flat = np.concatenate([np.abs(g).reshape(-1) for g in grads])
    if p == math.inf:
        total = flat.max() if flat.size else 0.0  # NaN propagates
    else:
        total = (flat ** p).sum() ** (1.0 / p)
    coef = 1.0 if skip_if[0] != 0 else min(attrs["max_norm"] / (total + CLIP_EPS), 1.0)
    return [np.array([total]), np.array([coef])]  # min(nan, 1.0) is nan


def _samples():
    r = np.random.default_rng(31)
    grads = [rand(5, 4, r=r), rand(7, r=r), rand(0, r=r)]
    out = []
    for p in (2.0, 1.0, math.inf, 3.0):
        for max_norm in (0.5, 1e4):                   # clipped, and a norm below max_norm
            out.append(([np.zeros(1, np.int64), *grads], {"max_norm": max_norm, "norm_type": p}))
    out.append(([np.array([1], np.int64), *grads], {"max_norm": 0.5, "norm_type": 2.0}))  # skip
    out.append(([np.zeros(1, np.int64), np.array([1.0, np.inf, 2.0], np.float32)],
                {"max_norm": 1.0, "norm_type": 2.0}))  # inf norm, factor 0
    out.append(([np.zeros(1, np.int64), np.array([1.0, np.nan], np.float32)],
                {"max_norm": 1.0, "norm_type": math.inf}))  # NaN propagates
    return out


register("clip_grad_norm", _infer, normalize=_norm, reference=_reference, samples=_samples,
         amp=None, amp_note="optimizer stage: runs after AMP on the float32 master gradients",
         doc="total p-norm of all gradients and min(max_norm / (norm + 1e-6), 1) (1 if skip_if)")
