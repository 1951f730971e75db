"""The half types on Numba's CPU target: bit conversions and the typed ``load`` / ``store`` helpers.

Numba's CPU target has neither float16 nor bfloat16, so half arrays reach kernels as integer views
of their bits (``common.kview``): float16 as ``uint16`` (the raw IEEE binary16 bits), bfloat16
as ``int16`` (its bits; int16 is no miniflow dtype, so the view type alone says which half type
an array holds). Kernels never touch those bits directly; they call

* ``load(a, i)``: the element as its *compute* value: float32 for uint16 (fp16 bits), int16
  (bf16 bits) and float32 arrays, float64 for float64, int64 for int64. ``i`` is an int or an
  index tuple.
* ``store(a, i, v)``: write ``v`` into ``a``'s storage, rounding once (uint16: round-to-nearest-even
  to fp16, overflow to inf at >= 65520, subnormals kept; int16: round-to-nearest-even to bf16,
  overflow to inf, NaN to the quiet NaN of its sign, as ``ml_dtypes``).
* ``to_compute(a, v)``: a scalar ``v`` converted to ``a``'s compute type (float literals in Numba are
  float64; kernels use this to keep f16/f32 math in float32).

so one kernel source serves f16, bf16, f32 and f64 (a new kernel gets bfloat16 by using them).
They are ``numba.extending.overload`` s resolved by the argument types at compile time (plain calls;
LLVM inlines them; Numba-IR inlining is avoided, see ``cpu.common.jitable``).

Two conversion paths, chosen once at import (``PATH``):

* ``"intrinsic"``: two LLVM intrinsics, ``bitcast i16->half; fpext half->float`` and
  ``fptrunc float->half; bitcast half->i16``. With F16C these are single instructions
  (vcvtph2ps / vcvtps2ph) and bit-exact with NumPy. Used when the target CPU has ``+f16c`` and
  ``NUMBA_CPU_NAME`` is not ``generic`` (with a generic CPU, LLVM lowers the ``half`` conversions
  to runtime-library calls instead, and the compiled kernel segfaults).
* ``"fallback"``: pure integer bit manipulation (``widen_fallback`` / ``narrow_fallback``), with
  only plain ``bitcast`` between same-width ints and floats. Also bit-exact with NumPy.

``MINIFLOW_FP16_FALLBACK=1`` in the environment *before* miniflow is imported forces the fallback
(read once, here). Numba's on-disk cache keys a compiled kernel by its signature, bytecode, closure
and the target CPU name/features, not by which conversion path its helpers used. The automatic
choice depends only on the CPU name/features, so it is keyed correctly; the forced switch is not, so
when it is set, ``JIT_CACHE`` is False and kernels compile without the disk cache (no stale
intrinsic-path code is loaded, none is written). ``JIT_CACHE`` is also False when Numba has no
writable cache folder (``kernels.common.cache``). Note also that Numba's cache does not track
edits to helper modules: after editing this file, an op's scalar function (``miniflow.ops``) or
a scalar body of ``kernels.common``, clear ``NUMBA_CACHE_DIR``.

float64 -> fp16 (``narrow64``) always uses the integer algorithm: a direct, single rounding (going
through float32 would round twice), and hardware F16C has no double->half instruction.

bfloat16: widening is the bits shifted into the upper half of a float32 (exact), narrowing from
float32 adds ``0x7FFF`` plus the lowest kept bit and drops the low 16 bits (round to nearest even,
TensorFlow's and ``ml_dtypes``' algorithm; ``narrow_bf16_intrinsic`` does it in 32-bit integers,
which Numba's own integer typing would widen to 64), and narrowing from float64
(``narrow64_bf16``) first rounds to float32 *to odd* (inexact results get their last bit set),
which makes the second rounding exact: one rounding in all, as ``ml_dtypes`` does (Boldo and
Melquiond, "When double rounding is odd", 2005).

Source: IEEE 754-2008 binary16; NumPy's ``npy_half.c`` semantics (tested bit for bit in
``tests/test_fp16.py``); ``ml_dtypes.bfloat16`` (tested on all 65536 patterns in
``tests/test_bf16.py``).
"""
from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from ...environment import read
from . import target      # first: it makes NUMBA_CPU_NAME mean that CPU before anything compiles
from ..common.cache import CACHE

