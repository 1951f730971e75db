"""float32-accurate versions of the special functions in the scalar functions of ``miniflow.ops``,
made of multiplies, adds and divides only, so that the CPU loops calling them vectorize.

Numba lowers ``math.erf`` to a call of the C library's ``erf`` and ``math.exp`` to ``llvm.exp``,
which without Intel's SVML is a call of ``exp`` too: one element at a time, in float64 (the scalar
functions multiply by float64 constants). This module overloads, for the CPU target only, the
helpers :func:`~miniflow.ops.elementwise.one_plus_erf_sqrt_half` and
:func:`~miniflow.ops.elementwise.exp_neg_half_square`: a float32 argument (f32, f16 and bf16
tensors) takes the functions here, a float64 one the helper itself (``math``, unchanged); and
:func:`exp_compute`, the exponential of the softmax kernels (``kernels.cpu.reduce``), in
float32 throughout for a float32 argument (:func:`exp_f32`). CUDA keeps libdevice's ``erf`` and
``exp``.

Why erfc and not Eigen's float32 ``erf`` (``generic_fast_erf_float``, XLA's CPU ``erf``: a
rational function of x clamped to [-4, 4]): 1 + erf(z) cancels for z < 0, and gelu(x) = x (1 +
erf(x / sqrt 2)) / 2 with it is 6.6e-5 off (relative) at x = -3 and 16x off at x = -5.6 (erf
clamped to -1). Evaluated as erfc(|z|) (:func:`erfc_approx`, 1 + erf(z) = 2 - erfc(z) for z >= 0),
every gelu is within 3e-7 (relative) of the exact value. One rational function for both signs
also keeps the loops vectorized: LLVM left a loop evaluating both Eigen's erf and the erfc scalar.

Everything here is ``error_model="numpy"`` (no ZeroDivisionError checks) and ``inline="always"``
(Numba IR inlining): a call that LLVM does not inline keeps the kernel loop scalar, and LLVM
inlines neither a large function called twice nor the 91-instruction float32 ``gelu_grad``
(hence its overload below). ``kernels.cpu.common.jitable`` avoids Numba inlining for the scalar
functions in general (a miscompile on Numba 0.68); these bodies are straight-line code, and
``tests/test_kernels_cpu_special.py`` checks their results on a dense grid. The kernels' cache
key covers this file (``kernels.common.cache_key``): an edit here recompiles the kernels whose
scalar functions call these helpers.

Results stored as float16 or bfloat16 keep 11 or 8 bits, and for them the kernels call float32
versions of ``gelu`` and ``gelu_grad`` instead (:data:`HALF_RESULT`, chosen by
:func:`for_result` in the elementwise step makers and in the fused kernels' code alike): the
same formulas, every step in float32, 16 lanes a 512-bit vector where the float64 evaluation has
8; within 5e-7 + 2^-22 x^2 (relative) of the exact value before the rounding to the half type.
"""
from __future__ import annotations

import math
import types as pytypes

import numba
import numpy as np
from numba import types
from numba.extending import overload

from llvmlite import ir

from .fp16 import _bitcast_intrinsic
from .simd import fma_scalar
from ...ops import elementwise as ew

__all__ = ["exp_approx", "erfc_approx", "exp_compute", "exp_f32", "one_plus_erf_f32", "gelu_f32",
           "gelu_grad_f32", "HALF_RESULT", "for_result", "horner"]

_F = np.float32
_u64_as_f64 = _bitcast_intrinsic(types.uint64, types.float64, ir.DoubleType())
_i32_as_f32 = _bitcast_intrinsic(types.int32, types.float32, ir.FloatType())
_IEEE = {"error_model": "numpy"}
_SQRT_HALF = 0.7071067811865476
# Cephes' expf polynomial: e^r = 1 + r + r^2 P(r) for |r| <= ln(2) / 2.
_LOG2E, _LN2 = 1.4426950408889634, 0.6931471805599453
_P = (_F(5.0000001201e-1), _F(1.6666665459e-1), _F(4.1665795894e-2), _F(8.3334519073e-3),
      _F(1.3981999507e-3), _F(1.9875691500e-4))
