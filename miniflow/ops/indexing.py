"""Indexing ops: ``gather`` (embeddings) with its gradient ``unsorted_segment_sum_like``,
``dim_gather`` (``torch.gather``) with its gradient ``dim_scatter_add_like``, ``dim_scatter_update``
(``_scalar``) and ``dim_scatter_add`` (``torch.scatter``, ``scatter_add``), ``slice`` (basic
indexing ``x[a:b:s, ...]``) with ``slice_grad``, ``slice_update`` (``x[a:b:s, ...] = v``),
``cat``, ``tril`` (the causal mask) and ``masked_fill``. OneFlow's op names, inputs and
attributes (``oneflow/user/ops/gather_op.cpp``, ``unsorted_segment_sum_op.cpp``,
``dim_gather_op.cpp``, ``dim_scatter_ops.cpp``, ``slice_op.cpp``, ``concat_op.cpp``,
``tril_op.cpp``, ``masked_fill``); PyTorch's semantics (``torch.index_select`` /
``nn.Embedding``, ``torch.gather``, basic slicing and its assignment, ``torch.cat``,
``torch.tril``, ``Tensor.masked_fill``).

* ``gather(in, indices)`` {axis 0}: ``out = in`` indexed by the int64 ``indices`` along ``axis``,
  shape ``in.shape[:axis] + indices.shape + in.shape[axis + 1:]``; ``in`` floating point or
  int64 (no gradient; OneFlow's takes any dtype). An index outside ``[0, in.shape[axis])`` is
  an error (the CPU kernel raises and the executor names the first offending index and where it
  is; a CUDA kernel cannot raise and writes NaN there instead, int64: the conversion of NaN, as
  the cross-entropy kernels do for a bad label). Gradient (OneFlow's ``gather`` backward):
  ``unsorted_segment_sum_like(dy, indices, in)``.
* ``unsorted_segment_sum_like(data, segment_ids, like)`` {axis 0}: ``out`` of like's shape, zero,
  plus ``data[..., j, ...]`` added at ``out[..., segment_ids[j], ...]`` for every j (a scatter-add;
  repeated ids accumulate, in the compute type; ids outside ``[0, like.shape[axis])`` are
  dropped, as TensorFlow's and OneFlow's segment sums do).
* ``dim_gather(input, index)`` {dim 0} (OneFlow's ``dim_gather_op.cpp``, ``torch.gather``):
  ``out[i][j][k] = input[index[i][j][k]][j][k]`` for dim 0 (and so on): ``out`` has index's
  shape; the int64 index has input's rank and no size larger than input's off ``dim``; input is
  floating point or int64 (no gradient). An index value outside ``[0, input.shape[dim])``
  (negative ones too, as PyTorch refuses them) is an error as for ``gather``: the CPU kernel
  raises, the executor names it; CUDA writes NaN there (int64: the conversion of NaN).
  Gradient: ``dim_scatter_add_like(input, index, dy)``.
* ``dim_scatter_add_like(like, index, src)`` {dim 0} (OneFlow's, ``torch.scatter_add`` into
  zeros): ``out`` of like's shape, zero, plus ``src[i][j][k]`` added at ``out[index[i][j][k]][j]
  [k]`` for dim 0 (repeated indices accumulate, in the compute type; indices outside ``[0,
  like.shape[dim])`` are dropped, as by ``unsorted_segment_sum_like``). Gradient of src:
  ``dim_gather(dy, index)``.
* ``dim_scatter_update(input, index, src)`` {dim 0} (OneFlow's ``dim_scatter_ops.cpp``,
  ``torch.scatter``): ``out = input`` with ``out[index[i][j][k]][j][k] = src[i][j][k]`` for dim
  0 (and so on), the elements of index in C order, so the last of repeated places wins (PyTorch
  leaves it undefined); ``dim_scatter_update_scalar(input, index)`` {src_scalar 0.0, dim 0}
  writes ``src_scalar`` (in input's dtype) instead; ``dim_scatter_add(input, index, src)`` {dim
  0} (``torch.scatter_add``) adds src there (``out = input + dim_scatter_add_like``). Index as
  for ``dim_gather``, src (input's dtype: floating point or int64, no gradient) of index's
  shape (``Tensor.scatter`` slices a larger src, which PyTorch reads the first elements of); an
  index out of range is an error as for ``dim_gather`` (CUDA: dropped). Gradients (OneFlow's
  ``gradient_funcs/dim_scatter.cpp``, PyTorch's): src ``dim_gather(dy, index)``; input ``dy``
  for the add, ``dim_scatter_update_scalar(dy, index)`` with 0 (the overwritten places get none)
  for the updates.
* ``slice(x)`` {start, stop, step: one int per axis, Python's slice rules, step > 0}: ``out =
  x[start_0:stop_0:step_0, ...]``; the attributes are normalised to the in-range form
  ``slice(...).indices(n)`` gives. Gradient: ``slice_grad(dy)`` {like_shape, start, stop, step}:
  zeros of ``like_shape`` with ``dy`` written at the slice.
* ``slice_update(ref, value)`` {start, stop, step as ``slice``} (OneFlow's ``slice_update``, what
  its ``tensor_setitem`` records for ``x[key] = value``): ``out = ref`` with ``value`` (ref's
  dtype, exactly the slice's shape) written at ``ref[start:stop:step, ...]``; a value, not an
  in-place write. Gradient: ref gets ``slice_update(dy, zeros)`` (dy with the slice zeroed),
  value ``slice(dy)``.
* ``cat(x0, x1, ...)`` {axis 0}: the inputs (one floating dtype or int64, the same shape but
  along ``axis``) joined along ``axis`` (OneFlow's ``cat``, ``torch.cat``). Gradient: one
  ``slice`` of ``dy`` per input.
  Autograd emits it for the gradient of a tensor whose slices tile it along one axis (the q, k,
  v split of attention): one copy per part instead of zero-filled ``slice_grad`` s and an
  ``add_n``.
* ``tril(x)`` {diagonal 0, fill_value 0.0}: ``out[..., i, j] = x[..., i, j]`` where
  ``j - i <= diagonal``, else ``fill_value`` (``-inf`` makes it the causal mask of attention
  scores). Gradient: ``tril(dy)`` with fill 0.
* ``masked_fill(x, mask)`` {value}: ``out = value`` where the int64 ``mask`` (broadcast to x's
  shape; nonzero is True, miniflow's stand-in for a bool tensor) is set, else ``x``. Gradient:
  ``masked_fill(dy, mask)`` with value 0.
"""
from __future__ import annotations

