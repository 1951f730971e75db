"""Helpers shared by op definitions: input checks with clear messages, sample data, un-broadcasting,
and rounding for the float64 references."""
from __future__ import annotations

import numpy as np

from ..dtype import DType, bfloat16, float16, float32, float64, int64
from ..ir import format_shape

FLOATS = (float16, bfloat16, float32, float64)


def fmt(v) -> str:
    """``%3 (f32[64,10])`` for error messages."""
    return f"%{v.name} ({v.type_str})"


def check_arity(op: str, inputs, n: int) -> None:
    """Raise ValueError unless ``op`` got exactly ``n`` inputs."""
    if len(inputs) != n:
        raise ValueError(f"{op}: expects {n} input(s), got {len(inputs)}")


def check_float(op: str, *vals) -> DType:
    """All ``vals`` must share one floating dtype; returns it. Raises TypeError naming the op."""
    dt = vals[0].dtype
    for v in vals:
        if not v.dtype.is_float:
            raise TypeError(f"{op}: input {fmt(v)} must be floating point (f16/bf16/f32/f64); "
                            f"cast it with .to(miniflow.float32)")
        if v.dtype is not dt:
            raise TypeError(f"{op}: inputs have different dtypes: "
                            + ", ".join(fmt(x) for x in vals)
                            + "; cast one of them with .to() so they match")
    return dt


def float_or_int64(op: str, *vals) -> DType:
    """The dtype of ``vals``: one floating dtype, or int64 for all (OneFlow's ops of any dtype:
    ``identity``, ``gather``; an int64 one gets no gradient). Raises TypeError as
    :func:`check_float`."""
    if all(v.dtype is int64 for v in vals):
        return int64
    return check_float(op, *vals)


def norm_axes(op: str, axis, ndim: int) -> tuple:
    """Normalise ``axis`` (None, int or sequence) to a sorted tuple of non-negative ints."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (int, np.integer)):
        axis = (int(axis),)
    if not isinstance(axis, (tuple, list)) or not all(
            isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in axis):
        raise TypeError(f"{op}: axis must be None, an int or a sequence of ints, got {axis!r}")
    out = []
    for a in axis:
        a = int(a)
        if not -ndim <= a < max(ndim, 1) or (ndim == 0):
            raise ValueError(f"{op}: axis {a} is out of range for a tensor of rank {ndim}")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: repeated axis in {tuple(axis)}")
    return tuple(sorted(out))


def broadcast_shape(op: str, a, b) -> tuple:
    """NumPy broadcasting of two Values' shapes; ValueError naming the op and both shapes."""
    try:
        return tuple(np.broadcast_shapes(a.shape, b.shape))
    except ValueError:
        raise ValueError(f"{op}: shapes {format_shape(a.shape)} of %{a.name} and "
                         f"{format_shape(b.shape)} of %{b.name} cannot be broadcast together") from None


def y_dy_infer(op: str, first: str = "y"):
    """Inference for activation-gradient ops ``op(y, dy) -> dx`` (``first`` names the first input:
    ``"y"``, the forward output, or ``"x"``, its input): same shape and float dtype."""
    def infer(inputs, attrs):
        check_arity(op, inputs, 2)
        dt = check_float(op, *inputs)
        if inputs[0].shape != inputs[1].shape:
            raise ValueError(f"{op}: {first} {fmt(inputs[0])} and dy {fmt(inputs[1])} must have "
                             f"one shape")
        return [(inputs[0].shape, dt)]
    return infer


def unbroadcast(emit, g, shape: tuple):
    """Sum gradient ``g`` over the axes that broadcasting expanded, back to ``shape``."""
    if g.shape == tuple(shape):
        return g
    lead = len(g.shape) - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape)
                                      if s == 1 and g.shape[lead + i] != 1)
    r = emit("reduce_sum", g, axis=axes, keepdims=False) if axes else g
    if r.shape != tuple(shape):
        r = emit("reshape", r, shape=tuple(shape))
    return r


def rounded(x, dtype) -> np.ndarray:
    """``x`` rounded to ``dtype`` (a DType or NumPy dtype), held as float64 (int64 for an integer
    dtype): the value a tensor of that dtype stores. The references round only where the op's
    meaning does (``cast``, ``constant``, the float32 loss scale)."""
    np_dtype = np.dtype(getattr(dtype, "np", dtype))
    with np.errstate(all="ignore"):
        out = np.asarray(x).astype(np_dtype)
    return out.astype(np.int64 if np_dtype.kind in "iu" else np.float64)


# --------------------------------------------------------------------- samples for kernel tests
def rng() -> np.random.Generator:
    """A fixed-seed generator, so sample inputs are the same in every test process."""
    return np.random.default_rng(1234)


def rand(*shape, dtype=np.float32, lo=-2.0, hi=2.0, r=None) -> np.ndarray:
    """Uniform random array in [lo, hi) of ``dtype``."""
    r = r if r is not None else rng()
    return r.uniform(lo, hi, size=shape).astype(dtype)


def float_samples(make):
    """Run ``make(np_dtype) -> list[(inputs, attrs)]`` for f32 and f16 and concatenate.

    Samples deliberately hold values that overflow float16 (65536 -> inf): no warning for those."""
    out = []
    with np.errstate(over="ignore"):
        for dt in (np.float32, np.float16):
            out.extend(make(dt))
    return out


__all__ = ["FLOATS", "fmt", "check_arity", "check_float", "float_or_int64", "norm_axes",
           "broadcast_shape", "unbroadcast", "y_dy_infer", "rounded", "rand", "rng",
           "float_samples", "int64", "float32"]
