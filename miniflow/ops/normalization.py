"""Batch normalization: ``normalization`` and ``normalization_grad`` (OneFlow's op names, inputs,
outputs and attributes: ``oneflow/user/ops/normalization_op.cpp``, ``OneFlowUserOps.td``), and
``increment``, the in-place counter behind ``BatchNorm2d.num_batches_tracked``.

* ``normalization(x, moving_mean, moving_variance, gamma, beta)`` {axis 1, epsilon 1e-5,
  momentum 0.9, training}: batch norm over every axis of ``x`` but ``axis``.

  - ``training=True``: outputs ``y, mean, inv_variance`` with the batch statistics (``var``
    biased, ``inv_variance = 1 / sqrt(var + epsilon)``), ``y = (x - mean) * inv_variance *
    gamma + beta``, and writes the moving statistics in place (:attr:`OpDef.writes` is
    ``(1, 2)`` for these nodes): ``new = momentum * old + (1 - momentum) * batch``, the variance
    unbiased (``M / (M - 1)``, M values per channel). ``momentum`` is OneFlow's attribute, the
    weight of the old value: OneFlow's functional layer passes ``1 - momentum`` of PyTorch's
    (``core/functional/impl/nn_functor.cpp``, ``NormalizationFunctor``), so PyTorch's 0.1 is 0.9.
  - ``training=False``: the single output ``y = (x - moving_mean) / sqrt(moving_variance +
    epsilon) * gamma + beta``; nothing is written.

  Statistics and parameters have OneFlow's parameter dtype: float32 for a half ``x``
  (``MakeFwDataTypeInferFn``), else ``x``'s. Under AMP the op is gray, and its moving statistics,
  gamma and beta are no-cast inputs (``REGISTER_NO_CAST_REGISTRY`` in ``auto_mixed_precision.cpp``):
  they stay float32 while ``x`` and ``y`` are float16. For a half ``x`` the four may instead all
  be of ``x``'s dtype (PyTorch's ``BatchNorm1d(C, dtype=torch.float16)``): the op computes in
  float32 all the same (``mean`` and ``inv_variance`` are float32 outputs, PyTorch's opmath),
  reads the parameters widened and writes the moving statistics rounded once to their dtype.
* ``normalization_grad(x, dy, mean, inv_variance, gamma) -> gamma_diff, beta_diff, dx``:
  with ``xhat = (x - mean) * inv_variance`` and sums per channel over its M values,
  ``beta_diff = sum(dy)``, ``gamma_diff = sum(dy * xhat)``,
  ``dx = gamma * inv_variance * (dy - beta_diff / M - xhat * gamma_diff / M)``. An eval-mode
  ``normalization`` differentiates as OneFlow's ``normalization.cpp`` gradient function does:
  ``normalization_grad`` with the moving statistics for ``gamma_diff`` / ``beta_diff``, and
  ``dx = dy * gamma * rsqrt(moving_variance + epsilon)``. ``gamma_diff`` and ``beta_diff`` have
  ``gamma``'s dtype (float32, or a half ``x``'s own); ``mean`` and ``inv_variance`` are float32
  for a half ``x`` (the eval-mode rule casts half moving statistics up first).
* ``increment(counter)``: ``counter += 1`` in place (int64, one element).
"""
from __future__ import annotations

import numbers

import numpy as np

from ..dtype import as_dtype, bfloat16, float16, float32, int64
from .common import check_arity, fmt, rand
from .geometry import norm_layout
from .registry import register

__all__ = ["NORM_DEFAULTS", "param_dtype", "statistics_grads", "normalization_reference",
           "normalization_grad_reference"]

NORM_DEFAULTS = {"axis": 1, "epsilon": 1e-5, "momentum": 0.9, "training": False}
"""``normalization``'s attribute defaults: OneFlow's, except ``epsilon`` (PyTorch's 1e-5; OneFlow's
op default is 0) and ``momentum`` (0.9, PyTorch's default 0.1 as OneFlow's functor converts it)."""