import numbers

import numpy as np

from ..dtype import int64
from ..ir import format_shape
from .common import check_arity, check_float, float_or_int64, float_samples, fmt, rand
from .registry import register

__all__ = ["slice_attrs", "slice_index", "first_bad", "cat_slices"]


def _int_attr(op, name, v):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{op}: {name} must be an int, got {v!r}")
    return int(v)


def _axis(op, attrs, ndim):
    a = _int_attr(op, "axis", attrs.get("axis", 0))
    if not -ndim <= a < ndim:
        raise ValueError(f"{op}: axis {a} is out of range for a tensor of rank {ndim}")
    return a % ndim


def _check_indices(op, name, v):
    if v.dtype is not int64:
        raise TypeError(f"{op}: {name} {fmt(v)} must be int64 (convert with "
                        f".astype(np.int64), or miniflow.tensor(ids, dtype=miniflow.int64))")


# ------------------------------------------------------------------------------ gather
def _gather_infer(inputs, attrs):
    op = "gather"
    check_arity(op, inputs, 2)
    x, idx = inputs
    dt = float_or_int64(op, x)
    _check_indices(op, "indices", idx)
    axis = attrs["axis"]
    return [(x.shape[:axis] + idx.shape + x.shape[axis + 1:], dt)]


def first_bad(idx: np.ndarray, n: int, low: int = 0):
    """``(position, value, count)`` of the first index of the integer array ``idx`` outside
    ``[low, n)``, or None. ``value`` is a Python int of the index as given: check an unsigned
    array before casting it to int64 (a uint64 index >= 2**63 would turn negative)."""
    bad = np.flatnonzero((idx < low) | (idx >= n))
    if not bad.size:
        return None
    pos = tuple(int(p) for p in np.unravel_index(int(bad[0]), idx.shape))
    return pos, int(idx.reshape(-1)[bad[0]]), int(bad.size)


def _out_of_range(op, idx, n, axis, shape) -> str | None:
    found = first_bad(idx, n)
    if found is None:
        return None
    pos, value, count = found
    return (f"{op}: index {value} at indices{list(pos)} is out of range [0, {n}) of axis "
            f"{axis} of {format_shape(shape)} ({count} of {idx.size} indices out of range)")


def _gather_reference(arrays, attrs):
    x, idx = arrays
    msg = _out_of_range("gather", idx, x.shape[attrs["axis"]], attrs["axis"], x.shape)
    if msg is not None:
        raise ValueError(msg)
    return [np.take(x, idx, axis=attrs["axis"])]


def _gather_diagnose(node, arrays):
    x = node.inputs[0]
    return _out_of_range("gather", arrays[1], x.shape[node.attrs["axis"]], node.attrs["axis"],
                         x.shape)


def _gather_samples():
    def make(dt):
        r = np.random.default_rng(31)
        return [([rand(5, 3, dtype=dt, r=r), np.array([4, 0, 2, 0], np.int64)], {"axis": 0}),
                ([rand(2, 5, 3, dtype=dt, r=r), r.integers(0, 5, (2, 3)).astype(np.int64)],
                 {"axis": 1}),
                ([rand(4, 6, dtype=dt, r=r), np.array(5, np.int64)], {"axis": 1}),
                ([rand(3, 2, dtype=dt, r=r), np.zeros(0, np.int64)], {"axis": 0}),
                ([np.array([[np.nan, 1.0], [np.inf, 2.0]], dt), np.array([1, 0, 1], np.int64)],
                 {"axis": 0})]
    r = np.random.default_rng(32)
    return float_samples(make) + [
        ([r.integers(-2 ** 62, 2 ** 62, (4, 3)), np.array([3, 0, 0, 2], np.int64)], {"axis": 0}),
        ([r.integers(-50, 50, (2, 5)), np.array([[4], [1]], np.int64)], {"axis": 1})]