_EXP_MIN = -700.0        # 2^n stays a normal float64: n >= -1010
# Numerical Recipes' erfcc: erfc(z) = t exp(-z^2 + R(t)), t = 1 / (1 + z / 2), R of degree 9.
_R = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398,
      1.48851587, -0.82215223, 0.17087277)
_C = tuple(math.exp(-0.6) / math.factorial(k) for k in range(11))    # e^-0.6 / k!


@numba.njit(inline="always", **_IEEE)
def exp_approx(a):
    """e^a of a float64 ``a <= 0`` in float64, to float32 accuracy (relative error below 2.5e-7;
    0 below -700, where e^a < 1e-304). NaN gives 0: the callers' other terms carry it.

    Range reduction in float64, a = n ln 2 + r (r exact enough for any float32 result), then
    Cephes' ``expf`` polynomial (S. L. Moshier, ``cephes/single/expf.c``) for e^r in float32, and
    2^n put into the exponent bits of a float64: no float32 underflow, so that x e^(-x^2 / 2)
    rounds once even where e^(-x^2 / 2) is below float32's normal range.
    """
    small = not a >= _EXP_MIN
    a = _EXP_MIN if small else a
    n = np.floor(a * _LOG2E + 0.5)
    r = _F(a - n * _LN2)
    y = fma_scalar(horner(r, _P), r * r, r) + _F(1.0)
    scale = _u64_as_f64(np.uint64((np.int64(n) + 1023) << 52))
    return 0.0 if small else np.float64(y) * scale


@numba.njit(inline="always", **_IEEE)
def exp_near(r):
    """e^r of a float64 ``r`` in [-1.3, 0.1] in float64 (relative error below 1e-9): the Taylor
    series about c = -0.6, e^c sum_{k <= 10} (r - c)^k / k!, |r - c| <= 0.7."""
    return horner(r + 0.6, _C)


@numba.njit(inline="always", **_IEEE)
def horner(t, c):
    """sum_k c[k] t^k by Horner's rule in ``t``'s type (``c`` a tuple of that type), one rounding
    a step (``simd.fma_scalar``)."""
    r = c[len(c) - 1]
    for k in range(len(c) - 2, -1, -1):
        r = fma_scalar(r, t, c[k])
    return r


@numba.njit(inline="always", **_IEEE)
def erfc_approx(z, neg_z2):
    """erfc(z) of a float64 ``z >= 0`` in float64, to float32 accuracy (relative error below
    3e-7; inf gives 0, NaN gives NaN); ``neg_z2`` is -z^2, computed by the caller.

    Numerical Recipes' ``erfcc`` (Press et al., Numerical Recipes in C, 2nd ed., section 6.2: a
    Chebyshev fit, fractional error below 1.2e-7 for every z >= 0), erfc(z) = t e^(-z^2) e^R(t),
    t = 1 / (1 + z / 2), R of degree 9 with values in [-1.27, 0]; e^R(t) is :func:`exp_near`.
    The overloads pass -z^2 = -x^2 / 2 as the same expression as ``exp_neg_half_square``'s
    argument (exact in float64 for a float32 x): after inlining, gelu_grad computes
    :func:`exp_approx` of it once (LLVM merges the two), which keeps gelu_grad small enough for
    LLVM to inline it into the kernel loop, and a call would keep the loop scalar.
    """
    t = 1.0 / (1.0 + 0.5 * z)
    return t * exp_approx(neg_z2) * exp_near(horner(t, _R))


@overload(ew.one_plus_erf_sqrt_half, target="cpu", jit_options=_IEEE, inline="always")
def _one_plus_erf_sqrt_half(x):
    if x == types.float32:
        def impl(x):
            x64 = np.float64(x)
            e = erfc_approx(abs(x64 * _SQRT_HALF), -0.5 * x64 * x64)
            return 2.0 - e if x >= _F(0.0) else e
        return impl
    return ew.one_plus_erf_sqrt_half


@overload(ew.exp_neg_half_square, target="cpu", jit_options=_IEEE, inline="always")
def _exp_neg_half_square(x):
    if x == types.float32:
        def impl(x):
            x64 = np.float64(x)
            return exp_approx(-0.5 * x64 * x64)
        return impl
    return ew.exp_neg_half_square


