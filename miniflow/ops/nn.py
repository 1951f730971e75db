"""Row ops over the last axis: softmax, log_softmax, sparse_softmax_cross_entropy and their grads.

Formulas (OneFlow ``softmax_op.cpp``, ``log_softmax_op.cpp``, ``sparse_softmax_cross_entropy_op.cpp``):

* softmax: ``y = exp(x - max) / sum(exp(x - max))``; ``dx = y * (dy - sum(dy * y))``
* log_softmax: ``y = x - max - log(sum(exp(x - max)))``; ``dx = dy - exp(y) * sum(dy)``
* sparse_softmax_cross_entropy(prediction [N, C], label [N] int64) -> (prob [N, C], out [N]) with
  ``out[n] = -log(prob[n, label[n]])``; gradient
  ``sparse_softmax_cross_entropy_grad(dy, label, prob) = dy[n] * (prob[n, c] - onehot(label)[n, c])``.
"""
from __future__ import annotations

import numpy as np

from ..dtype import int64
from .common import check_arity, check_float, float_samples, fmt, rand, y_dy_infer
from .registry import register


def _row_infer(op):
    def infer(inputs, attrs):
        check_arity(op, inputs, 1)
        dt = check_float(op, inputs[0])
        if len(inputs[0].shape) < 1:
            raise ValueError(f"{op}: needs at least 1-D input, got {fmt(inputs[0])}")
        return [(inputs[0].shape, dt)]
    return infer


def _row_samples():
    def make(dt):
        return [([rand(4, 7, dtype=dt, lo=-5, hi=5)], {}), ([rand(2, 3, 5, dtype=dt)], {}),
                ([rand(0, 3, dtype=dt)], {}), ([rand(1, 1, dtype=dt)], {}),
                ([np.array([[1.0, np.nan, 2.0], [1e4, 1e4, -1e4]], dt)], {})]
    return float_samples(make)


def _row_grad_samples(log):
    def make(dt):
        r = np.random.default_rng(9)
        y = rand(4, 5, dtype=np.float64, r=r)
        y = np.exp(y) / np.exp(y).sum(-1, keepdims=True)
        y = np.log(y) if log else y
        return [([y.astype(dt), rand(4, 5, dtype=dt, r=r)], {})]
    return lambda: float_samples(make)


def _log_softmax(x):
    """log_softmax over the last axis in float64 (max-subtracted)."""
    m = x.max(-1, keepdims=True) if x.size else x
    z = x - m
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


register("softmax", _row_infer("softmax"),
         grad=lambda n, gs, emit: [emit("softmax_grad", n.outputs[0], gs[0])],
         reference=lambda xs, a: [np.exp(_log_softmax(xs[0]))],
         samples=_row_samples, amp="gray", doc="y = softmax(x) over the last axis")
register("log_softmax", _row_infer("log_softmax"),
         grad=lambda n, gs, emit: [emit("log_softmax_grad", n.outputs[0], gs[0])],
         reference=lambda xs, a: [_log_softmax(xs[0])],
         samples=_row_samples, amp="gray", doc="y = log_softmax(x) over the last axis")
register("softmax_grad", y_dy_infer("softmax_grad"), samples=_row_grad_samples(False),
         reference=lambda xs, a: [xs[0] * (xs[1] - (xs[1] * xs[0]).sum(-1, keepdims=True))],
         amp="gray", doc="dx = y * (dy - sum(dy * y, last axis))")
register("log_softmax_grad", y_dy_infer("log_softmax_grad"),
         reference=lambda xs, a: [xs[1] - np.exp(xs[0]) * xs[1].sum(-1, keepdims=True)],
         samples=_row_grad_samples(True), amp="gray",
         doc="dx = dy - exp(y) * sum(dy, last axis)")


# ------------------------------------------------------------------------------ cross entropy
def _check_labels(op, pred, label):
    if label.dtype is not int64:
        raise TypeError(f"{op}: label {fmt(label)} must be int64 class indices "
                        f"(convert with .astype(np.int64))")
    if len(pred.shape) != 2 or label.shape != pred.shape[:1]:
        raise ValueError(f"{op}: expects prediction [N, C] and label [N], got {fmt(pred)} and "
                         f"{fmt(label)}")