def param_dtype(x_dtype):
    """OneFlow's batch-norm parameter dtype for ``x`` of ``x_dtype``: float32 for a half type
    (float16, bfloat16)."""
    return float32 if x_dtype.is_half else x_dtype


# ----------------------------------------------------------------------------- references
def _stats_shape(x, axis):
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    return shape


def normalization_reference(arrays, attrs):
    """``normalization`` in float64: ``[y]`` (eval), or ``[y, mean, inv_variance,
    new_moving_mean, new_moving_variance]`` (training: the outputs, then the written inputs)."""
    x, mm, mv, gamma, beta = arrays
    axis = attrs["axis"]
    outer, c, inner = norm_layout("normalization", x.shape, axis)
    shape = _stats_shape(x, axis)
    red = tuple(d for d in range(x.ndim) if d != axis)
    if not attrs["training"]:
        inv = 1.0 / np.sqrt(mv + attrs["epsilon"])
        return [(x - mm.reshape(shape)) * (inv * gamma).reshape(shape) + beta.reshape(shape)]
    m = outer * inner
    mean = x.mean(axis=red)
    var = ((x - mean.reshape(shape)) ** 2).mean(axis=red)
    inv = 1.0 / np.sqrt(var + attrs["epsilon"])
    y = (x - mean.reshape(shape)) * (inv * gamma).reshape(shape) + beta.reshape(shape)
    k = attrs["momentum"]
    return [y, mean, inv, k * mm + (1 - k) * mean, k * mv + (1 - k) * var * m / (m - 1)]


def normalization_grad_reference(arrays, attrs):
    """``[gamma_diff, beta_diff, dx] = normalization_grad(x, dy, mean, inv_variance, gamma)`` in
    float64 (see the module docstring)."""
    x, dy, mean, inv, gamma = arrays
    axis = attrs["axis"]
    outer, c, inner = norm_layout("normalization_grad", x.shape, axis)
    shape = _stats_shape(x, axis)
    red = tuple(d for d in range(x.ndim) if d != axis)
    xhat = (x - mean.reshape(shape)) * inv.reshape(shape)
    beta_diff = dy.sum(axis=red)
    gamma_diff = (dy * xhat).sum(axis=red)
    m = outer * inner
    dx = (gamma * inv).reshape(shape) * (dy - beta_diff.reshape(shape) / m
                                         - xhat * gamma_diff.reshape(shape) / m)
    return [gamma_diff, beta_diff, dx]


# ----------------------------------------------------------------------------- declarations
def _norm_attrs(op, inputs, attrs, keys):
    """Defaults filled, ``axis`` made non-negative, values checked; only ``keys`` are kept."""
    unknown = sorted(set(attrs) - set(keys))
    if unknown:
        raise ValueError(f"{op}: unknown attribute(s) {', '.join(unknown)}; it takes "
                         f"{', '.join(keys)}")
    a = {k: attrs.get(k, NORM_DEFAULTS[k]) for k in keys}
    ndim = len(inputs[0].shape) if inputs else 0
    if inputs:
        norm_layout(op, inputs[0].shape, 0)        # at least 2 dims, else a clear error
    if not isinstance(a["axis"], numbers.Integral) or not -ndim <= a["axis"] < max(ndim, 1):
        raise ValueError(f"{op}: axis={a['axis']!r} is out of range for x of rank {ndim}")
    a["axis"] = int(a["axis"]) % max(ndim, 1)
    a["epsilon"] = float(a["epsilon"])
    if not a["epsilon"] >= 0.0:
        raise ValueError(f"{op}: epsilon must be >= 0, got {a['epsilon']}")
    if "momentum" in a:
        a["momentum"] = float(a["momentum"])
        if not 0.0 <= a["momentum"] <= 1.0:
            raise ValueError(f"{op}: momentum (OneFlow's: the weight of the old moving value, "
                             f"1 - PyTorch's momentum) must be in [0, 1], got {a['momentum']}")
        a["training"] = bool(a["training"])
    return a


