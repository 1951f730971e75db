"""``matmul``: 2-D matrix product with optional transposes (OneFlow ``matmul`` op), and
``batch_matmul``: the same product per batch over equal leading dimensions (OneFlow
``batch_matmul``, ``oneflow/user/ops/matmul_op.cpp``: both operands of one rank >= 3, one batch
shape, no broadcasting; PyTorch's ``torch.bmm`` for rank 3, ``torch.matmul`` for equal batches).

Gradient (OneFlow ``matmul`` / ``batch_matmul`` backward): for out = op(a) @ op(b),
``da = dy @ b^T`` (or its transposed form), ``db = a^T @ dy``, emitted as nodes of the same op with
the transpose flags chosen so no explicit transpose node is needed.

``count_not_finite=True`` (set by the ``fuse_model_update_cast`` pass on the matmul that makes a
weight's gradient, never by users) adds a second output, ``i64[1]``: the number of non-finite
elements of the product as stored (after the rounding to out's dtype), counted in the pass that
writes the product, so the loss-scale stage's ``multi_count_not_finite`` needs no pass of its own
over that gradient. The attribute is absent from the other matmuls.
"""
from __future__ import annotations

import numpy as np

from .common import check_arity, check_float, float_samples, fmt, int64, rand
from .registry import register


def _norm(inputs, attrs):
    out = {"transpose_a": bool(attrs.get("transpose_a", False)),
           "transpose_b": bool(attrs.get("transpose_b", False))}
    if attrs.get("count_not_finite", False):
        out["count_not_finite"] = True
    return out


def _infer(inputs, attrs):
    check_arity("matmul", inputs, 2)
    a, b = inputs
    dt = check_float("matmul", a, b)
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise ValueError(f"matmul: both inputs must be 2-D, got {fmt(a)} and {fmt(b)}")
    m, k = a.shape[::-1] if attrs["transpose_a"] else a.shape
    k2, n = b.shape[::-1] if attrs["transpose_b"] else b.shape
    if k != k2:
        raise ValueError(f"matmul: inner dimensions differ: {fmt(a)} "
                         f"(transpose_a={attrs['transpose_a']}) and {fmt(b)} "
                         f"(transpose_b={attrs['transpose_b']}) give {k} vs {k2}")
    return [((m, n), dt)] + ([((1,), int64)] if attrs.get("count_not_finite") else [])


def _grad(n, gs, emit):
    a, b = n.inputs
    dy = gs[0]
    op = n.op.name                      # matmul or batch_matmul: the gradients are the same op
    ta, tb = n.attrs["transpose_a"], n.attrs["transpose_b"]
    # da: shape of a.  out = A @ B with A = op(a), B = op(b); dA = dy @ B^T, dB = A^T @ dy.
    if not ta:
        da = emit(op, dy, b, transpose_a=False, transpose_b=not tb)
    else:  # a = A^T -> da = dA^T = B @ dy^T
        da = emit(op, b, dy, transpose_a=tb, transpose_b=True)
    if not tb:
        db = emit(op, a, dy, transpose_a=not ta, transpose_b=False)
    else:  # b = B^T -> db = dB^T = dy^T @ A
        db = emit(op, dy, a, transpose_a=True, transpose_b=ta)
    return [da, db]


def _samples():
    def make(dt):
        r = np.random.default_rng(11)
        return [([rand(5, 3, dtype=dt, r=r), rand(3, 7, dtype=dt, r=r)], {}),
                ([np.array([[1.0, np.nan, 0.0, 2.0], [np.inf, 1.0, 0.0, 0.0], [1.0] * 4], dt),
                  rand(4, 20, dtype=dt, r=r)], {"count_not_finite": True}),
                ([rand(3, 5, dtype=dt, r=r), rand(3, 7, dtype=dt, r=r)], {"transpose_a": True}),
                ([rand(5, 3, dtype=dt, r=r), rand(7, 3, dtype=dt, r=r)], {"transpose_b": True}),
                ([rand(1, 1, dtype=dt, r=r), rand(1, 2, dtype=dt, r=r)], {}),
                ([rand(2, 0, dtype=dt, r=r), rand(0, 3, dtype=dt, r=r)], {}),
                ([np.full((1, 4), 200.0, dt), np.full((4, 1), 100.0, dt)], {})]
    return float_samples(make)


