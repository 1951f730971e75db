"""Data types: the six dtypes miniflow knows, their NumPy mapping and the half types' limits.

``bool`` (:data:`bool_`, ``miniflow.bool`` as ``torch.bool``) is the dtype of eager tensors only:
comparisons' results and masks. No op computes on it and no graph value has it
(:func:`graph_dtype`): inside ``nn.Graph.build`` a bool tensor is read as data, as a NumPy bool
array is.

``float16`` is IEEE binary16: max finite 65504, values >= 65520 round to inf, smallest normal
2^-14, smallest subnormal 2^-24 (values at or below 2^-25 round to zero). Source: IEEE 754-2008.

``bfloat16`` (Google Brain's "brain float", the upper 16 bits of a float32: 8 exponent bits, 7
mantissa bits) has float32's range: max finite 3.3895e38 (``BF16_MAX``), smallest normal 2^-126;
its NumPy dtype is ``ml_dtypes.bfloat16`` (arrays in and out of miniflow are of that dtype).
Narrowing rounds to nearest even once (from float64 too), overflows to inf, keeps subnormals and
turns every NaN into the quiet NaN of its sign (``0x7FC0`` / ``0xFFC0``), exactly as
``ml_dtypes`` does. Sources: ``ml_dtypes``; the bfloat16 format of Intel's BF16 white paper
(document 338302) and TensorFlow's ``bfloat16.h``.

The half types (float16, bfloat16: :data:`HALF_DTYPES`) are AMP's low-precision types; kernels
compute in float32 and store them with one rounding.
"""
from __future__ import annotations

import math
from types import FunctionType

import numpy as np

__all__ = ["DType", "float64", "float32", "float16", "bfloat16", "int64", "bool_", "as_dtype",
           "graph_dtype",
           "HALF_DTYPES", "FP16_MAX", "FP16_OVERFLOW", "FP16_MIN_NORMAL", "FP16_MIN_SUBNORMAL",
           "BF16_MAX", "is_bfloat16", "max_finite", "overflows", "check_fill"]

FP16_MAX = 65504.0
"""Largest finite float16 value."""
FP16_OVERFLOW = 65520.0
"""Smallest value that rounds to +inf when converted to float16 (round-to-nearest-even)."""
FP16_MIN_NORMAL = 2.0 ** -14
FP16_MIN_SUBNORMAL = 2.0 ** -24
BF16_MAX = (2.0 - 2.0 ** -7) * 2.0 ** 127
"""Largest finite bfloat16 value (3.3895e38: the bits ``0x7F7F``, every mantissa bit set)."""


class DType:
    """A miniflow dtype: a name, a short printed form (``f32``), the NumPy dtype of its storage
    (:attr:`np`) and its ``itemsize`` (bytes per element).

    Instances are singletons (``miniflow.float32`` etc.); compare them with ``is`` or ``==``.

    ``np_dtype`` is a NumPy dtype or type, or a function returning one, called at the first use of
    :attr:`np` (give ``itemsize`` then): ``bfloat16``'s, so that ``ml_dtypes``, whose import
    takes 0.57 s (version 0.7.0: it registers its NumPy casts and loops one by one), is imported
    only by a process that uses bfloat16.
    """

    __slots__ = ("name", "short", "_np", "_load", "itemsize", "is_float")

    def __init__(self, name: str, short: str, np_dtype, is_float: bool, itemsize: int = 0):
        self.name = name
        self.short = short
        self.is_float = is_float
        if isinstance(np_dtype, FunctionType):
            self._np, self._load, self.itemsize = None, np_dtype, itemsize
        else:
            self._np, self._load = np.dtype(np_dtype), None
            self.itemsize = self._np.itemsize

    @property
    def np(self) -> np.dtype:
        """The NumPy dtype of the storage (``ml_dtypes.bfloat16`` for bfloat16)."""
        if self._np is None:
            self._np = np.dtype(self._load())
        return self._np

    @property
    def is_half(self) -> bool:
        """A 16-bit float (float16 or bfloat16): AMP's low-precision types."""
        return self.is_float and self.itemsize == 2

    def __repr__(self) -> str:
        return f"miniflow.{self.name}"

    def __reduce__(self):
        return (as_dtype, (self.name,))


def _ml_dtypes_bfloat16():
    import ml_dtypes
    return ml_dtypes.bfloat16