def _gather_grad(n, gs, emit):
    if n.inputs[0].dtype is int64:
        return [None, None]
    return [emit("unsorted_segment_sum_like", gs[0], n.inputs[1], n.inputs[0],
                 axis=n.attrs["axis"]), None]


register("gather", _gather_infer,
         normalize=lambda ins, a: {"axis": _axis("gather", a, len(ins[0].shape) if ins else 1)},
         grad=_gather_grad,
         reference=_gather_reference, samples=_gather_samples, diagnose=_gather_diagnose,
         amp="clear", doc="out = in indexed by int64 indices along axis (embedding lookup)")


def _segment_infer(inputs, attrs):
    op = "unsorted_segment_sum_like"
    check_arity(op, inputs, 3)
    data, ids, like = inputs
    dt = check_float(op, data)
    _check_indices(op, "segment_ids", ids)
    axis = attrs["axis"]
    want = like.shape[:axis] + ids.shape + like.shape[axis + 1:]
    if data.shape != want:
        raise ValueError(f"{op}: data {fmt(data)} must have shape {format_shape(want)} "
                         f"(like {fmt(like)} with axis {axis} replaced by segment_ids' shape "
                         f"{format_shape(ids.shape)})")
    return [(like.shape, dt)]


def _segment_reference(arrays, attrs):
    data, ids, like = arrays
    axis, n = attrs["axis"], like.shape[attrs["axis"]]
    moved = np.moveaxis(data.reshape(like.shape[:axis] + (-1,) + like.shape[axis + 1:]), axis, 0)
    out = np.zeros((n,) + moved.shape[1:])
    flat = ids.reshape(-1)
    keep = (flat >= 0) & (flat < n)
    np.add.at(out, flat[keep], moved[keep])
    return [np.moveaxis(out, 0, axis)]


def _segment_samples():
    def make(dt):
        r = np.random.default_rng(33)
        return [([rand(4, 3, dtype=dt, r=r), np.array([4, 0, 2, 0], np.int64),
                  rand(5, 3, dtype=dt, r=r)], {"axis": 0}),
                ([rand(2, 2, 3, 3, dtype=dt, r=r), r.integers(0, 5, (2, 3)).astype(np.int64),
                  rand(2, 5, 3, dtype=dt, r=r)], {"axis": 1}),
                ([rand(0, 2, dtype=dt, r=r), np.zeros(0, np.int64), rand(3, 2, dtype=dt, r=r)],
                 {"axis": 0}),
                ([np.full((300, 1), 0.1, dt), np.zeros(300, np.int64), rand(2, 1, dtype=dt, r=r)],
                 {"axis": 0})]
    return float_samples(make)


register("unsorted_segment_sum_like", _segment_infer,
         normalize=lambda ins, a: {"axis": _axis("unsorted_segment_sum_like", a,
                                                 len(ins[2].shape) if len(ins) > 2 else 1)},
         grad=lambda n, gs, emit: [emit("gather", gs[0], n.inputs[1], axis=n.attrs["axis"]),
                                   None, None],
         reference=_segment_reference, samples=_segment_samples, shape_inputs=(2,), amp=None,
         amp_note="in none of OneFlow's lists: the scatter-add of an embedding's gradient stays "
                  "in float32, the dtype of the float32 weight it is the gradient of",
         doc="out (like's shape) = 0 + data scattered and summed at segment_ids along axis")


# ------------------------------------------------------------------------------ dim_gather
def _dim_norm(op, rank_of, scalar=False):
    def normalize(ins, attrs):
        out = {"dim": _axis(op, {"axis": attrs.get("dim", 0)}, max(rank_of(ins), 1))}
        if scalar:
            out["src_scalar"] = float(attrs.get("src_scalar", 0.0))
        return out
    return normalize


def _input_rank(ins):
    return len(ins[0].shape) if ins else 1


def _check_dim_index(op, index, target, dim, what):
    """An int64 index of the rank of ``target`` whose sizes are at most target's off ``dim``."""
    _check_indices(op, "index", index)
    if len(index.shape) != len(target.shape) or any(
            i > t for d, (i, t) in enumerate(zip(index.shape, target.shape)) if d != dim):
        raise ValueError(f"{op}: index {fmt(index)} must have the rank of {what} {fmt(target)} "
                         f"and no size larger than its off dim {dim} (torch.gather's and "
                         f"torch.scatter's rule)")