def _reference(arrays, attrs):
    a, b = arrays
    out = (a.T if attrs["transpose_a"] else a) @ (b.T if attrs["transpose_b"] else b)
    if not attrs.get("count_not_finite"):
        return [out]
    return [out, np.array([np.count_nonzero(~np.isfinite(out))], np.int64)]


register("matmul", _infer, normalize=_norm, grad=_grad, reference=_reference, samples=_samples,
         amp="white", doc="out[m, n] = sum_k op(a)[m, k] * op(b)[k, n], op = transpose if flagged")


# ------------------------------------------------------------------------------ batch_matmul
def _batch_norm_attrs(inputs, attrs):
    return {"transpose_a": bool(attrs.get("transpose_a", False)),
            "transpose_b": bool(attrs.get("transpose_b", False))}


def _batch_infer(inputs, attrs):
    op = "batch_matmul"
    check_arity(op, inputs, 2)
    a, b = inputs
    dt = check_float(op, a, b)
    if len(a.shape) < 3 or len(a.shape) != len(b.shape):
        raise ValueError(f"{op}: both inputs must have one rank >= 3 ([..., m, k] and "
                         f"[..., k, n]), got {fmt(a)} and {fmt(b)}; use matmul for 2-D operands")
    if a.shape[:-2] != b.shape[:-2]:
        raise ValueError(f"{op}: batch dimensions differ: {fmt(a)} and {fmt(b)} (OneFlow's "
                         f"batch_matmul does not broadcast); give both the same batch dimensions (a "
                         f"right operand shared by every batch, [1, ..., k, n], reshaped to "
                         f"[k, n] makes an N-D @ 2-D product)")
    m, k = a.shape[-2:][::-1] if attrs["transpose_a"] else a.shape[-2:]
    k2, n = b.shape[-2:][::-1] if attrs["transpose_b"] else b.shape[-2:]
    if k != k2:
        raise ValueError(f"{op}: inner dimensions differ: {fmt(a)} "
                         f"(transpose_a={attrs['transpose_a']}) and {fmt(b)} "
                         f"(transpose_b={attrs['transpose_b']}) give {k} vs {k2}")
    return [(a.shape[:-2] + (m, n), dt)]


def _batch_reference(arrays, attrs):
    a, b = arrays
    a = np.swapaxes(a, -1, -2) if attrs["transpose_a"] else a
    b = np.swapaxes(b, -1, -2) if attrs["transpose_b"] else b
    return [np.matmul(a, b)]


def _batch_samples():
    def make(dt):
        r = np.random.default_rng(12)
        return [([rand(2, 5, 3, dtype=dt, r=r), rand(2, 3, 4, dtype=dt, r=r)], {}),
                ([rand(2, 3, 4, 3, dtype=dt, r=r), rand(2, 3, 5, 3, dtype=dt, r=r)],
                 {"transpose_b": True}),
                ([rand(3, 4, 2, dtype=dt, r=r), rand(3, 4, 6, dtype=dt, r=r)],
                 {"transpose_a": True}),
                ([rand(2, 3, 5, dtype=dt, r=r), rand(2, 4, 3, dtype=dt, r=r)],
                 {"transpose_a": True, "transpose_b": True}),
                ([rand(0, 2, 3, dtype=dt, r=r), rand(0, 3, 2, dtype=dt, r=r)], {}),
                ([rand(2, 2, 0, dtype=dt, r=r), rand(2, 0, 3, dtype=dt, r=r)], {}),
                ([np.full((2, 1, 4), 200.0, dt), np.full((2, 4, 1), 100.0, dt)], {})]
    return float_samples(make)


register("batch_matmul", _batch_infer, normalize=_batch_norm_attrs, grad=_grad,
         reference=_batch_reference, samples=_batch_samples, amp="white",
         doc="out[..., m, n] = sum_k op(a)[..., m, k] * op(b)[..., k, n] per batch index")
