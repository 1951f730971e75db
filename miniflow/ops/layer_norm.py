"""Layer normalization: ``layer_norm``, ``layer_norm_grad`` and ``layer_norm_param_grad``
(OneFlow's op names, inputs, outputs and attributes: ``oneflow/user/ops/layer_norm_op.cpp``; the
formula of PyTorch's ``torch.nn.LayerNorm``, Ba, Kiros and Hinton, "Layer Normalization", 2016).

x is viewed as ``[rows, cols]``: ``rows`` the product of ``x.shape[:begin_norm_axis]``, ``cols``
of the rest (the normalized shape). ``begin_params_axis`` must equal ``begin_norm_axis`` (PyTorch's
LayerNorm: the affine parameters have the normalized shape).

* ``layer_norm(x[, gamma, beta])`` {begin_norm_axis, begin_params_axis, epsilon 1e-5} ->
  ``y, mean, inv_variance``: per row ``mean``, the biased ``var``,
  ``inv_variance = 1 / sqrt(var + epsilon)``, ``y = (x - mean) * inv_variance * gamma + beta``
  (without gamma and beta: PyTorch's ``elementwise_affine=False``). ``mean`` and
  ``inv_variance`` have shape ``x.shape[:begin_norm_axis]`` and OneFlow's statistics dtype:
  float32 for a half ``x``, else ``x``'s; gamma and beta have ``x``'s dtype (under AMP they are
  cast with ``x``, as OneFlow's gray ``layer_norm`` does).
* ``layer_norm_grad(dy, x, mean, inv_variance[, gamma]) -> dx``: with ``xhat = (x - mean) *
  inv_variance`` and ``g = dy * gamma``, per row
  ``dx = inv_variance * (g - mean(g) - xhat * mean(g * xhat))``. Its ``mean`` and
  ``inv_variance`` are no-cast inputs (OneFlow's ``REGISTER_NO_CAST_REGISTRY``): float32 beside a
  float16 ``dy`` and ``x``.
* ``layer_norm_param_grad(dy, x, mean, inv_variance) -> gamma_diff, beta_diff``: sums over the
  rows of ``dy * xhat`` and ``dy`` (shape ``x.shape[begin_params_axis:]``, ``dy``'s dtype).
"""
from __future__ import annotations

import numbers

import numpy as np

from .common import check_arity, fmt, float_samples, rand
from .normalization import param_dtype, statistics_grads
from .registry import register

__all__ = ["LAYER_NORM_DEFAULTS", "layer_norm_reference"]

LAYER_NORM_DEFAULTS = {"begin_norm_axis": -1, "begin_params_axis": -1, "epsilon": 1e-5}
"""``layer_norm``'s attribute defaults: OneFlow's axes (the last one) and PyTorch's epsilon."""


def _attrs(op, inputs, attrs, x_index):
    """Defaults filled, the axes made non-negative and checked against ``x`` (input
    ``x_index``)."""
    unknown = sorted(set(attrs) - set(LAYER_NORM_DEFAULTS))
    if unknown:
        raise ValueError(f"{op}: unknown attribute(s) {', '.join(unknown)}; it takes "
                         f"{', '.join(LAYER_NORM_DEFAULTS)}")
    a = {k: attrs.get(k, v) for k, v in LAYER_NORM_DEFAULTS.items()}
    ndim = len(inputs[x_index].shape) if len(inputs) > x_index else 0
    for key in ("begin_norm_axis", "begin_params_axis"):
        v = a[key]
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not -ndim <= v < ndim:
            raise ValueError(f"{op}: {key}={v!r} is out of range for x of rank {ndim} "
                             f"(x needs at least 1 dimension)")
        a[key] = int(v) % ndim
    if a["begin_params_axis"] != a["begin_norm_axis"]:
        raise ValueError(f"{op}: begin_params_axis {a['begin_params_axis']} must equal "
                         f"begin_norm_axis {a['begin_norm_axis']} (the affine parameters have "
                         f"the normalized shape, as in PyTorch's LayerNorm)")
    a["epsilon"] = float(a["epsilon"])
    if not a["epsilon"] >= 0.0:
        raise ValueError(f"{op}: epsilon must be >= 0, got {a['epsilon']}")
    return a


def _check_x(op, x):
    if not x.dtype.is_float:
        raise TypeError(f"{op}: x {fmt(x)} must be floating point (f16/bf16/f32/f64)")


def _check_stats(op, x, mean, inv, axis):
    want, dt = x.shape[:axis], param_dtype(x.dtype)
    for name, v in (("mean", mean), ("inv_variance", inv)):
        if v.dtype is not dt:
            raise TypeError(f"{op}: {name} {fmt(v)} must be {dt.name} for x {fmt(x)} (OneFlow's "
                            f"statistics dtype: float32 for a float16 or bfloat16 x)")
        if v.shape != want:
            raise ValueError(f"{op}: {name} {fmt(v)} must have shape {list(want)} for x "
                             f"{fmt(x)} (begin_norm_axis {axis})")