_gelu_grad_inlined = pytypes.FunctionType(ew.gelu_grad.__code__, ew.gelu_grad.__globals__,
                                          "gelu_grad_inlined")
"""``gelu_grad`` itself (the same code), as the body of the overload below."""


@overload(ew.gelu_grad, target="cpu", jit_options=_IEEE, inline="always")
def _gelu_grad(x, dy):
    """float32 ``gelu_grad`` inlined into the kernel by Numba: its two helpers make it too large
    for LLVM's inliner (91 instructions), and the call kept the loop scalar (19 ms for 2^20
    elements, against 3.3 ms inlined and vectorized). float64 takes the plain scalar function."""
    if x == types.float32:
        return _gelu_grad_inlined
    return None


# ----------------------------------------------------------------------------- float32 throughout
# The float64 evaluation above costs twice the float32 lanes (8 doubles a 512-bit vector against
# 16 floats). The exponential below is as accurate in float32 (relative error below 1e-7, within
# float32's normal range), and serves float32 softmax too. erfc is not (its polynomial in
# float32 is 2e-7 off): a result stored as float16 or bfloat16, which keeps 11 or 8 bits, takes
# the float32 gelu and gelu_grad below; a float32 one, the float64 evaluation above.
_ONE, _HALF, _TWO, _ZERO = _F(1.0), _F(0.5), _F(2.0), _F(0.0)
_SQRT_HALF_F, _INV_SQRT_2PI_F, _LOG2E_F = _F(_SQRT_HALF), _F(ew._INV_SQRT_2PI), _F(_LOG2E)
_C1, _C2 = _F(0.693359375), _F(-2.12194440e-4)      # Cephes' ln 2 in two parts (C1 has 9 bits)
_RF = tuple(_F(c) for c in _R)
_EXP_MIN_F = _F(-104.0)        # e^-104 < 2^-150: below half of float32's least subnormal
_NORMAL_MIN = _F(-126.0)
_EXPONENT_ONE, _BIAS = _F(2.0 ** 23), _F(127.0 * 2.0 ** 23)


@numba.njit(inline="always", **_IEEE)
def _pow2(n):
    """2^n of an integral float32 ``n`` in [-126, 127], built in the exponent bits ((n + 127)
    2^23 is exact in float32)."""
    return _i32_as_f32(np.int32(n * _EXPONENT_ONE + _BIAS))


@numba.njit(**_IEEE)
def _reciprocal(d):
    """1 / d in float32. Not inlined by Numba: a division inlined into a scalar function keeps
    the Python error model's test for a zero divisor (``register_jitable`` compiles with it), which
    makes the function raise and the kernel's loop scalar; LLVM inlines this call, which cannot."""
    return _ONE / d


@numba.njit(inline="always", **_IEEE)
def exp_f32(a):
    """e^a of a float32 ``a <= 0`` in float32 (relative error below 1e-7 in float32's normal
    range; subnormal results rounded twice, 0 below -104 and for NaN: the callers' other terms
    carry a NaN).

    Cephes' ``expf`` (S. L. Moshier, ``cephes/single/expf.c``): a = n ln 2 + r with ln 2 in two
    parts (n C1 exact), e^r by its degree-5 polynomial, and 2^n as two factors 2^max(n, -126)
    2^(n - max(n, -126)), so that results down to 2^-150 are not flushed to 0.
    """
    small = not a >= _EXP_MIN_F
    a = _EXP_MIN_F if small else a
    n = np.floor(a * _LOG2E_F + _HALF)
    r = (a - n * _C1) - n * _C2
    y = fma_scalar(horner(r, _P), r * r, r) + _ONE
    n1 = n if n >= _NORMAL_MIN else _NORMAL_MIN
    return _ZERO if small else y * _pow2(n1) * _pow2(n - n1)


def exp_compute(a):
    """e^a in ``a``'s type, for kernels that take e^a of their compute type (softmax): ``math.exp``
    (libm: one element at a time); a float32 ``a`` takes :func:`exp_f32` (NaN stays NaN), so that
    the loop calling it vectorizes, 16 lanes a 512-bit vector (the float64 :func:`exp_approx`
    before: 4096 x 64 float32 softmax on one Zen 4 core 616 -> 390 us). Kernels call it only for
    ``a <= 0`` (``x - max(x)``, a log-softmax); a float32 ``a`` above 0 is out of its
    contract."""
    return math.exp(a)


