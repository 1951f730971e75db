"""Ops of the loss-scale stage (OneFlow's names and semantics).

* ``scalar_mul_by_tensor(x, scalar) -> out``: ``out = x * scalar``, where ``scalar`` has exactly one
  element and any shape (``[]``, ``[1]``, ``[1,1]`` ...; OneFlow checks ``elem_cnt() == 1``) and
  ``out`` has x's shape; x and scalar share one dtype (OneFlow checks this: PR 9126's intermediate
  version failed it with an fp16 static scale). Gradients as OneFlow's ``TensorScalarMul``:
  ``dx = dy * scalar``, ``dscalar = sum(dy * x)`` (in the scalar's shape).
* ``reciprocal(x) -> out``: ``1 / x`` elementwise (the inverse loss scale; an elementwise op
  declared with its scalar function here).
* ``multi_count_not_finite(g0, g1, ...) -> (counts i64[n], total i64[1])`` {precounted}: number
  of NaN/inf elements of each input (float inputs of any float dtypes), and their sum, in one
  fused kernel (OneFlow ``multi_count_not_finite``). The inputs listed in ``precounted`` are
  ``i64[1]`` counts their producers already took (a matmul with ``count_not_finite``, made by the
  ``fuse_model_update_cast`` pass): they are copied, not scanned.
* ``dynamic_loss_scale_schedule(total i64[1], loss_scale f32[1], growth_tracker i64[1])``
  {growth_factor, backoff_factor, growth_interval, min_scale}: writes scale and tracker in place,
  with ``torch.amp.GradScaler``'s rules (``_amp_update_scale_``) plus a floor:
  total > 0 -> ``scale = max(scale * backoff_factor, min_scale)``, tracker = 0;
  else tracker += 1 and at ``growth_interval``: ``scale *= growth_factor`` unless the product is not
  finite in float32, tracker = 0.
"""
from __future__ import annotations

import numpy as np

from ..dtype import float32, int64
from .common import check_arity, check_float, float_samples, fmt, rand, rounded
from .elementwise import elementwise
from .registry import register


def reciprocal(x):
    """1 / x (IEEE: 1/0 = inf); the scalar function of op ``reciprocal``."""
    return 1.0 / x


def _smbt_infer(inputs, attrs):
    check_arity("scalar_mul_by_tensor", inputs, 2)
    x, s = inputs
    dt = check_float("scalar_mul_by_tensor", x, s)
    if s.size != 1:
        raise ValueError(f"scalar_mul_by_tensor: scalar {fmt(s)} must have exactly one element "
                         f"(shape [], [1], [1,1] ...), it has {s.size}")
    return [(x.shape, dt)]


def _smbt_samples():
    def make(dt):
        return [([rand(3, 4, dtype=dt), np.array([0.5], dt)], {}),
                ([rand(dtype=dt), np.array([65504.0], dt)], {}),
                ([np.array([2.0, np.nan, 1e-3], dt),
                  np.array([65536.0], np.float32).astype(dt)], {}),
                ([rand(2, 3, dtype=dt), np.array(-1.5, dt)], {}),  # a 0-d scalar
                ([rand(4, dtype=dt), np.array([[0.25]], dt)], {}),  # scalar of higher rank
                ([rand(dtype=dt), np.array([[3.0]], dt)], {})]
    return float_samples(make)


def _smbt_grad(n, gs, emit):
    """OneFlow ``TensorScalarMul``: ``dx = dy * scalar``; ``dscalar = reduce_sum(dy * x)``."""
    x, s = n.inputs
    ds = emit("broadcast_mul", gs[0], x)
    if x.shape:
        ds = emit("reduce_sum", ds, axis=tuple(range(len(x.shape))), keepdims=False)
    if ds.shape != s.shape:
        ds = emit("reshape", ds, shape=s.shape)
    return [emit("scalar_mul_by_tensor", gs[0], s), ds]


register("scalar_mul_by_tensor", _smbt_infer, samples=_smbt_samples, grad=_smbt_grad,
         reference=lambda xs, a: [xs[0] * xs[1].reshape(())], amp="gray",
         doc="out = x * scalar (scalar: one element, any shape)")


def _reciprocal_grad(n, gs, emit):
    out = n.outputs[0]  # d(1/x) = -dy / x^2 = -dy * out * out
    return [emit("negative", emit("broadcast_mul", gs[0], emit("broadcast_mul", out, out)))]


elementwise("reciprocal", reciprocal, lambda x: 1.0 / x, amp="gray", grad=_reciprocal_grad,
            samples=lambda: float_samples(lambda dt: [([rand(2, 3, dtype=dt, lo=0.5, hi=4)], {}),
                                                      ([np.array([65536.0, 0.0, -2.0], dt)], {})]),
            doc="out = 1 / x; dx = -dy * out^2")


