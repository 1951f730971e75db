"""Reductions, layout and creation ops: reduce_sum, broadcast_like, expand, add_n, reshape,
transpose, detach, ones_like, constant, cast, cast_like.

Gradients (OneFlow): reduce_sum -> broadcast_like(dy, x); broadcast_like -> reduce_sum; expand ->
reduce_sum over the expanded axes, reshaped to x;
reshape -> reshape back; transpose -> inverse transpose; detach -> none; cast -> cast back to
the input dtype; cast_like -> cast back to the input dtype (none to ``dtype_like``).
The references round only where the op means it: ``cast`` and ``constant`` to their dtype.
"""
from __future__ import annotations

import numpy as np

from ..dtype import as_dtype
from ..ir import format_shape
from .common import check_arity, check_float, float_samples, fmt, norm_axes, rand, rounded
from .registry import register


# ------------------------------------------------------------------------------ reduce_sum
def _reduce_norm(inputs, attrs):
    ndim = len(inputs[0].shape) if inputs else 0
    attrs["axis"] = norm_axes("reduce_sum", attrs.get("axis"), ndim) if ndim else ()
    attrs["keepdims"] = bool(attrs.get("keepdims", False))
    return attrs


def _reduce_infer(inputs, attrs):
    check_arity("reduce_sum", inputs, 1)
    x = inputs[0]
    dt = check_float("reduce_sum", x)
    axes = attrs["axis"]
    if attrs["keepdims"]:
        shape = tuple(1 if i in axes else s for i, s in enumerate(x.shape))
    else:
        shape = tuple(s for i, s in enumerate(x.shape) if i not in axes)
    return [(shape, dt)]


def _reduce_grad(n, gs, emit):
    return [emit("broadcast_like", gs[0], n.inputs[0], broadcast_axes=n.attrs["axis"])]


def _reduce_samples():
    def make(dt):
        x = rand(3, 4, 5, dtype=dt)
        return [([x], {"axis": (1,)}), ([x], {"axis": (0, 2)}), ([x], {"axis": (0, 1, 2)}),
                ([x], {"axis": (2,), "keepdims": True}), ([rand(0, 3, dtype=dt)], {"axis": (0,)}),
                ([np.full((4,), 30000.0, dt)], {"axis": (0,)}),
                ([np.array([1.0, np.nan], dt)], {"axis": (0,)})]
    return float_samples(make)


register("reduce_sum", _reduce_infer, normalize=_reduce_norm, grad=_reduce_grad,
         reference=lambda xs, a: [np.sum(xs[0], axis=a["axis"], keepdims=a["keepdims"])],
         samples=_reduce_samples, amp="gray",
         doc="out = sum of x over `axis` (accumulated in f32/f64)")


# ------------------------------------------------------------------------------ broadcast_like
def _bl_norm(inputs, attrs):
    ndim = len(inputs[1].shape) if len(inputs) > 1 else 0
    attrs["broadcast_axes"] = norm_axes("broadcast_like", attrs.get("broadcast_axes", ()), ndim) \
        if ndim else ()
    return attrs


def _bl_infer(inputs, attrs):
    check_arity("broadcast_like", inputs, 2)
    x, like = inputs
    dt = check_float("broadcast_like", x)
    axes = attrs["broadcast_axes"]
    removed = tuple(s for i, s in enumerate(like.shape) if i not in axes)
    kept = tuple(1 if i in axes else s for i, s in enumerate(like.shape))
    if x.shape not in (removed, kept):
        raise ValueError(f"broadcast_like: x {fmt(x)} cannot broadcast to like {fmt(like)} "
                         f"along axes {axes}: expected {format_shape(removed)} or "
                         f"{format_shape(kept)}")
    return [(like.shape, dt)]


def _bl_grad(n, gs, emit):
    x = n.inputs[0]
    keep = len(x.shape) == len(n.inputs[1].shape) and len(n.attrs["broadcast_axes"]) > 0
    return [emit("reduce_sum", gs[0], axis=n.attrs["broadcast_axes"], keepdims=keep), None]


def _bl_ref(arrays, attrs):
    x, like = arrays
    kept = [1 if i in attrs["broadcast_axes"] else s for i, s in enumerate(like.shape)]
    return [np.broadcast_to(x.reshape(kept), like.shape).copy()]