def _dim_gather_infer(inputs, attrs):
    check_arity("dim_gather", inputs, 2)
    _check_dim_index("dim_gather", inputs[1], inputs[0], attrs["dim"], "input")
    return [(inputs[1].shape, float_or_int64("dim_gather", inputs[0]))]


def _dim_out_of_range(op, idx, x_shape, dim) -> str | None:
    n = x_shape[dim] if x_shape else 1
    return _out_of_range(op, idx, n, dim, x_shape)


def _dim_gather_reference(arrays, attrs):
    x, idx = arrays
    msg = _dim_out_of_range("dim_gather", idx, x.shape, attrs["dim"])
    if msg is not None:
        raise ValueError(msg)
    if x.ndim == 0:
        return [x[()] + np.zeros(idx.shape)]
    part = x[tuple(slice(None) if d == attrs["dim"] else slice(0, k)
                   for d, k in enumerate(idx.shape))]
    return [np.take_along_axis(part, idx, axis=attrs["dim"])]


def _int_samples(*shapes_and_indices):
    """int64 samples of a dim op: ``(input shape, index, dim)`` each, the values -50..49."""
    r = np.random.default_rng(47)
    return [([r.integers(-50, 50, shape).astype(np.int64), idx], {"dim": dim})
            for shape, idx, dim in shapes_and_indices]


def _dim_gather_samples():
    def make(dt):
        r = np.random.default_rng(41)
        return [([rand(4, 3, 2, dtype=dt, r=r), r.integers(0, 4, (6, 2, 2)).astype(np.int64)],
                 {"dim": 0}),
                ([rand(3, 5, dtype=dt, r=r), np.array([[4], [0], [2]], np.int64)], {"dim": 1}),
                ([rand(2, 5, 3, dtype=dt, r=r), r.integers(0, 3, (2, 4, 3)).astype(np.int64)],
                 {"dim": -1}),
                ([rand(3, 4, dtype=dt, r=r), np.zeros((3, 0), np.int64)], {"dim": 1}),
                ([np.array([[np.nan, 1.0], [np.inf, 2.0]], dt),
                  np.array([[1, 1, 0], [0, 1, 1]], np.int64)], {"dim": 1}),
                ([np.array(3.0, dt), np.array(0, np.int64)], {"dim": -1})]
    return float_samples(make) + _int_samples(((3, 5), np.array([[4, 0], [2, 2]]), 1))


def _dim_gather_grad(n, gs, emit):
    if n.inputs[0].dtype is int64:
        return [None, None]
    return [emit("dim_scatter_add_like", n.inputs[0], n.inputs[1], gs[0], dim=n.attrs["dim"]),
            None]


register("dim_gather", _dim_gather_infer, normalize=_dim_norm("dim_gather", _input_rank),
         grad=_dim_gather_grad, reference=_dim_gather_reference, samples=_dim_gather_samples,
         diagnose=lambda node, arrays: _dim_out_of_range("dim_gather", arrays[1],
                                                         node.inputs[0].shape, node.attrs["dim"]),
         amp=None,
         amp_note="in none of OneFlow's lists (dim_gather; its gather, the index_select, is "
                  "clear): it runs in float32 and stops white propagation",
         doc="out[..., j, ...] = input[..., index[..., j, ...], ...] along dim (torch.gather)")


# ------------------------------------------------------------------------------ dim_scatter
def _dim_scatter_infer(op):
    """Inference of ``op(input or like, index[, src])``: input and src of one floating dtype
    (or int64, but not ``dim_scatter_add_like``), index as for ``dim_gather``, src of index's
    shape (``Tensor.scatter`` slices a larger src first)."""
    def infer(inputs, attrs):
        check_arity(op, inputs, 2 if op.endswith("_scalar") else 3)
        x, idx, *src = inputs
        dt = (check_float(op, *src) if op.endswith("_like") else
              float_or_int64(op, x, *src))
        _check_dim_index(op, idx, x, attrs["dim"], "like" if op.endswith("_like") else "input")
        if src and src[0].shape != idx.shape:
            raise ValueError(f"{op}: src {fmt(src[0])} must have index's shape {fmt(idx)}")
        return [(x.shape, dt)]
    return infer


def _scatter_into(op, out, idx, src, dim, add):
    """``out[c with c[dim] = idx[c]] = src[c]`` (or ``+=``) for every multi-index c of idx, in
    C order (the last write wins): the float64 loop the kernels are checked against. An index
    outside ``[0, out.shape[dim])`` is a ValueError naming ``op``, or dropped for op None."""
    if op is not None:
        msg = _dim_out_of_range(op, idx, out.shape, dim)
        if msg is not None:
            raise ValueError(msg)
    flat_out = out.reshape(out.shape or (1,))
    n = flat_out.shape[dim]
    for c in np.ndindex(idx.shape):
        k = int(idx[c])
        if 0 <= k < n:
            at = tuple(k if d == dim else i for d, i in enumerate(c or (0,)))
            value = float(src[c] if np.ndim(src) else src)
            flat_out[at] = flat_out[at] + value if add else value
    return [out]