def _sce_infer(inputs, attrs):
    op = "sparse_softmax_cross_entropy"
    check_arity(op, inputs, 2)
    pred, label = inputs
    dt = check_float(op, pred)
    _check_labels(op, pred, label)
    return [(pred.shape, dt), (pred.shape[:1], dt)]


def _sce_grad(n, gs, emit):
    prob = n.outputs[0]
    parts = []
    if gs[1] is not None:
        parts.append(emit("sparse_softmax_cross_entropy_grad", gs[1], n.inputs[1], prob))
    if gs[0] is not None:  # a gradient through prob too: the softmax rule
        parts.append(emit("softmax_grad", prob, gs[0]))
    return [parts[0] if len(parts) == 1 else emit("add_n", *parts), None]


def _labels(n, c, r):
    return r.integers(0, c, size=n).astype(np.int64)


def _sce_samples():
    def make(dt):
        r = np.random.default_rng(13)
        return [([rand(6, 10, dtype=dt, lo=-4, hi=4, r=r), _labels(6, 10, r)], {}),
                ([rand(1, 1, dtype=dt, r=r), np.zeros(1, np.int64)], {}),
                ([rand(0, 3, dtype=dt, r=r), np.zeros(0, np.int64)], {}),
                ([np.array([[1e4, -1e4, 0.0], [np.nan, 0.0, 1.0]], dt), np.array([1, 2])], {})]
    return float_samples(make)


def _diagnose_labels(node, arrays):
    """Name the first label outside [0, C) (``label`` is input 1 of both ops)."""
    label, classes = arrays[1], node.inputs[0 if node.op.name.endswith("entropy") else 2].shape[1]
    bad = np.flatnonzero((label < 0) | (label >= classes))
    if not bad.size:
        return None
    i = int(bad[0])
    hint = ("; PyTorch's cross_entropy skips -100 by default, miniflow's only with "
            "ignore_index=-100" if int(label[i]) == -100 else "")
    return (f"labels must be class indices in [0, {classes}): label[{i}] = {int(label[i])} "
            f"({bad.size} of {label.size} out of range{hint})")


def _checked_labels(label, classes):
    """The int64 labels, or ValueError naming the first one outside [0, classes)."""
    bad = np.flatnonzero((label < 0) | (label >= classes))
    if bad.size:
        raise ValueError(f"sparse_softmax_cross_entropy: label out of range [0, {classes}): "
                         f"label[{bad[0]}] = {label[bad[0]]}")
    return label


def _sce_ref(arrays, attrs):
    pred, label = arrays
    logp = _log_softmax(pred)
    label = _checked_labels(label, pred.shape[1])
    return [np.exp(logp), -logp[np.arange(label.size), label]]


register("sparse_softmax_cross_entropy", _sce_infer, grad=_sce_grad, samples=_sce_samples,
         diagnose=_diagnose_labels, reference=_sce_ref, amp="gray",
         doc="prob = softmax(prediction), out[n] = -log(prob[n, label[n]])")


def _sce_grad_infer(inputs, attrs):
    op = "sparse_softmax_cross_entropy_grad"
    check_arity(op, inputs, 3)
    dy, label, prob = inputs
    dt = check_float(op, dy, prob)
    _check_labels(op, prob, label)
    if dy.shape != prob.shape[:1]:
        raise ValueError(f"{op}: dy {fmt(dy)} must have shape [N] of prob {fmt(prob)}")
    return [(prob.shape, dt)]


def _sce_grad_samples():
    def make(dt):
        r = np.random.default_rng(17)
        p = rand(5, 4, dtype=np.float64, lo=0, hi=1, r=r)
        p /= p.sum(-1, keepdims=True)
        return [([rand(5, dtype=dt, r=r), _labels(5, 4, r), p.astype(dt)], {})]
    return float_samples(make)


def _sce_grad_ref(arrays, attrs):
    dy, label, prob = arrays
    onehot = np.eye(prob.shape[1])[_checked_labels(label, prob.shape[1])]
    return [dy[:, None] * (prob - onehot)]


register("sparse_softmax_cross_entropy_grad", _sce_grad_infer, samples=_sce_grad_samples,
         diagnose=_diagnose_labels, reference=_sce_grad_ref, amp="gray",
         doc="dx[n, c] = dy[n] * (prob[n, c] - (c == label[n]))")