def _bl_samples():
    def make(dt):
        return [([rand(3, dtype=dt), rand(2, 3, dtype=dt)], {"broadcast_axes": (0,)}),
                ([rand(2, 1, dtype=dt), rand(2, 5, dtype=dt)], {"broadcast_axes": (1,)}),
                ([rand(dtype=dt), rand(2, 3, dtype=dt)], {"broadcast_axes": (0, 1)})]
    return float_samples(make)


register("broadcast_like", _bl_infer, normalize=_bl_norm, grad=_bl_grad, reference=_bl_ref,
         samples=_bl_samples, amp="clear", shape_inputs=(1,),
         doc="out (shape of like) = x repeated along broadcast_axes")


# ------------------------------------------------------------------------------ expand
def _expand_norm(inputs, attrs):
    shape = tuple(attrs["expand_shape"])
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in shape):
        raise TypeError(f"expand: expand_shape must be ints, got {shape}")
    attrs["expand_shape"] = tuple(int(d) for d in shape)
    return attrs


def _expand_infer(inputs, attrs):
    check_arity("expand", inputs, 1)
    x = inputs[0]
    shape = attrs["expand_shape"]
    lead = len(shape) - len(x.shape)
    if lead < 0 or any(d < 0 for d in shape) or any(
            n not in (1, d) for n, d in zip(x.shape, shape[lead:])):
        raise ValueError(f"expand: x {fmt(x)} cannot expand to {format_shape(shape)}: each dim "
                         f"of x, aligned to the end, must be 1 or equal the target's")
    return [(shape, x.dtype)]


def _expanded_axes(x_shape, shape) -> tuple:
    """The axes of ``shape`` along which ``expand`` repeats an ``x_shape`` (aligned to the end):
    the new leading ones and those where x has size 1 and the target does not."""
    lead = len(shape) - len(x_shape)
    return tuple(i for i, d in enumerate(shape) if i < lead or (x_shape[i - lead] == 1 != d))


def _expand_grad(n, gs, emit):
    x = n.inputs[0]
    axes = _expanded_axes(x.shape, n.attrs["expand_shape"])
    g = emit("reduce_sum", gs[0], axis=axes, keepdims=True) if axes else gs[0]
    return [emit("reshape", g, shape=x.shape)]


def _expand_samples():
    def make(dt):
        return [([rand(3, dtype=dt)], {"expand_shape": (2, 3)}),
                ([rand(2, 1, dtype=dt)], {"expand_shape": (2, 5)}),
                ([rand(dtype=dt)], {"expand_shape": (2, 3)}),
                ([rand(1, 3, 1, dtype=dt)], {"expand_shape": (4, 2, 3, 2)}),
                ([rand(2, 3, dtype=dt)], {"expand_shape": (2, 3)}),
                ([rand(0, 1, dtype=dt)], {"expand_shape": (0, 4)})]
    return float_samples(make)


register("expand", _expand_infer, normalize=_expand_norm, grad=_expand_grad,
         reference=lambda xs, a: [np.broadcast_to(xs[0], a["expand_shape"]).copy()],
         samples=_expand_samples, amp="clear",
         doc="out = x (any dtype) repeated along its size-1 dims and new leading dims to "
             "expand_shape")


# ------------------------------------------------------------------------------ add_n
def _add_n_infer(inputs, attrs):
    if not inputs:
        raise ValueError("add_n: needs at least one input")
    dt = check_float("add_n", *inputs)
    for v in inputs[1:]:
        if v.shape != inputs[0].shape:
            raise ValueError(f"add_n: inputs must share one shape, got {fmt(inputs[0])} and {fmt(v)}")
    return [(inputs[0].shape, dt)]


def _add_n_samples():
    def make(dt):
        r = np.random.default_rng(5)
        return [([rand(3, 4, dtype=dt, r=r) for _ in range(3)], {}),
                ([rand(5, dtype=dt, r=r)], {})]
    return float_samples(make)


register("add_n", _add_n_infer, grad=lambda n, gs, emit: [gs[0]] * len(n.inputs),
         reference=lambda xs, a: [sum(xs[1:], xs[0].copy())], samples=_add_n_samples, amp="gray",
         doc="out = x0 + x1 + ... (sums fan-out gradients)")