def _dim_scatter_reference(op, add):
    def reference(arrays, attrs):
        x, idx, *src = arrays
        out = np.zeros(x.shape) if op is None else np.array(x, np.float64)
        value = src[0] if src else attrs["src_scalar"]
        return _scatter_into(op, out, idx, value, attrs["dim"], add)
    return reference


def _dim_scatter_samples(scalar=False, seed=43):
    def make(dt):
        r = np.random.default_rng(seed)

        def src(*shape):
            return [] if scalar else [rand(*shape, dtype=dt, r=r)]
        unique = np.argsort(r.random((4, 2, 2)), axis=0)[:3]     # for finite differences
        return [([rand(4, 3, 2, dtype=dt, r=r), unique, *src(3, 2, 2)], {"dim": 0}),
                ([rand(4, 3, 2, dtype=dt, r=r), r.integers(0, 4, (6, 2, 2)).astype(np.int64),
                  *src(6, 2, 2)], {"dim": 0}),
                ([rand(3, 5, dtype=dt, r=r), np.array([[4], [0], [2]], np.int64),
                  *src(3, 1)], {"dim": 1}),
                ([rand(3, 4, dtype=dt, r=r), np.zeros((3, 0), np.int64), *src(3, 0)],
                 {"dim": -1}),
                ([rand(2, 3, dtype=dt, r=r), np.zeros((2, 300), np.int64),
                  *([] if scalar else [np.full((2, 300), 0.1, dt)])], {"dim": 1}),
                ([np.array(3.0, dt), np.array(0, np.int64), *src()], {"dim": 0})]
    attrs = {"src_scalar": 2.5} if scalar else {}
    return [(ins, {**a, **attrs}) for ins, a in float_samples(make)]


def _int_scatter_samples(scalar):
    """int64 samples of ``dim_scatter_update``, ``dim_scatter_add`` or the scalar update."""
    r = np.random.default_rng(53)
    idx = np.array([[4, 0, 4], [1, 1, 2]], np.int64)
    src = [] if scalar else [r.integers(-50, 50, idx.shape).astype(np.int64)]
    return [([r.integers(-50, 50, (3, 5)).astype(np.int64), idx, *src],
             {"dim": 1, **({"src_scalar": 7.0} if scalar else {})})]


def _scatter_src_grad(n, dy, emit):
    return emit("dim_gather", dy, n.inputs[1], dim=n.attrs["dim"])


register("dim_scatter_add_like", _dim_scatter_infer("dim_scatter_add_like"),
         normalize=_dim_norm("dim_scatter_add_like", _input_rank),
         grad=lambda n, gs, emit: [None, None, _scatter_src_grad(n, gs[0], emit)],
         reference=_dim_scatter_reference(None, True), samples=_dim_scatter_samples,
         shape_inputs=(0,), amp=None,
         amp_note="in none of OneFlow's lists: dim_gather's gradient, a scatter-add, stays in "
                  "the float32 of the dim_gather it is the gradient of",
         doc="out (like's shape) = 0 + src added at index along dim (torch.scatter_add)")


def _scatter_diagnose(op):
    return lambda node, arrays: _dim_out_of_range(op, arrays[1], node.inputs[0].shape,
                                                  node.attrs["dim"])


def _scatter_register(op, *, add, scalar, grad, doc):
    register(op, _dim_scatter_infer(op), normalize=_dim_norm(op, _input_rank, scalar),
             grad=lambda n, gs, emit: ([None] * len(n.inputs) if n.inputs[0].dtype is int64
                                       else grad(n, gs[0], emit)),
             reference=_dim_scatter_reference(op, add),
             samples=lambda: _dim_scatter_samples(scalar, 43 + add) + _int_scatter_samples(scalar),
             diagnose=_scatter_diagnose(op), amp=None,
             amp_note=f"in none of OneFlow's lists ({op}): it runs in float32, as dim_gather",
             doc=doc)


def _keep_off_index(n, dy, emit):
    """dy with the places ``n`` wrote zeroed (the gradient of an overwritten input)."""
    return emit("dim_scatter_update_scalar", dy, n.inputs[1], dim=n.attrs["dim"], src_scalar=0.0)


_scatter_register(
    "dim_scatter_update", add=False, scalar=False,
    grad=lambda n, dy, emit: [_keep_off_index(n, dy, emit), None, _scatter_src_grad(n, dy, emit)],
    doc="out = input with src written at index along dim, the last in index order wins "
        "(torch.scatter)")
_scatter_register(
    "dim_scatter_update_scalar", add=False, scalar=True,
    grad=lambda n, dy, emit: [_keep_off_index(n, dy, emit), None],
    doc="out = input with src_scalar written at index along dim (torch.scatter with a value)")
_scatter_register(
    "dim_scatter_add", add=True, scalar=False,
    grad=lambda n, dy, emit: [dy, None, _scatter_src_grad(n, dy, emit)],
    doc="out = input + src added at index along dim (torch.scatter_add)")