@overload(exp_compute, target="cpu", jit_options=_IEEE, inline="always")
def _exp_compute(a):
    if a == types.float32:
        def impl(a):
            return exp_f32(a) if a == a else a
        return impl
    return exp_compute


@numba.njit(inline="always", **_IEEE)
def one_plus_erf_f32(x):
    """1 + erf(x / sqrt(2)) of a float32 ``x`` in float32 (relative error within 5e-7 + 2^-22 x^2
    while the result is a normal float, |x| < 13; inf and NaN as
    ``ew.one_plus_erf_sqrt_half``): Numerical Recipes' ``erfcc`` as in :func:`erfc_approx`,
    erfc(z) = t e^(R(t) - z^2), every step in float32 (z^2 = x^2 / 2 rounded once: its error,
    z^2 2^-24, is a relative error of a small erfc)."""
    z = abs(x) * _SQRT_HALF_F
    t = _reciprocal(_ONE + _HALF * z)
    e = t * exp_f32(horner(t, _RF) - _HALF * (x * x))
    return _TWO - e if x >= _ZERO else e


def gelu_f32(x):
    """``ops.elementwise.gelu`` evaluated in float32 for a float16 or bfloat16 result
    (:data:`HALF_RESULT`): 0.5 x (1 + erf(x / sqrt(2))) with :func:`one_plus_erf_f32` (relative
    error within 5e-7 + 2^-22 x^2 before the result is rounded to its half type)."""
    return _HALF * x * one_plus_erf_f32(x)


def gelu_grad_f32(x, dy):
    """``ops.elementwise.gelu_grad`` evaluated in float32 for a float16 or bfloat16 result:
    dy (Phi(x) + x phi(x)) with :func:`one_plus_erf_f32` and :func:`exp_f32` (error within
    5e-7 + 2^-22 x^2 of |dy| (Phi(x) + |x| phi(x)): the terms' size, as the result crosses 0
    near x = -0.75)."""
    cdf = _HALF * one_plus_erf_f32(x)
    return dy * (cdf + x * _INV_SQRT_2PI_F * exp_f32(-_HALF * (x * x)))


_gelu_f32_inlined = pytypes.FunctionType(gelu_f32.__code__, gelu_f32.__globals__,
                                         "gelu_f32_inlined")
_gelu_grad_f32_inlined = pytypes.FunctionType(gelu_grad_f32.__code__, gelu_grad_f32.__globals__,
                                              "gelu_grad_f32_inlined")


@overload(gelu_f32, target="cpu", jit_options=_IEEE, inline="always")
def _gelu_f32(x):
    """``gelu_f32`` inlined into the kernel by Numba (as ``gelu_grad`` above: LLVM does not
    inline it, and the call keeps the loop scalar)."""
    return _gelu_f32_inlined if x == types.float32 else None


@overload(gelu_grad_f32, target="cpu", jit_options=_IEEE, inline="always")
def _gelu_grad_f32(x, dy):
    """``gelu_grad_f32`` inlined into the kernel by Numba."""
    return _gelu_grad_f32_inlined if x == types.float32 else None


HALF_RESULT = {ew.gelu: gelu_f32, ew.gelu_grad: gelu_grad_f32}
"""An op's scalar function (``OpDef.scalar``) -> the one the CPU kernels call where the op's
result is float16 or bfloat16 (``elementwise``'s step makers and the fused kernels' code alike,
so that fusion keeps the bits): the same formula in float32. 2^19 bfloat16 elements on one Zen 4
core: ``gelu`` 1.51 -> 0.65 ms, ``gelu_grad`` 1.45 -> 0.98 ms."""


_HALF_NAMES = ("float16", "bfloat16", "uint16", "int16")


def for_result(fn, dtype):
    """The scalar function a CPU kernel calls for the op whose scalar function is ``fn``, with
    results of ``dtype`` (a NumPy dtype or its name): :data:`HALF_RESULT`'s for float16 and
    bfloat16 (and their kernel views uint16 and int16, ``common.kview``), else ``fn``."""
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    return HALF_RESULT.get(fn, fn) if name in _HALF_NAMES else fn