def _check_dy(op, dy, x):
    if dy.dtype is not x.dtype:
        raise TypeError(f"{op}: dy {fmt(dy)} must have x's dtype {fmt(x)}")
    if dy.shape != x.shape:
        raise ValueError(f"{op}: dy {fmt(dy)} must have x's shape {fmt(x)}")


def _check_params(op, x, params, axis):
    want = x.shape[axis:]
    for name, v in params:
        if v.shape != want:
            raise ValueError(f"{op}: {name} {fmt(v)} must have the normalized shape "
                             f"{list(want)} of x {fmt(x)} (begin_params_axis {axis})")
        if v.dtype is not x.dtype:
            raise TypeError(f"{op}: {name} {fmt(v)} must have x's dtype {x.dtype.name} "
                            f"(cast it with .to())")


def _infer(inputs, attrs):
    op = "layer_norm"
    if len(inputs) not in (1, 3):
        raise ValueError(f"{op}: expects x, or x, gamma and beta; got {len(inputs)} inputs")
    x, axis = inputs[0], attrs["begin_norm_axis"]
    _check_x(op, x)
    _check_params(op, x, list(zip(("gamma", "beta"), inputs[1:])), axis)
    stats = (x.shape[:axis], param_dtype(x.dtype))
    return [(x.shape, x.dtype), stats, stats]


def _rows(x, axis):
    """``x`` as ``[rows, cols]`` around ``axis``."""
    return x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)),
                     int(np.prod(x.shape[axis:], dtype=np.int64)))


def layer_norm_reference(arrays, attrs):
    """``[y, mean, inv_variance] = layer_norm(x[, gamma, beta])`` in float64."""
    x, axis = arrays[0], attrs["begin_norm_axis"]
    r = _rows(x, axis)
    mean = r.mean(axis=1) if r.shape[1] else np.full(r.shape[0], np.nan)
    var = ((r - mean[:, None]) ** 2).mean(axis=1) if r.shape[1] else mean
    inv = 1.0 / np.sqrt(var + attrs["epsilon"])
    y = (r - mean[:, None]) * inv[:, None]
    if len(arrays) == 3:
        y = y * arrays[1].reshape(-1) + arrays[2].reshape(-1)
    return [y.reshape(x.shape), mean.reshape(x.shape[:axis]), inv.reshape(x.shape[:axis])]


def _grad(node, gs, emit):
    """OneFlow's rule (``layer_norm_grad`` for dx, ``layer_norm_param_grad`` for gamma and
    beta), plus, when the statistics outputs have gradients too (gradient checks give them),
    their terms (:func:`~miniflow.ops.normalization.statistics_grads`)."""
    x, axis = node.inputs[0], node.attrs["begin_norm_axis"]
    mean, inv = node.outputs[1:]
    attrs = dict(node.attrs)
    grads = [None] * len(node.inputs)
    if gs[0] is not None:
        grads[0] = emit("layer_norm_grad", gs[0], x, mean, inv, *node.inputs[1:2], **attrs)
        if len(node.inputs) == 3:
            grads[1], grads[2] = emit("layer_norm_param_grad", gs[0], x, mean, inv, **attrs)
    kept = x.shape[:axis] + (1,) * (len(x.shape) - axis)
    extra = statistics_grads(emit, x, mean, inv, gs[1], gs[2], kept,
                             tuple(range(axis, len(x.shape))))
    if extra is not None:
        grads[0] = extra if grads[0] is None else emit("add_n", grads[0], extra)
    return grads


def _grad_infer(inputs, attrs):
    op = "layer_norm_grad"
    if len(inputs) not in (4, 5):
        raise ValueError(f"{op}: expects dy, x, mean, inv_variance[, gamma]; got "
                         f"{len(inputs)} inputs")
    dy, x, mean, inv = inputs[:4]
    _check_x(op, x)
    _check_dy(op, dy, x)
    _check_stats(op, x, mean, inv, attrs["begin_norm_axis"])
    _check_params(op, x, list(zip(("gamma",), inputs[4:])), attrs["begin_params_axis"])
    return [(x.shape, x.dtype)]


def _xhat(dy, x, mean, inv, axis):
    r, d = _rows(x, axis), _rows(dy, axis)
    return d, (r - mean.reshape(-1, 1)) * inv.reshape(-1, 1)


