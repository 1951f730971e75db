"""``reduce_max`` and ``argmax`` over one axis (OneFlow's op names; PyTorch's ``Tensor.max(dim)``
returns both), ``reduce_max_grad``, and ``top_k`` (OneFlow's op, ``Tensor.topk``'s indices).

* ``reduce_max(x)`` {axis, keepdims False}: the maximum along ``axis``, NaN if the slice holds a
  NaN (PyTorch's and NumPy's); x floating point or int64 (exact, no gradient). An empty axis is an
  error (PyTorch: "Expected reduction dim to have non-zero size").
* ``argmax(x)`` {axis, keepdims False}: int64 index of the first maximum along ``axis`` (of the
  first NaN if there is one, as PyTorch), no gradient; x floating point or int64.
* ``reduce_max_grad(x, y, dy)`` {axis, keepdims}: ``dx = dy`` shared equally by the elements equal
  to the maximum ``y`` (OneFlow's ``reduce_max`` backward: ``dy * (x == y) / count``); where the
  maximum is NaN, by the NaN elements.

* ``top_k(x)`` {k, largest True}: the int64 indices of the ``k`` largest (``largest`` False:
  smallest) elements along the last axis (x floating point or int64), best first; NaN counts as
  larger than every number (so it comes first when ``largest``, last otherwise, as PyTorch's
  ``topk``), equal elements keep the lower index first. OneFlow's ``top_k``
  (``oneflow/user/ops/top_k_op.cpp``; its ``sorted`` attribute is always true here). No gradient:
  ``Tensor.topk`` reads the values with
  ``dim_gather``, whose gradient reaches x.

* ``cumsum(x)`` {dim}: the running sum along ``dim`` (``out[..., j, ...] = sum of x[..., :j+1,
  ...]``), summed in order in float64 for float64 and in float32 for the other floating dtypes,
  each output rounded once, in int64 for int64 (wrapping, no gradient) (OneFlow's ``cumsum``,
  PyTorch's ``torch.cumsum``); its gradient is
  ``cumsum_grad(dy)`` {dim}: the running sum from the end (OneFlow's ``cumsum_grad``).

* ``cumprod(x)`` {dim}: the running product along ``dim`` (``out[..., j, ...]`` = the product
  of ``x[..., :j+1, ...]``), in order, in the compute type as ``cumsum`` (int64 wraps, as
  PyTorch's; OneFlow's ``cumprod``, ``torch.cumprod``); its gradient is ``cumprod_grad(dy, x)``
  {dim}: ``dx[k] = sum over i >= k of dy[i] * prod of x[j] for j <= i, j != k``, as PyTorch's
  also where the row holds zeros. OneFlow's ``cumprod_grad`` takes ``y`` too and divides by
  ``x`` before the first zero; this one needs no ``y`` and no division: ``dx[k] = p[k] *
  s[k]``, ``p[k]`` the product of ``x[:k]`` and ``s[k] = dy[k] + x[k+1] * s[k+1]`` from the
  end (two passes in the compute type, exact where the row holds zeros).

In none of OneFlow's AMP lists: they run in float32 under AMP.
"""
from __future__ import annotations

import numbers

import numpy as np

from ..dtype import int64
from .common import check_arity, check_float, float_or_int64, float_samples, fmt, rand
from .registry import register

__all__ = ["reduce_max_reference", "argmax_reference", "top_k_reference", "cumsum_reference",
           "cumprod_reference"]


def _norm(op):
    def norm(inputs, attrs):
        ndim = len(inputs[0].shape) if inputs else 0
        axis = attrs.get("axis", -1)
        if isinstance(axis, (tuple, list)) and len(axis) == 1:
            axis = axis[0]
        if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
            raise TypeError(f"{op}: axis must be one int (miniflow reduces one axis), got "
                            f"{axis!r}")
        if not -max(ndim, 1) <= axis < max(ndim, 1) or ndim == 0:
            raise ValueError(f"{op}: axis {axis} is out of range for a tensor of rank {ndim}")
        return {"axis": int(axis) % ndim, "keepdims": bool(attrs.get("keepdims", False))}
    return norm


def _out_shape(shape, attrs):
    a = attrs["axis"]
    return shape[:a] + ((1,) if attrs["keepdims"] else ()) + shape[a + 1:]


def _infer(op):
    def infer(inputs, attrs):
        check_arity(op, inputs, 1)
        x = inputs[0]
        float_or_int64(op, x)
        if x.shape[attrs["axis"]] == 0:
            raise ValueError(f"{op}: Expected reduction dim {attrs['axis']} to have non-zero "
                             f"size, got {fmt(x)}")
        return [(_out_shape(x.shape, attrs), x.dtype if op == "reduce_max" else int64)]
    return infer