float64 = DType("float64", "f64", np.float64, True)
float32 = DType("float32", "f32", np.float32, True)
float16 = DType("float16", "f16", np.float16, True)
bfloat16 = DType("bfloat16", "bf16", _ml_dtypes_bfloat16, True, itemsize=2)
int64 = DType("int64", "i64", np.int64, False)
bool_ = DType("bool", "b8", np.bool_, False)
"""``miniflow.bool`` (``torch.bool``; ``bool_`` here, as NumPy's, so that the builtin stays)."""

HALF_DTYPES = (float16, bfloat16)
"""The 16-bit float types."""


def max_finite(dtype: DType) -> float:
    """The largest finite value of the floating ``dtype`` (float16 65504, bfloat16
    :data:`BF16_MAX`, float32 3.4028e38, float64 1.7977e308).

    Raises:
        TypeError: ``dtype`` is not floating (int64)."""
    if not dtype.is_float:
        raise TypeError(f"max_finite: {dtype.name} is not a floating dtype")
    if dtype.is_half:          # np.finfo knows no ml_dtypes type
        return FP16_MAX if dtype.name == "float16" else BF16_MAX
    return float(np.finfo(dtype.np).max)


def overflows(value: float, dtype: DType) -> bool:
    """Whether the number ``value`` cannot be converted to ``dtype`` without overflow, as
    PyTorch's scalar conversion checks (``c10::checked_convert``): for a floating dtype a finite
    value beyond :func:`max_finite` (inf and NaN convert), for int64 NaN, inf or a value outside
    [-2**63, 2**63)."""
    if dtype.is_float:
        return math.isfinite(value) and abs(value) > max_finite(dtype)
    return not math.isfinite(value) or not -2.0 ** 63 <= value < 2.0 ** 63


def check_fill(op: str, value: float, dtype: DType) -> None:
    """Refuse filling a tensor of the floating ``dtype`` with ``value`` when it
    :func:`overflows` (``masked_fill``, ``F.pad``), as PyTorch's "value cannot be converted to
    type at::Half without overflow".

    Raises:
        RuntimeError: naming ``op``, the value, the dtype and its largest finite value."""
    if overflows(value, dtype):
        raise RuntimeError(
            f"{op}: value {value:g} cannot be converted to {dtype.name} without overflow (its "
            f"largest finite value is {max_finite(dtype):g}; PyTorch raises too): give "
            f"float('inf'), float('-inf') or a value in range")


_ALL = {d.name: d for d in (float64, float32, float16, bfloat16, int64, bool_)}
_BY_NP = {d.np: d for d in _ALL.values() if d is not bfloat16}


def is_bfloat16(np_dtype) -> bool:
    """Whether a NumPy dtype (or type) is ``ml_dtypes.bfloat16``. Compares names first, so it
    imports ``ml_dtypes`` for no other dtype (an array can be bfloat16 only once it is imported)."""
    npd = np.dtype(np_dtype)
    return npd.name == "bfloat16" and npd == bfloat16.np


def as_dtype(x) -> DType:
    """Convert a DType, a NumPy dtype/type, a name (``"float16"``) or a ``torch.dtype`` (by its
    name: ``torch.float16``) to a miniflow DType.

    Integer NumPy types of other widths (int32, uint8) map to int64 is NOT done silently: they raise.

    Raises:
        TypeError: for a dtype miniflow does not support, naming the supported ones.
    """
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and x in _ALL:
        return _ALL[x]
    if str(x).startswith("torch.") and str(x)[len("torch."):] in _ALL:     # a torch.dtype
        return _ALL[str(x)[len("torch."):]]
    try:
        npd = np.dtype(x)
    except TypeError:
        npd = None
    if npd is not None and npd in _BY_NP:
        return _BY_NP[npd]
    if npd is not None and is_bfloat16(npd):
        return bfloat16
    raise TypeError(f"unsupported dtype {x!r}: miniflow supports "
                    f"{', '.join(_ALL)} (convert your array with .astype first)")


def graph_dtype(x) -> DType:
    """:func:`as_dtype` of the dtype of something a graph holds (a graph input, a buffer, an IR
    value): every dtype but bool.

    Raises:
        TypeError: as :func:`as_dtype`; bool, saying to give a mask as int64 (as a float, an
            attention mask would be added).
    """
    dt = as_dtype(x)
    if dt is bool_:
        raise TypeError(
            "bool tensors are eager in miniflow and no graph value is bool; give a bool mask "
            "as int64 (mask.long(), or mask.astype(np.int64): nonzero is True, as masked_fill, "
            "where, attn_mask and key_padding_mask read an int64 mask), not as a float: a float "
            "attention mask is added to the scores, so mask.float() would mask nothing")
    return dt