def _grad_reference(arrays, attrs):
    dy, x, mean, inv = arrays[:4]
    d, xhat = _xhat(dy, x, mean, inv, attrs["begin_norm_axis"])
    g = d * arrays[4].reshape(-1) if len(arrays) == 5 else d
    n = max(1, g.shape[1])
    dx = inv.reshape(-1, 1) * (g - g.sum(1, keepdims=True) / n
                               - xhat * (g * xhat).sum(1, keepdims=True) / n)
    return [dx.reshape(x.shape)]


def _param_grad_infer(inputs, attrs):
    op = "layer_norm_param_grad"
    check_arity(op, inputs, 4)
    dy, x, mean, inv = inputs
    _check_x(op, x)
    _check_dy(op, dy, x)
    _check_stats(op, x, mean, inv, attrs["begin_norm_axis"])
    shape = x.shape[attrs["begin_params_axis"]:]
    return [(shape, dy.dtype), (shape, dy.dtype)]


def _param_grad_reference(arrays, attrs):
    dy, x, mean, inv = arrays
    d, xhat = _xhat(dy, x, mean, inv, attrs["begin_norm_axis"])
    shape = x.shape[attrs["begin_params_axis"]:]
    return [(d * xhat).sum(0).reshape(shape), d.sum(0).reshape(shape)]


# ----------------------------------------------------------------------------- samples
_SHAPES = [((4, 7), 1, True), ((2, 3, 5), 1, True), ((2, 3, 5), 2, False), ((0, 4), 1, True),
           ((3, 1), 1, True), ((6,), 0, True)]


def _inputs(dt, shape, axis, affine, seed):
    r = np.random.default_rng(seed)
    x = rand(*shape, dtype=dt, lo=-1.0, hi=3.0, r=r)
    params = [rand(*shape[axis:], dtype=dt, lo=0.5, hi=1.5, r=r),
              rand(*shape[axis:], dtype=dt, r=r)] if affine else []
    return [x] + params


def _samples():
    def make(dt):
        out = [(_inputs(dt, s, a, aff, k), {"begin_norm_axis": a, "begin_params_axis": a})
               for k, (s, a, aff) in enumerate(_SHAPES)]
        big = 1000.0 + rand(2, 64, dtype=np.float64, r=np.random.default_rng(3))
        out.append(([big.astype(dt)], {}))      # mean 1000, std 0.6: no cancellation
        out.append(([np.array([[1.0, np.nan, 2.0], [1.0, 2.0, 4.0]], dt)], {"epsilon": 0.0}))
        return out
    return float_samples(make)


def _grad_samples(with_gamma):
    def make(dt):
        out = []
        for k, (shape, axis, affine) in enumerate(_SHAPES):
            ins = _inputs(dt, shape, axis, True, k)
            attrs = {"begin_norm_axis": axis, "begin_params_axis": axis}
            _, mean, inv = layer_norm_reference([a.astype(np.float64) for a in ins],
                                                dict(attrs, epsilon=1e-5))
            st = np.float32 if dt == np.float16 else dt
            dy = rand(*shape, dtype=dt, r=np.random.default_rng(20 + k))
            out.append(([dy, ins[0], mean.astype(st), inv.astype(st)]
                        + (ins[1:2] if with_gamma and affine else []), attrs))
        return out
    return lambda: float_samples(make)


_NOTE = ("gray list (OneFlow); mean and inv_variance are float32 for a half x (OneFlow's "
         "statistics dtype)")

register("layer_norm", _infer, normalize=lambda ins, a: _attrs("layer_norm", ins, a, 0),
         grad=_grad, reference=layer_norm_reference, samples=_samples, amp="gray", amp_note=_NOTE,
         doc="y = (x - mean) / sqrt(var + eps) * gamma + beta over the trailing axes, with the "
             "row statistics mean and inv_variance")
register("layer_norm_grad", _grad_infer,
         normalize=lambda ins, a: _attrs("layer_norm_grad", ins, a, 1),
         reference=_grad_reference, samples=_grad_samples(True), amp="gray",
         amp_note="gray list (OneFlow); mean and inv_variance are no-cast inputs "
                  "(REGISTER_NO_CAST_REGISTRY): float32 beside a float16 dy",
         no_cast_inputs={2: "mean", 3: "inv_variance"},
         doc="dx of layer_norm: inv_variance * (g - mean(g) - xhat * mean(g * xhat)), g = dy*gamma")
register("layer_norm_param_grad", _param_grad_infer,
         normalize=lambda ins, a: _attrs("layer_norm_param_grad", ins, a, 1),
         reference=_param_grad_reference, samples=_grad_samples(False), amp="gray",
         amp_note="gray list (OneFlow); mean and inv_variance are no-cast inputs, as for "
                  "layer_norm_grad: float32 statistics beside a float16 dy",
         no_cast_inputs={2: "mean", 3: "inv_variance"},
         doc="gamma_diff = sum over rows of dy * xhat, beta_diff = sum over rows of dy")