def reduce_max_reference(arrays, attrs):
    """``[max]`` of ``arrays[0]`` along ``attrs["axis"]`` in float64 (NaN propagates)."""
    return [np.max(arrays[0], axis=attrs["axis"], keepdims=attrs["keepdims"])]


def argmax_reference(arrays, attrs):
    """``[argmax]`` (int64), the first NaN counting as the maximum."""
    x, a = arrays[0], attrs["axis"]
    nan = np.isnan(x)
    idx = np.where(nan.any(axis=a), np.argmax(nan, axis=a), np.argmax(np.where(nan, 0, x), axis=a))
    return [np.expand_dims(idx, a) if attrs["keepdims"] else idx]


def _grad(n, gs, emit):
    return [emit("reduce_max_grad", n.inputs[0], n.outputs[0], gs[0], **n.attrs)]


def _grad_infer(inputs, attrs):
    op = "reduce_max_grad"
    check_arity(op, inputs, 3)
    x, y, dy = inputs
    check_float(op, x, y, dy)
    want = _out_shape(x.shape, attrs)
    if y.shape != want or dy.shape != want:
        raise ValueError(f"{op}: y {fmt(y)} and dy {fmt(dy)} must have the reduced shape "
                         f"{list(want)} of x {fmt(x)}")
    return [(x.shape, x.dtype)]


def _grad_reference(arrays, attrs):
    x, y, dy = arrays
    a = attrs["axis"]
    yk, dyk = (v if attrs["keepdims"] else np.expand_dims(v, a) for v in (y, dy))
    hit = (x == yk) | (np.isnan(x) & np.isnan(yk))
    return [hit * dyk / hit.sum(axis=a, keepdims=True)]


def _samples():
    def make(dt):
        r = np.random.default_rng(43)
        return [([rand(3, 4, 5, dtype=dt, r=r)], {"axis": 1}),
                ([rand(4, 6, dtype=dt, r=r)], {"axis": -1, "keepdims": True}),
                ([np.array([[1.0, 3.0, 3.0], [np.nan, 2.0, 5.0], [-np.inf, -np.inf, -1.0]], dt)],
                 {"axis": 1}),
                ([rand(0, 3, dtype=dt, r=r)], {"axis": 1})]
    big = 2 ** 62
    ints = np.array([[3, -big, big + 1, big], [-5, -5, -7, -big]], np.int64)
    return float_samples(make) + [([ints], {"axis": 1}), ([ints], {"axis": 0, "keepdims": True})]


def _grad_samples():
    def make(dt):
        r = np.random.default_rng(44)
        out = []
        for x, attrs in ((rand(3, 4, 5, dtype=dt, r=r), {"axis": 1, "keepdims": False}),
                         (np.array([[1.0, 3.0, 3.0], [0.0, 2.0, 5.0]], dt),
                          {"axis": 1, "keepdims": True})):
            y = np.max(x, axis=attrs["axis"], keepdims=attrs["keepdims"])
            out.append(([x, y, rand(*y.shape, dtype=dt, r=r)], attrs))
        return out
    return float_samples(make)


def _top_k_norm(inputs, attrs):
    k = attrs.get("k")
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"top_k: k must be an int, got {k!r}")
    return {"k": int(k), "largest": bool(attrs.get("largest", True))}


def _top_k_infer(inputs, attrs):
    op = "top_k"
    check_arity(op, inputs, 1)
    x = inputs[0]
    float_or_int64(op, x)
    k = attrs["k"]
    if not x.shape or not 0 <= k <= x.shape[-1]:
        raise ValueError(f"top_k: selected index k out of range: k={k} for x {fmt(x)} (top_k "
                         f"selects along the last axis of a tensor of rank >= 1)")
    return [(x.shape[:-1] + (k,), int64)]


def top_k_reference(arrays, attrs):
    """``[indices]`` (int64) of the ``k`` best along the last axis, by a lexicographic sort of
    (NaN or not, the value, the position): NaN above every number, equal elements in index
    order. Any real dtype (``Tensor.topk`` of an eager int64 tensor uses it too)."""
    x = arrays[0]
    integral = x.dtype.kind in "iu"         # bfloat16 (ml_dtypes) is kind "V": a float too
    nan = np.zeros(x.shape, bool) if integral else np.isnan(x)
    value = x if integral else np.where(nan, 0.0, x.astype(np.float64))
    down = ~value if integral else -value        # ~v = -v - 1: no int64 overflow
    position = np.broadcast_to(np.arange(x.shape[-1]), x.shape)
    keys = (position, down, ~nan) if attrs["largest"] else (position, value, nan)
    return [np.lexsort(keys, axis=-1)[..., :attrs["k"]].astype(np.int64)]