def _params(op, x, named: dict, axis: int, half_ok: tuple = ()):
    """Check the ``[C]`` vectors ``named`` (name -> Value) against ``x``: shape ``[C]`` and dtype.
    The dtype is the parameter dtype (:func:`param_dtype`); for a half ``x``, the vectors named in
    ``half_ok`` may instead all be of ``x``'s own dtype (PyTorch's half batch norm: weight, bias
    and running statistics of the layer's dtype; the op still computes in float32).
    Returns the parameter dtype and ``(outer, C, inner)``.

    Raises:
        TypeError: a non-float ``x``, a vector of another dtype, ``half_ok`` vectors of mixed
            dtypes. ValueError: a wrong shape.
    """
    if not x.dtype.is_float:
        raise TypeError(f"{op}: x {fmt(x)} must be floating point (f16/bf16/f32/f64)")
    layout = norm_layout(op, x.shape, axis)
    pt, c = param_dtype(x.dtype), layout[1]
    for name, v in named.items():
        if v.shape != (c,):
            raise ValueError(f"{op}: {name} {fmt(v)} must have shape [{c}] (x {fmt(x)} has {c} "
                             f"channels along axis {axis})")
        if v.dtype is pt or (name in half_ok and x.dtype.is_half and v.dtype is x.dtype):
            continue
        if name in half_ok and x.dtype.is_half:
            h = x.dtype.name
            raise TypeError(f"{op}: {name} {fmt(v)} must be float32 or {h} for x of dtype {h} "
                            f"(OneFlow's parameter dtype, or x's own as in PyTorch); make the "
                            f"layer with dtype=float32 or dtype={h}, or cast it with "
                            f".to(miniflow.float32)")
        raise TypeError(f"{op}: {name} {fmt(v)} must be {pt.name} for x of dtype "
                        f"{x.dtype.name} (OneFlow's parameter dtype: float32 for a float16 "
                        f"or bfloat16 x)")
    mixed = {named[n].dtype for n in half_ok if n in named}
    if len(mixed) > 1:
        listed = ", ".join(f"{n} {fmt(named[n])}" for n in half_ok if n in named)
        raise TypeError(f"{op}: {listed} must share one dtype (all float32, or all "
                        f"{x.dtype.name} as x); cast them with .to() so they match")
    return pt, layout


def _norm_infer(inputs, attrs):
    op = "normalization"
    check_arity(op, inputs, 5)
    x, mm, mv, gamma, beta = inputs
    named = {"moving_mean": mm, "moving_variance": mv, "gamma": gamma, "beta": beta}
    pt, (outer, c, inner) = _params(op, x, named, attrs["axis"], half_ok=tuple(named))
    if not attrs["training"]:
        return [(x.shape, x.dtype)]
    if outer * inner < 2:
        raise ValueError(f"{op}: training needs more than 1 value per channel, got x {fmt(x)} "
                         f"(axis {attrs['axis']}); use a batch of at least 2, or eval mode")
    return [(x.shape, x.dtype), ((c,), pt), ((c,), pt)]


def _norm_grad(node, gs, emit):
    """Training: ``normalization_grad`` (OneFlow's rule), plus, when the statistics outputs have
    gradients too (nothing in a network differentiates them; gradient checks do), their terms:
    ``d mean / dx = 1 / M`` and ``d inv_variance / dx = -inv_variance^3 (x - mean) / M``. Eval
    (moving statistics are constants here): OneFlow's rule, ``gamma_diff``/``beta_diff`` from
    ``normalization_grad`` with the moving statistics and
    ``dx = dy * gamma * rsqrt(moving_variance + epsilon)``."""
    x, mm, mv, gamma, _ = node.inputs
    a = node.attrs
    per_channel = (gamma.shape[0],) + (1,) * (len(x.shape) - 1 - a["axis"])
    grads = [None] * 5
    if a["training"]:
        mean, inv = node.outputs[1:]
        if gs[0] is not None:
            grads[3], grads[4], grads[0] = emit("normalization_grad", x, gs[0], mean, inv, gamma,
                                                axis=a["axis"], epsilon=a["epsilon"])
        kept = tuple(n if i == a["axis"] else 1 for i, n in enumerate(x.shape))  # [1, C, 1, 1]
        reduced = tuple(i for i in range(len(x.shape)) if i != a["axis"])
        extra = statistics_grads(emit, x, mean, inv, gs[1], gs[2], kept, reduced)
        if extra is not None:
            grads[0] = extra if grads[0] is None else emit("add_n", grads[0], extra)
        return grads
    if gs[0] is None:
        return grads
    pt = param_dtype(x.dtype)        # half moving statistics and gamma: used as float32 values
    mm, mv, wide = (v if v.dtype is pt else emit("cast", v, dtype=pt) for v in (mm, mv, gamma))
    inv = emit("rsqrt", emit("scalar_add", mv, scalar=a["epsilon"]))
    grads[3], grads[4], _ = emit("normalization_grad", x, gs[0], mm, inv, gamma, axis=a["axis"],
                                 epsilon=a["epsilon"])
    scale = emit("reshape", emit("broadcast_mul", wide, inv), shape=per_channel)
    if scale.dtype is not gs[0].dtype:     # a half x: the scale rounded once to its dtype
        scale = emit("cast", scale, dtype=gs[0].dtype)
    grads[0] = emit("broadcast_mul", gs[0], scale)
    return grads