# ------------------------------------------------------------------------------ slice
def slice_attrs(op: str, shape, attrs) -> dict:
    """``start``, ``stop``, ``step`` (one int or None per axis, Python's rules) normalised to
    ``slice(start, stop, step).indices(n)`` per axis, as tuples of ints.

    Raises:
        ValueError: a list of the wrong length, or a step <= 0 (as PyTorch: "step must be
            greater than zero"). TypeError: a non-integer entry.
    """
    nd = len(shape)
    out = {}
    for key in ("start", "stop", "step"):
        v = attrs.get(key, (None,) * nd)
        if len(v) != nd:
            raise ValueError(f"{op}: {key} has {len(v)} entries for a tensor of rank {nd}: "
                             f"give one per axis")
        out[key] = [None if e is None else _int_attr(op, key, e) for e in v]
    start, stop, step = [], [], []
    for d, n in enumerate(shape):
        s = 1 if out["step"][d] is None else out["step"][d]
        if s <= 0:
            raise ValueError(f"{op}: step {s} on axis {d}: step must be greater than zero "
                             f"(negative steps are not supported, as in PyTorch)")
        a, b, s = slice(out["start"][d], out["stop"][d], s).indices(int(n))
        start.append(a)
        stop.append(max(a, b))
        step.append(s)
    return {"start": tuple(start), "stop": tuple(stop), "step": tuple(step)}


def slice_index(attrs) -> tuple:
    """The tuple of Python slices of normalised slice attributes (``x[slice_index(attrs)]``)."""
    return tuple(slice(a, b, s) for a, b, s in zip(attrs["start"], attrs["stop"], attrs["step"]))


def _slice_shape(attrs) -> tuple:
    return tuple(len(range(a, b, s)) for a, b, s in zip(attrs["start"], attrs["stop"],
                                                        attrs["step"]))


def _slice_infer(inputs, attrs):
    check_arity("slice", inputs, 1)
    return [(_slice_shape(attrs), inputs[0].dtype)]


def _slice_samples():
    def make(dt):
        r = np.random.default_rng(35)
        x = rand(4, 5, 6, dtype=dt, r=r)
        return [([x], {"start": (None, 0, 1), "stop": (None, 3, None), "step": (None, 1, 2)}),
                ([x], {"start": (1, -4, 0), "stop": (3, 100, 6), "step": (1, 3, 5)}),
                ([x], {"start": (2, 0, 0), "stop": (2, 5, 6), "step": (1, 1, 1)}),
                ([rand(6, dtype=dt, r=r)], {"start": (-2,), "stop": (None,), "step": (1,)})]
    return float_samples(make)


register("slice", _slice_infer,
         normalize=lambda ins, a: slice_attrs("slice", ins[0].shape if ins else (), a),
         grad=lambda n, gs, emit: [emit("slice_grad", gs[0], like_shape=n.inputs[0].shape,
                                        **n.attrs)],
         reference=lambda xs, a: [xs[0][slice_index(a)].copy()], samples=_slice_samples,
         amp="clear", doc="out = x[start:stop:step] per axis (basic indexing)")


def _slice_grad_norm(inputs, attrs):
    like = tuple(_int_attr("slice_grad", "like_shape", d) for d in attrs["like_shape"])
    return {"like_shape": like, **slice_attrs("slice_grad", like, attrs)}


def _slice_grad_infer(inputs, attrs):
    op = "slice_grad"
    check_arity(op, inputs, 1)
    want = _slice_shape(attrs)
    if inputs[0].shape != want:
        raise ValueError(f"{op}: dy {fmt(inputs[0])} must have the slice's shape "
                         f"{format_shape(want)}")
    return [(attrs["like_shape"], inputs[0].dtype)]


def _slice_grad_reference(arrays, attrs):
    out = np.zeros(attrs["like_shape"])
    out[slice_index(attrs)] = arrays[0]
    return [out]


def _slice_grad_samples():
    def make(dt):
        r = np.random.default_rng(36)
        return [([rand(4, 3, 3, dtype=dt, r=r)], {"like_shape": (4, 5, 6), "start": (0, 0, 1),
                                                  "stop": (4, 3, 6), "step": (1, 1, 2)}),
                ([rand(2, dtype=dt, r=r)], {"like_shape": (6,), "start": (4,), "stop": (6,),
                                            "step": (1,)}),
                ([rand(0, 5, dtype=dt, r=r)], {"like_shape": (4, 5), "start": (2, 0),
                                               "stop": (2, 5), "step": (1, 1)})]
    return float_samples(make)


register("slice_grad", _slice_grad_infer, normalize=_slice_grad_norm,
         grad=lambda n, gs, emit: [emit("slice", gs[0], start=n.attrs["start"],
                                        stop=n.attrs["stop"], step=n.attrs["step"])],
         reference=_slice_grad_reference, samples=_slice_grad_samples, amp="clear",
         amp_note="the gradient of a clear op (OneFlow's slice_grad is in no list; it moves "
                  "data only, so it keeps its input's dtype like slice)",
         doc="dx = zeros(like_shape) with dy written at x[start:stop:step]")