def _top_k_samples():
    def make(dt):
        r = np.random.default_rng(45)
        ties = np.array([[1.0, np.nan, 3.0, 3.0, -np.inf, np.nan], [2.0, 2.0, 2.0, 0.0, 1.0, 2.0]],
                        dt)
        long = r.integers(-3, 4, (3, 40)).astype(dt)     # many ties, past the insertion's k
        long.flat[r.choice(long.size, 24, replace=False)] = [np.nan, np.inf, -np.inf, -0.0] * 6
        return [([rand(3, 4, 7, dtype=dt, r=r)], {"k": 3}),
                ([long], {"k": 40}), ([long], {"k": 20, "largest": False}),
                ([rand(5, 9, dtype=dt, r=r)], {"k": 9, "largest": False}),
                ([ties], {"k": 4}), ([ties], {"k": 5, "largest": False}),
                ([rand(2, 4, dtype=dt, r=r)], {"k": 0}), ([rand(0, 4, dtype=dt, r=r)], {"k": 2}),
                ([rand(6, dtype=dt, r=r)], {"k": 1})]
    ints = np.array([[5, -2 ** 62, 2 ** 62 + 1, 2 ** 62, 5, 0]], np.int64)
    return float_samples(make) + [([ints], {"k": 4}), ([ints], {"k": 3, "largest": False})]


_NOTE = "in none of OneFlow's lists: stays float32 under AMP"

register("reduce_max", _infer("reduce_max"), normalize=_norm("reduce_max"), grad=_grad,
         reference=reduce_max_reference, samples=_samples, amp=None, amp_note=_NOTE,
         doc="out = max of x along axis (NaN propagates)")
register("argmax", _infer("argmax"), normalize=_norm("argmax"),
         grad=lambda n, gs, emit: [None], reference=argmax_reference, samples=_samples,
         amp=None, amp_note=_NOTE + " (its output is int64)",
         doc="out = int64 index of the first maximum of x along axis")
register("reduce_max_grad", _grad_infer, normalize=_norm("reduce_max_grad"),
         reference=_grad_reference, samples=_grad_samples, amp=None, amp_note=_NOTE,
         doc="dx = dy shared equally by the elements of x equal to the maximum y")
register("top_k", _top_k_infer, normalize=_top_k_norm, grad=lambda n, gs, emit: [None],
         reference=top_k_reference, samples=_top_k_samples, amp=None,
         amp_note=_NOTE + " (its output is int64)",
         doc="out = int64 indices of the k largest (largest False: smallest) of x along the last "
             "axis, best first")


def _cumsum_norm(op):
    def normalize(inputs, attrs):
        dim = attrs.get("dim")
        if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
            raise TypeError(f"{op}: dim must be an int, got {dim!r}")
        ndim = len(inputs[0].shape) if inputs else 1
        if not -max(ndim, 1) <= dim < max(ndim, 1):
            raise ValueError(f"{op}: dim {dim} is out of range for a tensor of rank {ndim}")
        return {"dim": int(dim) % max(ndim, 1)}
    return normalize


def _cumsum_infer(op):
    def infer(inputs, attrs):
        check_arity(op, inputs, 1)
        (float_or_int64 if op in ("cumsum", "cumprod") else check_float)(op, inputs[0])
        if not inputs[0].shape:
            raise ValueError(f"{op}: x {fmt(inputs[0])} needs a dimension (reshape a 0-d x to "
                             f"[1])")
        return [(inputs[0].shape, inputs[0].dtype)]
    return infer


def cumsum_reference(arrays, attrs):
    """``[running sum]`` of ``arrays[0]`` along ``attrs["dim"]`` in float64."""
    return [np.cumsum(arrays[0], axis=attrs["dim"])]


def _cumsum_grad_reference(arrays, attrs):
    flipped = np.flip(arrays[0], axis=attrs["dim"])
    return [np.flip(np.cumsum(flipped, axis=attrs["dim"]), axis=attrs["dim"])]


def _cumsum_samples():
    def make(dt):
        r = np.random.default_rng(46)
        edge = np.array([[1.0, np.nan, 3.0], [np.inf, -np.inf, 2.0], [6e4, 6e4, -6e4]], dt)
        return [([rand(3, 4, 5, dtype=dt, r=r)], {"dim": 1}),
                ([rand(2, 70, dtype=dt, r=r)], {"dim": -1}), ([edge], {"dim": 1}),
                ([edge], {"dim": 0}), ([rand(0, 3, dtype=dt, r=r)], {"dim": 1}),
                ([rand(7, dtype=dt, r=r)], {"dim": 0})]
    return float_samples(make)