def statistics_grads(emit, x, mean, inv, g_mean, g_inv, kept: tuple, reduced: tuple):
    """The part of ``dx`` that flows through a normalization's ``mean`` and ``inv_variance``
    outputs (None if neither has a gradient): ``d mean / dx = 1 / M`` and
    ``d inv_variance / dx = -inv_variance^3 (x - mean) / M``, ``M`` the elements each statistic
    covers. ``kept``: x's shape with the ``reduced`` axes set to 1 (the statistics' broadcast
    shape). Computed in the statistics' dtype (float32 for a half ``x``: OneFlow's) and cast to
    ``x``'s. Shared by ``normalization`` (per channel) and ``layer_norm`` (per row)."""
    m = max(1, int(np.prod([x.shape[i] for i in reduced], dtype=np.int64)))
    wide = x if x.dtype is mean.dtype else emit("cast", x, dtype=mean.dtype)
    dx = None
    if g_inv is not None:
        cube = emit("broadcast_mul", emit("broadcast_mul", inv, inv), inv)
        coef = emit("scalar_mul", emit("broadcast_mul", g_inv, cube), scalar=-1.0 / m)
        centered = emit("broadcast_sub", wide, emit("reshape", mean, shape=kept))
        dx = emit("broadcast_mul", centered, emit("reshape", coef, shape=kept))
    if g_mean is not None:
        share = emit("reshape", emit("scalar_mul", g_mean, scalar=1.0 / m), shape=kept)
        dx = (emit("broadcast_like", share, wide, broadcast_axes=reduced)
              if dx is None else emit("broadcast_add", dx, share))
    return dx if dx is None or dx.dtype is x.dtype else emit("cast", dx, dtype=x.dtype)


def _norm_grad_infer(inputs, attrs):
    op = "normalization_grad"
    check_arity(op, inputs, 5)
    x, dy, mean, inv, gamma = inputs
    if dy.shape != x.shape or dy.dtype is not x.dtype:
        raise ValueError(f"{op}: dy {fmt(dy)} must match x {fmt(x)} in shape and dtype")
    _, (_, c, _) = _params(op, x, {"mean": mean, "inv_variance": inv, "gamma": gamma},
                           attrs["axis"], half_ok=("gamma",))
    return [((c,), gamma.dtype), ((c,), gamma.dtype), (x.shape, x.dtype)]


def _increment_infer(inputs, attrs):
    check_arity("increment", inputs, 1)
    counter = inputs[0]
    if counter.dtype is not int64 or counter.size != 1:
        raise TypeError(f"increment: counter {fmt(counter)} must be an int64 tensor of one "
                        f"element")
    return []


# ----------------------------------------------------------------------------- samples
_NORM_SHAPES = [((3, 4, 5, 6), 1), ((9, 5), 1), ((2, 3, 4), 2), ((4, 3, 1, 1), 1)]