# ------------------------------------------------------------------------------ slice_update
def _slice_update_infer(inputs, attrs):
    op = "slice_update"
    check_arity(op, inputs, 2)
    ref, value = inputs
    if value.dtype is not ref.dtype:
        raise TypeError(f"{op}: value {fmt(value)} must have ref's dtype {fmt(ref)}; cast it "
                        f"with .to({ref.dtype.name}) first")
    if ref.dtype is not int64:
        check_float(op, ref)
    want = _slice_shape(attrs)
    if value.shape != want:
        raise ValueError(f"{op}: value {fmt(value)} must have the slice's shape "
                         f"{format_shape(want)} (ref {fmt(ref)}, start {list(attrs['start'])}, "
                         f"stop {list(attrs['stop'])}, step {list(attrs['step'])}); broadcast it "
                         f"to that shape first")
    return [(ref.shape, ref.dtype)]


def _slice_update_reference(arrays, attrs):
    out = np.array(arrays[0], np.float64)
    out[slice_index(attrs)] = arrays[1]
    return [out]


def _slice_update_samples():
    def make(dt):
        r = np.random.default_rng(39)
        x = rand(4, 5, 6, dtype=dt, r=r)
        return [([x, rand(4, 3, 3, dtype=dt, r=r)],
                 {"start": (None, 0, 1), "stop": (None, 3, None), "step": (None, 1, 2)}),
                ([x, np.array([[[np.nan, 1.0], [-0.0, 2.0]], [[np.inf, 3.0], [4.0, -5.0]]],
                              dt)],
                 {"start": (1, -4, 0), "stop": (3, 100, 6), "step": (1, 3, 5)}),
                ([x, rand(0, 5, 6, dtype=dt, r=r)],
                 {"start": (2, 0, 0), "stop": (2, 5, 6), "step": (1, 1, 1)}),
                ([rand(6, dtype=dt, r=r), rand(2, dtype=dt, r=r)],
                 {"start": (-2,), "stop": (None,), "step": (1,)}),
                ([rand(3, 700, dtype=dt, r=r), rand(3, 233, dtype=dt, r=r)],
                 {"start": (0, 1), "stop": (3, 700), "step": (1, 3)})]
    return float_samples(make)


def _slice_update_grad(node, gs, emit):
    """ref: dy with the slice zeroed; value: the slice of dy (OneFlow's SliceUpdate backward)."""
    a, value = node.attrs, node.inputs[1]
    zeros = emit("constant", shape=value.shape, value=0.0, dtype=gs[0].dtype)
    return [emit("slice_update", gs[0], zeros, **a), emit("slice", gs[0], **a)]


register("slice_update", _slice_update_infer,
         normalize=lambda ins, a: slice_attrs("slice_update", ins[0].shape if ins else (), a),
         grad=_slice_update_grad, reference=_slice_update_reference,
         samples=_slice_update_samples, amp=None,
         amp_note="in none of OneFlow's lists (slice_update; its slice and slice_grad are "
                  "clear): ref and value run in float32, so an assignment keeps its precision",
         doc="out = ref with value written at ref[start:stop:step] per axis (x[key] = value)")


# ------------------------------------------------------------------------------ cat
def _cat_norm(inputs, attrs):
    return {"axis": _axis("cat", attrs, len(inputs[0].shape) if inputs else 1)}


def _cat_infer(inputs, attrs):
    op, axis = "cat", attrs["axis"]
    if not inputs:
        raise ValueError(f"{op}: needs at least one input")
    first = inputs[0]
    if any(v.dtype is not first.dtype for v in inputs):
        raise TypeError(f"{op}: inputs have different dtypes: " + ", ".join(fmt(v) for v in inputs)
                        + "; cast one of them with .to() so they match")
    if first.dtype is not int64:     # int64: token ids (nanoGPT's torch.cat((idx, idx_next), 1))
        check_float(op, *inputs)
    for v in inputs[1:]:
        rest = (v.shape[:axis] + v.shape[axis + 1:], first.shape[:axis] + first.shape[axis + 1:])
        if len(v.shape) != len(first.shape) or rest[0] != rest[1]:
            raise ValueError(f"{op}: inputs must have the same shape except along axis {axis}, "
                             f"got {fmt(first)} and {fmt(v)}")
    size = sum(v.shape[axis] for v in inputs)
    return [(first.shape[:axis] + (size,) + first.shape[axis + 1:], first.dtype)]


def cat_slices(shapes, axis: int) -> list:
    """The normalised ``slice`` attributes of each part of a ``cat`` of parts of ``shapes`` along
    ``axis``: ``out[slice_index(attrs_i)]`` is part i."""
    parts, start = [], 0
    for shape in shapes:
        stop = start + int(shape[axis])
        parts.append({"start": tuple(start if d == axis else 0 for d in range(len(shape))),
                      "stop": tuple(stop if d == axis else int(n) for d, n in enumerate(shape)),
                      "step": (1,) * len(shape)})
        start = stop
    return parts