def _cumsum_int_samples():
    ints = np.array([[2 ** 62, 2 ** 53 + 1, -3], [-7, 5, 2 ** 62 - 1]], np.int64)
    return _cumsum_samples() + [([ints], {"dim": 0}), ([ints], {"dim": 1})]


register("cumsum", _cumsum_infer("cumsum"), normalize=_cumsum_norm("cumsum"),
         grad=lambda n, gs, emit: [emit("cumsum_grad", gs[0], dim=n.attrs["dim"])],
         reference=cumsum_reference, samples=_cumsum_int_samples, amp=None, amp_note=_NOTE,
         doc="out = running sum of x along dim; dx = cumsum_grad(dy)")
register("cumsum_grad", _cumsum_infer("cumsum_grad"), normalize=_cumsum_norm("cumsum_grad"),
         reference=_cumsum_grad_reference, samples=_cumsum_samples, amp=None, amp_note=_NOTE,
         doc="dx = running sum of dy along dim from the end")


def cumprod_reference(arrays, attrs):
    """``[running product]`` of ``arrays[0]`` along ``attrs["dim"]`` (float64; int64 wraps)."""
    return [np.cumprod(arrays[0], axis=attrs["dim"])]


def _cumprod_grad_infer(inputs, attrs):
    op = "cumprod_grad"
    check_arity(op, inputs, 2)
    dy, x = inputs
    check_float(op, dy, x)
    if dy.shape != x.shape or not x.shape:
        raise ValueError(f"{op}: dy {fmt(dy)} and x {fmt(x)} must have one shape of rank >= 1")
    return [(x.shape, x.dtype)]


def _cumprod_grad_reference(arrays, attrs):
    """``dx[k] = sum over i >= k of dy[i] * prod of x[j], j <= i, j != k``, term by term in
    float64 (exact where x holds zeros)."""
    dy, x = (np.moveaxis(a, attrs["dim"], -1) for a in arrays)
    dx = np.empty(x.shape)
    for k in range(x.shape[-1]):
        others = x.copy()
        others[..., k] = 1.0
        dx[..., k] = (np.cumprod(others, axis=-1) * dy)[..., k:].sum(axis=-1)
    return [np.moveaxis(dx, -1, attrs["dim"])]


def _cumprod_samples():
    def make(dt):
        r = np.random.default_rng(48)
        edge = np.array([[1.5, np.nan, 3.0], [np.inf, -2.0, 0.0], [300.0, 300.0, -0.5]], dt)
        return [([rand(3, 4, 5, dtype=dt, r=r, lo=0.5, hi=1.5)], {"dim": 1}),
                ([rand(2, 70, dtype=dt, r=r, lo=0.9, hi=1.1)], {"dim": -1}),
                ([edge], {"dim": 1}), ([edge], {"dim": 0}),
                ([rand(0, 3, dtype=dt, r=r)], {"dim": 1}), ([rand(7, dtype=dt, r=r)], {"dim": 0})]
    ints = np.array([[3, -2, 2 ** 31, 2 ** 31 + 1], [0, 5, -1, 7]], np.int64)
    return float_samples(make) + [([ints], {"dim": 1}), ([ints], {"dim": 0})]


def _cumprod_grad_samples():
    def make(dt):
        r = np.random.default_rng(49)
        zeros = np.array([[0.0, 1.5, -0.5, 2.0], [1.5, 0.0, 0.5, 0.0], [0.5, -1.5, 2.0, 0.0],
                          [1.25, -0.75, 1.5, 0.5]], dt)
        return [([rand(4, 4, dtype=dt, r=r), zeros], {"dim": 1}),
                ([rand(4, 4, dtype=dt, r=r), zeros], {"dim": 0}),
                ([rand(3, 2, 6, dtype=dt, r=r), rand(3, 2, 6, dtype=dt, r=r, lo=0.5, hi=1.5)],
                 {"dim": 2}),
                ([rand(0, 3, dtype=dt, r=r), rand(0, 3, dtype=dt, r=r)], {"dim": 1})]
    return float_samples(make)


def _cumprod_grad(n, gs, emit):
    return [emit("cumprod_grad", gs[0], n.inputs[0], dim=n.attrs["dim"])]


register("cumprod", _cumsum_infer("cumprod"), normalize=_cumsum_norm("cumprod"),
         grad=_cumprod_grad, reference=cumprod_reference, samples=_cumprod_samples, amp=None,
         amp_note=_NOTE, doc="out = running product of x along dim; dx = cumprod_grad(dy, x)")
register("cumprod_grad", _cumprod_grad_infer, normalize=_cumsum_norm("cumprod_grad"),
         reference=_cumprod_grad_reference, samples=_cumprod_grad_samples, amp=None,
         amp_note=_NOTE, doc="dx[k] = sum over i >= k of dy[i] * prod of x[j <= i, j != k]")