# ------------------------------------------------------------------------------ reshape / transpose
def _reshape_norm(inputs, attrs):
    shape = list(attrs["shape"])
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in shape):
        raise TypeError(f"reshape: shape must be ints, got {tuple(shape)}")
    size = inputs[0].size if inputs else 0
    if shape.count(-1) > 1:
        raise ValueError(f"reshape: at most one -1 allowed in {tuple(shape)}")
    if -1 in shape:
        known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
        if known == 0 or size % known:
            raise ValueError(f"reshape: cannot reshape {fmt(inputs[0])} to {tuple(shape)}")
        shape[shape.index(-1)] = size // known
    attrs["shape"] = tuple(int(s) for s in shape)
    return attrs


def _reshape_infer(inputs, attrs):
    check_arity("reshape", inputs, 1)
    x = inputs[0]
    shape = attrs["shape"]
    if int(np.prod(shape, dtype=np.int64)) != x.size or any(s < 0 for s in shape):
        raise ValueError(f"reshape: cannot reshape {fmt(x)} ({x.size} elements) to "
                         f"{format_shape(shape)}")
    return [(shape, x.dtype)]


register("reshape", _reshape_infer, normalize=_reshape_norm,
         grad=lambda n, gs, emit: [emit("reshape", gs[0], shape=n.inputs[0].shape)],
         reference=lambda xs, a: [xs[0].reshape(a["shape"])], amp="clear",
         samples=lambda: float_samples(lambda dt: [([rand(3, 4, dtype=dt)], {"shape": (2, 6)}),
                                                   ([rand(3, 4, dtype=dt)], {"shape": (12,)})]),
         doc="out = x with a new shape (same elements, C order)")


def _transpose_norm(inputs, attrs):
    ndim = len(inputs[0].shape) if inputs else 0
    perm = attrs.get("perm")
    perm = tuple(reversed(range(ndim))) if perm is None else tuple(int(p) % max(ndim, 1) for p in perm)
    attrs["perm"] = perm
    return attrs


def _transpose_infer(inputs, attrs):
    check_arity("transpose", inputs, 1)
    x = inputs[0]
    perm = attrs["perm"]
    if sorted(perm) != list(range(len(x.shape))):
        raise ValueError(f"transpose: perm {perm} is not a permutation of the axes of {fmt(x)}")
    return [(tuple(x.shape[p] for p in perm), x.dtype)]


def _transpose_grad(n, gs, emit):
    inv = tuple(int(i) for i in np.argsort(n.attrs["perm"]))
    return [emit("transpose", gs[0], perm=inv)]


register("transpose", _transpose_infer, normalize=_transpose_norm, grad=_transpose_grad,
         reference=lambda xs, a: [xs[0].transpose(a["perm"]).copy()], amp="clear",
         samples=lambda: float_samples(lambda dt: [([rand(3, 4, dtype=dt)], {"perm": (1, 0)}),
                                                   ([rand(2, 3, 4, dtype=dt)], {"perm": (2, 0, 1)})]),
         doc="out = x with axes permuted by perm")


def _detach_infer(inputs, attrs):
    check_arity("detach", inputs, 1)
    return [(inputs[0].shape, inputs[0].dtype)]


register("detach", _detach_infer, grad=lambda n, gs, emit: [None],
         reference=lambda xs, a: [xs[0].copy()], amp="clear",
         amp_note="not in OneFlow's lists (its detach is a tensor method, not a user op); a copy "
                  "moves data only, so it keeps its input's dtype, like identity",
         samples=lambda: float_samples(lambda dt: [([rand(3, 4, dtype=dt)], {})]),
         doc="out = x, with no gradient to x (Tensor.detach in a graph)")


# ------------------------------------------------------------------------------ creation
def _ones_like_infer(inputs, attrs):
    check_arity("ones_like", inputs, 1)
    return [(inputs[0].shape, inputs[0].dtype)]


register("ones_like", _ones_like_infer, grad=lambda n, gs, emit: [None],
         reference=lambda xs, a: [np.ones(xs[0].shape)], amp="clear", shape_inputs=(0,),
         samples=lambda: float_samples(lambda dt: [([rand(2, 3, dtype=dt)], {}),
                                                   ([rand(dtype=dt)], {})]),
         doc="out = 1 with the shape/dtype of x (x is a real input, as in OneFlow)")