def _cat_samples():
    def make(dt):
        r = np.random.default_rng(37)
        return [([rand(2, 3, 4, dtype=dt, r=r), rand(2, 1, 4, dtype=dt, r=r),
                  rand(2, 0, 4, dtype=dt, r=r), rand(2, 2, 4, dtype=dt, r=r)], {"axis": 1}),
                ([rand(3, dtype=dt, r=r), rand(2, dtype=dt, r=r)], {"axis": 0}),
                ([rand(2, 3, dtype=dt, r=r), rand(1, 3, dtype=dt, r=r)], {"axis": -2}),
                ([rand(4, 5, dtype=dt, r=r)], {"axis": 1})]
    return float_samples(make)


register("cat", _cat_infer, normalize=_cat_norm,
         grad=lambda n, gs, emit: [emit("slice", gs[0], **a) for a in
                                   cat_slices([v.shape for v in n.inputs], n.attrs["axis"])],
         reference=lambda xs, a: [np.concatenate(xs, axis=a["axis"])], samples=_cat_samples,
         amp="clear",
         amp_note="moves data only, like slice (OneFlow's cat, oneflow/user/ops/concat_op.cpp); "
                  "autograd joins the gradients of slices that tile a tensor with it",
         doc="out = the inputs joined along axis (torch.cat)")


# ------------------------------------------------------------------------------ tril
def _tril_norm(inputs, attrs):
    return {"diagonal": _int_attr("tril", "diagonal", attrs.get("diagonal", 0)),
            "fill_value": float(attrs.get("fill_value", 0.0))}


def _tril_infer(inputs, attrs):
    check_arity("tril", inputs, 1)
    x = inputs[0]
    check_float("tril", x)
    if len(x.shape) < 2:
        raise ValueError(f"tril: x {fmt(x)} must have at least 2 dimensions (rows, columns)")
    return [(x.shape, x.dtype)]


def _tril_reference(arrays, attrs):
    x = arrays[0]
    rows, cols = x.shape[-2:]
    keep = np.arange(cols)[None, :] - np.arange(rows)[:, None] <= attrs["diagonal"]
    return [np.where(keep, x, attrs["fill_value"])]


def _tril_samples():
    def make(dt):
        r = np.random.default_rng(37)
        return [([rand(2, 4, 4, dtype=dt, r=r)], {"fill_value": -np.inf}),
                ([rand(3, 5, dtype=dt, r=r)], {"diagonal": 1}),
                ([rand(5, 3, dtype=dt, r=r)], {"diagonal": -2, "fill_value": 7.0}),
                ([rand(2, 3, 4, dtype=dt, r=r)], {"diagonal": -3, "fill_value": 2.0}),
                ([rand(0, 3, dtype=dt, r=r)], {})]
    return float_samples(make)


register("tril", _tril_infer, normalize=_tril_norm,
         grad=lambda n, gs, emit: [emit("tril", gs[0], diagonal=n.attrs["diagonal"],
                                        fill_value=0.0)],
         reference=_tril_reference, samples=_tril_samples, amp="clear",
         doc="out = x on and below the diagonal (j - i <= diagonal), fill_value above")


# ------------------------------------------------------------------------------ masked_fill
def _masked_infer(inputs, attrs):
    op = "masked_fill"
    check_arity(op, inputs, 2)
    x, mask = inputs
    check_float(op, x)
    _check_indices(op, "mask", mask)
    try:
        ok = tuple(np.broadcast_shapes(x.shape, mask.shape)) == x.shape
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{op}: mask {fmt(mask)} must broadcast to x's shape {fmt(x)}")
    return [(x.shape, x.dtype)]


def _masked_samples():
    def make(dt):
        r = np.random.default_rng(38)
        return [([rand(2, 3, 4, dtype=dt, r=r), r.integers(0, 2, (3, 4)).astype(np.int64)],
                 {"value": -np.inf}),
                ([rand(3, 4, dtype=dt, r=r), np.array([[1], [0], [5]], np.int64)],
                 {"value": 2.5}),
                ([rand(0, 4, dtype=dt, r=r), np.ones(4, np.int64)], {"value": 0.0})]
    return float_samples(make)


register("masked_fill", _masked_infer, normalize=lambda ins, a: {"value": float(a["value"])},
         grad=lambda n, gs, emit: [emit("masked_fill", gs[0], n.inputs[1], value=0.0), None],
         reference=lambda xs, a: [np.where(xs[1] != 0, a["value"], xs[0])],
         samples=_masked_samples, amp="clear",
         amp_note="in none of OneFlow's lists (its masked_fill is a where); clear here like "
                  "tril, the fill OneFlow lists as clear, so a masked score keeps its dtype",
         doc="out = value where mask (int64, broadcast to x) is nonzero, else x")