_HALF_PARAM_SHAPES = ((float16, 0), (bfloat16, 1))
"""Samples with half parameters and statistics (x's own dtype): the dtype, an index into
:data:`_NORM_SHAPES` (``bfloat16.np`` is read when the samples are made: it imports
``ml_dtypes``, which ``import miniflow`` does not)."""


def _norm_inputs(dt, shape, axis, seed, half_params=False):
    r = np.random.default_rng(seed)
    pt = dt if half_params or not as_dtype(dt).is_half else np.float32
    c = shape[axis]
    x = rand(*shape, dtype=dt, lo=-1.0, hi=3.0, r=r)
    mm, gamma, beta = (rand(c, dtype=pt, lo=-1.0, hi=1.0, r=r) for _ in range(3))
    mv = rand(c, dtype=pt, lo=0.5, hi=2.0, r=r)
    return x, mm, mv, gamma, beta


def _norm_cases():
    """``(dtype, shape, axis, seed, half_params)`` of the samples."""
    plain = [(dt, shape, axis, k, False) for dt in (np.float32, np.float16)
             for k, (shape, axis) in enumerate(_NORM_SHAPES)]
    return plain + [(dt.np, *_NORM_SHAPES[k], k, True) for dt, k in _HALF_PARAM_SHAPES]


def _norm_samples():
    out = []
    for dt, shape, axis, k, half_params in _norm_cases():
        ins = list(_norm_inputs(dt, shape, axis, k, half_params))
        for training in (True, False):
            out.append((ins, {"axis": axis, "momentum": 0.9, "training": training}))
    return out


def _norm_grad_samples():
    out = []
    for dt, shape, axis, k, half_params in _norm_cases():
        pt = np.float32 if as_dtype(dt).is_half else dt
        x, mm, mv, gamma, beta = _norm_inputs(dt, shape, axis, k, half_params)
        attrs = {"axis": axis, "epsilon": 1e-5, "momentum": 0.9, "training": True}
        f64 = [a.astype(np.float64) for a in (x, mm, mv, gamma, beta)]
        _, mean, inv, _, _ = normalization_reference(f64, attrs)
        dy = rand(*shape, dtype=dt, r=np.random.default_rng(10 + k))
        out.append(([x, dy, mean.astype(pt), inv.astype(pt), gamma],
                    {"axis": axis, "epsilon": 1e-5}))
    return out


_NO_CAST = "gray list (OneFlow); statistics and affine parameters stay float32 (no-cast inputs)"

register("normalization", _norm_infer,
         normalize=lambda ins, a: _norm_attrs("normalization", ins, a,
                                              ("axis", "epsilon", "momentum", "training")),
         grad=_norm_grad, reference=normalization_reference, samples=_norm_samples, amp="gray",
         amp_note=_NO_CAST,
         no_cast_inputs={1: "moving_mean", 2: "moving_variance", 3: "gamma", 4: "beta"},
         writes=lambda attrs, n_inputs: (1, 2) if attrs["training"] else (),
         doc="batch norm: y = (x - mean) * gamma / sqrt(var + eps) + beta; training: batch "
             "statistics, moving statistics updated in place")
register("normalization_grad", _norm_grad_infer,
         normalize=lambda ins, a: _norm_attrs("normalization_grad", ins, a, ("axis", "epsilon")),
         reference=normalization_grad_reference, samples=_norm_grad_samples, amp="gray",
         amp_note="gray list (OneFlow); gamma is a no-cast input (OneFlow's registry), and so "
                  "are mean and inv_variance here: from a float16 training-mode normalization "
                  "they are float32 already, and in an eval-mode gradient they are the float32 "
                  "moving statistics, which a float16 cast would make the op reject",
         no_cast_inputs={2: "mean", 3: "inv_variance", 4: "gamma"},
         doc="gamma_diff, beta_diff, dx of training-mode batch norm")
register("increment", _increment_infer, writes=(0,),
         reference=lambda xs, a: [xs[0] + 1],
         samples=lambda: [([np.array(3, np.int64)], {}), ([np.array([0], np.int64)], {})],
         amp=None, amp_note="an int64 counter (BatchNorm2d.num_batches_tracked): nothing to cast",
         doc="counter += 1 in place (int64, one element)")