def _count_norm(inputs, attrs):
    pre = tuple(sorted(int(k) for k in attrs.get("precounted", ())))
    return {"precounted": pre} if pre else {}


def _count_infer(inputs, attrs):
    if not inputs:
        raise ValueError("multi_count_not_finite: needs at least one input")
    pre = attrs.get("precounted", ())
    if any(not 0 <= k < len(inputs) for k in pre):
        raise ValueError(f"multi_count_not_finite: precounted {pre} names inputs that do not "
                         f"exist ({len(inputs)} inputs)")
    for k, v in enumerate(inputs):
        if k in pre:
            if v.dtype is not int64 or v.shape != (1,):
                raise TypeError(f"multi_count_not_finite: precounted input {k} {fmt(v)} must be "
                                "an i64[1] count")
        elif not v.dtype.is_float:
            raise TypeError(f"multi_count_not_finite: input {fmt(v)} must be floating point")
    return [((len(inputs),), int64), ((1,), int64)]


def _count_samples():
    def make(dt):
        a = rand(3, 4, dtype=dt)
        b = np.array([1.0, np.inf, -np.inf, np.nan], dt)
        return [([a, b, rand(0, dtype=dt)], {}), ([a], {}),
                ([b, np.array([5], np.int64), a.astype(np.float32), np.array([0], np.int64)],
                 {"precounted": (1, 3)})]            # mixed dtypes and producers' counts
    return float_samples(make)


def _count_ref(arrays, attrs):
    pre = attrs.get("precounted", ())
    counts = np.array([a[0] if k in pre else np.count_nonzero(~np.isfinite(a))
                       for k, a in enumerate(arrays)], np.int64)
    return [counts, counts.sum(keepdims=True)]


register("multi_count_not_finite", _count_infer, normalize=_count_norm, samples=_count_samples,
         reference=_count_ref,
         amp=None, amp_note="loss-scale stage: runs after AMP on the float32 unscaled gradients",
         doc="counts[k] = number of non-finite elements of input k; total[0] = sum(counts)")


def _schedule_norm(inputs, attrs):
    return {"growth_factor": float(attrs["growth_factor"]),
            "backoff_factor": float(attrs["backoff_factor"]),
            "growth_interval": int(attrs["growth_interval"]),
            "min_scale": float(attrs["min_scale"])}


def _schedule_infer(inputs, attrs):
    op = "dynamic_loss_scale_schedule"
    check_arity(op, inputs, 3)
    total, scale, tracker = inputs
    if total.dtype is not int64 or total.shape != (1,):
        raise TypeError(f"{op}: count {fmt(total)} must be i64[1]")
    if scale.dtype is not float32 or scale.shape != (1,) or scale.kind != "variable":
        raise TypeError(f"{op}: loss_scale {fmt(scale)} must be an f32[1] variable")
    if tracker.dtype is not int64 or tracker.shape != (1,) or tracker.kind != "variable":
        raise TypeError(f"{op}: growth_tracker {fmt(tracker)} must be an i64[1] variable")
    return []


def _schedule_samples():
    attrs = {"growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3, "min_scale": 1.0}
    cases = [(0, 1024.0, 0), (0, 1024.0, 2), (3, 1024.0, 2), (1, 1.0, 0),
             (0, 2.0 ** 127, 2)]
    return [([np.array([c], np.int64), np.array([s], np.float32), np.array([t], np.int64)],
             dict(attrs)) for c, s, t in cases]


def _schedule_ref(arrays, attrs):
    """The new (loss_scale, growth_tracker): float64 arithmetic, the scale stored in float32."""
    total, scale, tracker = arrays
    if total[0] != 0:
        return [rounded(np.maximum(scale * attrs["backoff_factor"], attrs["min_scale"]),
                        float32), np.zeros(1, np.int64)]
    tracker = tracker + 1
    if tracker[0] < attrs["growth_interval"]:
        return [scale.copy(), tracker]
    grown = rounded(scale * attrs["growth_factor"], float32)
    return [grown if np.isfinite(grown).all() else scale.copy(), np.zeros(1, np.int64)]


register("dynamic_loss_scale_schedule", _schedule_infer, normalize=_schedule_norm,
         writes=(1, 2), samples=_schedule_samples, reference=_schedule_ref, amp=None,
         amp_note="loss-scale stage: runs after AMP, writes the float32 scale",
         doc="update loss_scale and growth_tracker from the non-finite count (GradScaler rules)")