__all__ = ["PATH", "FORCE_FALLBACK", "JIT_CACHE", "target_has", "widen", "narrow", "narrow64",
           "widen_intrinsic", "narrow_intrinsic", "widen_fallback", "narrow_fallback",
           "widen_bf16", "narrow_bf16", "narrow_bf16_intrinsic", "narrow64_bf16", "load", "store",
           "to_compute"]

FORCE_FALLBACK = read("MINIFLOW_FP16_FALLBACK", "0") == "1"
"""True when ``MINIFLOW_FP16_FALLBACK=1`` was set before import."""


def target_has(feature: str) -> bool:
    """Whether the CPU Numba compiles for has ``feature`` (an LLVM name: ``"f16c"``,
    ``"avx512bf16"``; :data:`target.PROBED`), read back from LLVM for Numba's target CPU name and
    features (``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES`` respected: :mod:`.target`)."""
    return target.has(feature)


PATH = "fallback" if FORCE_FALLBACK or not target_has("f16c") else "intrinsic"
"""The conversion path compiled into kernels: ``"intrinsic"`` or ``"fallback"``."""

JIT_CACHE = CACHE.enabled and not FORCE_FALLBACK
"""``cache=`` for every CPU kernel (off when the fallback is forced or Numba cannot cache; see the
module docstring)."""