def _constant_norm(inputs, attrs):
    attrs["value"] = float(attrs["value"])
    attrs["shape"] = tuple(int(s) for s in attrs.get("shape", ()))
    attrs["dtype"] = as_dtype(attrs.get("dtype", "float32"))
    return attrs


def _constant_infer(inputs, attrs):
    check_arity("constant", inputs, 0)
    return [(attrs["shape"], attrs["dtype"])]


register("constant", _constant_infer, normalize=_constant_norm, grad=lambda n, gs, emit: [],
         reference=lambda xs, a: [rounded(np.full(a["shape"], a["value"]), a["dtype"])],
         amp=None, amp_note="creation op with a dtype attribute and no input to take a color from",
         samples=lambda: [([], {"value": 3.0, "shape": (2, 3), "dtype": d})
                          for d in ("float32", "float16")]
         + [([], {"value": 65536.0, "shape": (1,), "dtype": "float16"})],
         doc="out = value, filled, with attrs shape and dtype")


# ------------------------------------------------------------------------------ cast
def _cast_norm(inputs, attrs):
    attrs["dtype"] = as_dtype(attrs["dtype"])
    return attrs


def _cast_infer(inputs, attrs):
    check_arity("cast", inputs, 1)
    return [(inputs[0].shape, attrs["dtype"])]


def _cast_grad(n, gs, emit):
    x = n.inputs[0]
    if not x.dtype.is_float:
        return [None]
    return [emit("cast", gs[0], dtype=x.dtype)]


def _cast_samples():
    special = np.array([65504, 65519.99, 65520, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26,
                        np.inf, -np.inf, np.nan, -1.5, 0.0], np.float32)
    with np.errstate(over="ignore"):  # 65520 overflows float16 on purpose
        special16 = special.astype(np.float16)
    out = [([special], {"dtype": "float16"}), ([rand(7, 3)], {"dtype": "float16"}),
           ([special16], {"dtype": "float32"}),
           ([rand(3, 2, dtype=np.float16)], {"dtype": "float32"}),
           ([np.arange(5, dtype=np.int64)], {"dtype": "float32"})]
    return out


register("cast", _cast_infer, normalize=_cast_norm, grad=_cast_grad, samples=_cast_samples,
         reference=lambda xs, a: [rounded(xs[0], a["dtype"])], amp=None,
         amp_note="changes dtype on purpose; the AMP pass inserts the casts it needs itself",
         doc="out = x converted to attrs dtype (f32->f16 rounds to nearest even)")



# ------------------------------------------------------------------------------ cast_like
def _cast_like_infer(inputs, attrs):
    check_arity("cast_like", inputs, 2)
    x, like = inputs
    for name, v in (("in", x), ("dtype_like", like)):
        if not v.dtype.is_float:
            raise TypeError(f"cast_like: {name} must be floating, got {v.type_str} (cast an "
                            f"int64 tensor with op cast: x.to(dtype))")
    return [(x.shape, like.dtype)]


def _cast_like_samples():
    x32, x16 = rand(7, 3), rand(7, 3, dtype=np.float16)
    special = _cast_samples()[0][0][0]     # f32 values at float16's rounding edges
    return [([x32, rand(2, dtype=np.float16)], {}), ([x16, rand(1)], {}),
            ([special, rand(3, 2, dtype=np.float16)], {}), ([x32, rand(2)], {}),
            ([np.zeros((0, 2), np.float32), rand(1, dtype=np.float16)], {})]


register("cast_like", _cast_like_infer,
         grad=lambda n, gs, emit: [emit("cast", gs[0], dtype=n.inputs[0].dtype), None],
         samples=_cast_like_samples, reference=lambda xs, a: [xs[0]], round_outputs=True,
         amp=None, shape_inputs=(1,),
         amp_note="in no OneFlow list; dtype_like gives the dtype only and is never cast, so the "
                  "output is dtype_like's after the AMP pass (float16 when a white node made it)",
         no_cast_inputs={1: "dtype_like"},
         doc="out = in converted to dtype_like's dtype (OneFlow's cast_like; torch's type_as "
             "inside a graph), rounded to nearest even")