# ----------------------------------------------------------------------------- LLVM intrinsics
@intrinsic
def widen_intrinsic(typingctx, bits):
    """fp16 bits (uint16) -> float32, exact: ``fpext(bitcast(bits to half) to float)``."""
    if bits != types.uint16:
        return None

    def codegen(context, builder, sig, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


@intrinsic
def narrow_intrinsic(typingctx, x):
    """float32 -> fp16 bits (uint16), round-to-nearest-even: ``bitcast(fptrunc(x to half))``."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(types.float32), codegen


def _bitcast_intrinsic(src, dst, llvm_dst):
    """An intrinsic reinterpreting the bits of a ``src`` scalar as ``dst`` (same width)."""
    @intrinsic
    def bitcast(typingctx, x):
        if x != src:
            return None

        def codegen(context, builder, sig, args):
            return builder.bitcast(args[0], llvm_dst)

        return dst(src), codegen

    return bitcast


@intrinsic
def narrow_bf16_intrinsic(typingctx, x):
    """float32 -> bf16 bits (int16) in 32-bit integer arithmetic: ``b`` the float's bits,
    ``(b + 0x7FFF + ((b >> 16) & 1)) >> 16`` (round to nearest even; overflow carries into
    inf), or ``((b >> 16) & 0x8000) | 0x7FC0`` for a NaN (the quiet NaN of its sign); a select,
    not a branch, so loops over it vectorize in 16 lanes (2.2x the int64 version Numba types).
    The NaN test is the float compare ``x`` unordered with itself (one ``vcmpunordps``; the
    integer test ``(b & 0x7FFFFFFF) > 0x7F800000`` is unsigned, which AVX2 has no compare for:
    four instructions. 1.1M elements of the AMP SGD step with the bfloat16 copy, one Zen 4 core:
    364 -> 318 us as AVX2, 270 -> 246 with AVX-512)."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)

        def c(v):
            return ir.Constant(i32, v)

        b = builder.bitcast(args[0], i32)
        hi = builder.lshr(b, c(16))
        rounded = builder.lshr(builder.add(builder.add(b, c(0x7FFF)), builder.and_(hi, c(1))),
                               c(16))
        quiet = builder.or_(builder.and_(hi, c(0x8000)), c(0x7FC0))
        nan = builder.fcmp_unordered("uno", args[0], args[0])
        return builder.trunc(builder.select(nan, quiet, rounded), ir.IntType(16))

    return types.int16(types.float32), codegen


_u32_as_f32 = _bitcast_intrinsic(types.uint32, types.float32, ir.FloatType())
_f32_as_i32 = _bitcast_intrinsic(types.float32, types.int32, ir.IntType(32))
_f64_as_i64 = _bitcast_intrinsic(types.float64, types.int64, ir.IntType(64))


# ----------------------------------------------------------------------------- integer algorithms
# All integer arithmetic is int64: Numba types uint64 op int64 as float64, and every intermediate
# here fits comfortably in 63 bits.
@numba.njit(cache=JIT_CACHE)
def widen_fallback(bits):
    """fp16 bits (uint16) -> float32, exact, by integer manipulation of the bit fields.

    Normal: exponent rebiased (15 -> 127); subnormal m * 2^-24: normalised; inf kept; NaN keeps its
    sign and payload, with the quiet bit set (as F16C's vcvtph2ps does).
    """
    h = np.int64(bits)
    sign = (h & 0x8000) << 16
    exp = (h >> 10) & 0x1F
    mant = h & 0x3FF
    if exp == 0x1F:
        out = sign | 0x7F800000 | (mant << 13)
        if mant != 0:
            out |= 0x00400000
    elif exp != 0:
        out = sign | ((exp + 112) << 23) | (mant << 13)
    elif mant == 0:
        out = sign
    else:
        shift = 0
        while (mant & 0x400) == 0:
            mant <<= 1
            shift += 1
        out = sign | ((113 - shift) << 23) | ((mant & 0x3FF) << 13)
    return _u32_as_f32(np.uint32(out))


@numba.njit(cache=JIT_CACHE)
def narrow64(x):
    """float64 -> fp16 bits (uint16) with one round-to-nearest-even (used by both paths).

    |x| >= 65520 -> inf; |x| <= 2^-25 -> signed zero; in between subnormals are kept;
    NaN -> quiet NaN with x's sign.
    """
    b = _f64_as_i64(np.float64(x))
    sign = np.int64(0x8000) if b < 0 else np.int64(0)
    a = b & 0x7FFFFFFFFFFFFFFF
    exp = a >> 52
    mant = a & 0xFFFFFFFFFFFFF
    if exp == 0x7FF:
        if mant == 0:
            return np.uint16(sign | 0x7C00)
        return np.uint16(sign | 0x7E00 | (mant >> 42))
    e = exp - 1023
    if e >= 16:
        return np.uint16(sign | 0x7C00)
    if e < -25:
        return np.uint16(sign)
    if e >= -14:                       # normal: keep 10 of 52 mantissa bits
        h = ((e + 15) << 10) | (mant >> 42)
        shift = np.int64(42)
        rem = mant & ((np.int64(1) << 42) - 1)
    else:                              # subnormal: units of 2^-24
        sig = mant | (np.int64(1) << 52)
        shift = 28 - e
        h = sig >> shift
        rem = sig & ((np.int64(1) << shift) - 1)
    half = np.int64(1) << (shift - 1)
    if rem > half or (rem == half and (h & 1) == 1):
        h += 1                         # a carry into the exponent is right, up to inf (0x7C00)
    return np.uint16(sign | h)


@numba.njit(cache=JIT_CACHE)
def narrow_fallback(x):
    """float32 -> fp16 bits (uint16), round-to-nearest-even: float32 -> float64 is exact, so
    ``narrow64`` rounds once, exactly like ``fptrunc float->half``."""
    return narrow64(np.float64(x))


# ----------------------------------------------------------------------------- bfloat16
@numba.njit(cache=JIT_CACHE)
def widen_bf16(bits):
    """bf16 bits (int16) -> float32, exact: the bits become the upper half of a float32."""
    return _u32_as_f32(np.uint32((np.int64(bits) & 0xFFFF) << 16))


@numba.njit(cache=JIT_CACHE)
def _bf16_from_f32_bits(b):
    """float32 bits ``b`` (int64, 0 <= b < 2^32) -> bf16 bits (int16), round to nearest even."""
    if (b & 0x7FFFFFFF) > 0x7F800000:                   # NaN: the quiet NaN of its sign
        return np.int16(np.uint16(((b >> 16) & 0x8000) | 0x7FC0))
    return np.int16(np.uint16(((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF))


@numba.njit(cache=JIT_CACHE)
def narrow_bf16(x):
    """float32 -> bf16 bits (int16), round to nearest even (overflow to inf, NaN quieted):
    :func:`narrow_bf16_intrinsic`."""
    return narrow_bf16_intrinsic(np.float32(x))


@numba.njit(cache=JIT_CACHE)
def narrow64_bf16(x):
    """float64 -> bf16 bits (int16) with one rounding to nearest even: float32 rounded to odd
    (see the module docstring), then :func:`narrow_bf16`'s rounding."""
    x = np.float64(x)
    f = np.float32(x)
    b = np.int64(_f32_as_i32(f)) & 0xFFFFFFFF
    if x == x and np.float64(f) != x:                   # inexact: round to odd instead
        if abs(np.float64(f)) > abs(x):
            b -= 1                                      # one ulp toward zero (sign-magnitude)
        b |= 1
    return _bf16_from_f32_bits(b)


widen = widen_intrinsic if PATH == "intrinsic" else widen_fallback
"""fp16 bits -> float32 on the selected path (callable from njit code)."""
narrow = narrow_intrinsic if PATH == "intrinsic" else narrow_fallback
"""float32 -> fp16 bits on the selected path (callable from njit code)."""


# ----------------------------------------------------------------------------- load / store
def _compute_type(dtype):
    """The Numba compute type of an array's storage dtype (None if unsupported)."""
    return {types.uint16: types.float32, types.int16: types.float32,
            types.float32: types.float32, types.float64: types.float64,
            types.int64: types.int64}.get(dtype)


def load(a, i):
    """``a[i]`` as its compute value (njit only): fp16 bits widen to float32."""
    raise NotImplementedError("load is only callable from Numba-compiled code")


def store(a, i, v):
    """``a[i] = v`` converted to ``a``'s storage with one rounding (njit only)."""
    raise NotImplementedError("store is only callable from Numba-compiled code")


def to_compute(a, v):
    """Scalar ``v`` as ``a``'s compute type (njit only)."""
    raise NotImplementedError("to_compute is only callable from Numba-compiled code")


@overload(load)
def _load(a, i):
    if a.dtype == types.uint16:
        return lambda a, i: widen(a[i])
    if a.dtype == types.int16:
        return lambda a, i: widen_bf16(a[i])
    if _compute_type(a.dtype) is not None:
        return lambda a, i: a[i]
    return None


@overload(store)
def _store(a, i, v):
    if a.dtype == types.uint16:
        if v == types.float32:
            def impl(a, i, v):
                a[i] = narrow(v)
        else:
            def impl(a, i, v):
                a[i] = narrow64(np.float64(v))
        return impl
    if a.dtype == types.int16:
        if v == types.float32:
            def impl(a, i, v):
                a[i] = narrow_bf16(v)
        else:
            def impl(a, i, v):
                a[i] = narrow64_bf16(v)
        return impl
    if _compute_type(a.dtype) is not None:
        def impl(a, i, v):
            a[i] = v
        return impl
    return None


@overload(to_compute)
def _to_compute(a, v):
    ct = _compute_type(a.dtype)
    if ct == types.float32:
        return lambda a, v: np.float32(v)
    if ct == types.float64:
        return lambda a, v: np.float64(v)
    if ct == types.int64:
        return lambda a, v: np.int64(v)
    return None
