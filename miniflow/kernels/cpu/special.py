"""float32 versions of the special functions in the scalar functions of ``miniflow.ops``, made of
multiplies, adds and divides only, so that the CPU loops calling them vectorize.

Numba lowers ``math.erf`` to a call of the C library's ``erf`` and ``math.exp`` to ``llvm.exp``,
which without Intel's SVML is a call of ``exp`` too: one element at a time. This module overloads,
for the CPU target only and a float32 argument (f32, f16 and bf16 tensors), the scalar functions
:func:`~miniflow.ops.elementwise.gelu` and :func:`~miniflow.ops.elementwise.gelu_grad`, and
:func:`exp_compute`, the exponential of the softmax kernels (``kernels.cpu.reduce``); float64
takes the scalar functions themselves (``math``, unchanged), and CUDA keeps libdevice's ``erf``
and ``exp``.

gelu needs erfc, not erf: 1 + erf(z) cancels for z < 0, and Eigen's float32 ``erf`` (XLA's CPU
``erf``, clamped to [-4, 4]) makes gelu 6.6e-5 off (relative) at x = -3 and 16x off at x = -5.6.
Here (:func:`erfc_scaled`, :func:`gauss_exp`) erfc(|x| / sqrt 2) = f (1 + c) e^(-x^2 / 2), with
f = F(q) / (1 + sqrt(2) |x|) and F(q) = (1 + 2a) e^(a^2) erfc(a) a polynomial in
q = (a - 2) / (a + 2), a = |x| / sqrt 2 (M. M. Shepherd and J. G. Laframboise, "Chebyshev
approximation of (1 + 2x) exp(x^2) erfc x in 0 <= x < infinity", Math. Comp. 36 (1981): F
varies only from 1 to 2 / sqrt(pi) over all of a >= 0, so that a polynomial of degree 10 in q
holds it to 2.2e-8). c corrects the rounding of the divisor and of its reciprocal; x^2 / 2 enters
the exponential as the exact pair ``x * x`` plus its rounding error (``fma``), and the
exponential is Cephes' ``expf`` (:func:`exp_f32`) with its power of two applied last, in two
factors, so that a subnormal result is rounded once. Nothing rounds x^2 / 2 (Numerical Recipes'
``erfcc`` in float32, what half-type results took before, did: 2^-22 x^2 off, relative; float32
results took it in float64, 8 lanes a 512-bit vector against 16).

Every float32 gelu is within 2.7e-7 (relative) of the exact value, every float32 gelu_grad
within 2.4e-7 of |dy| (Phi(x) + |x| phi(x)) (the terms' size, as the result crosses 0 near
x = -0.75): the largest errors over 2^24 random floats in [-15, 15], 2^21 of magnitudes 2^-30 to
8 and a dense grid over [-16, 16] (``tests/test_kernels_cpu_special.py`` checks 3e-7 on the grid,
for float32 results and, before their rounding, float16 and bfloat16 ones). 2^19 elements on one
Zen 4 core (``NUMBA_NUM_THREADS=1``): float32 ``gelu`` 1003 -> 482 us, ``gelu_grad`` 1108 ->
518 us (the float64 evaluation before: 8 lanes a 512-bit vector); bfloat16 593 -> 560 and
749 -> 600 us (an evaluation in float32 before too, Numerical Recipes' ``erfcc``, 2^-22 x^2
off); PyTorch 2.x eager (Abramowitz and Stegun's erf, 1.5e-7 absolute) 248 and 434 us.

Everything here is ``error_model="numpy"`` (no ZeroDivisionError checks) and ``inline="always"``
(Numba IR inlining): a call that LLVM does not inline keeps the kernel loop scalar, and LLVM
inlines neither a large function called twice nor a 91-instruction ``gelu_grad`` (hence the
overloads below). ``kernels.cpu.common.jitable`` avoids Numba inlining for the scalar functions
in general (a miscompile on Numba 0.68); these bodies are straight-line code, and
``tests/test_kernels_cpu_special.py`` checks their results on a dense grid. The kernels' cache
key covers this file (``kernels.common.cache_key``): an edit here recompiles the kernels whose
scalar functions call these helpers.
"""
from __future__ import annotations

import math
import types as pytypes

import numba
import numpy as np
from numba import types
from numba.extending import overload

from llvmlite import ir

from .common import jitable
from .fp16 import _bitcast_intrinsic
from .simd import fma_scalar
from ...ops import elementwise as ew

__all__ = ["exp_compute", "exp_f32", "erfc_scaled", "gauss_exp", "horner", "ERFC_POLY"]

_F = np.float32
_i32_as_f32 = _bitcast_intrinsic(types.int32, types.float32, ir.FloatType())
_IEEE = {"error_model": "numpy"}
_ONE, _HALF, _TWO, _ZERO = _F(1.0), _F(0.5), _F(2.0), _F(0.0)
# Cephes' expf: e^r = 1 + r + r^2 P(r) for |r| <= ln(2) / 2, ln 2 in two parts (C1 has 9 bits).
_P = (_F(5.0000001201e-1), _F(1.6666665459e-1), _F(4.1665795894e-2), _F(8.3334519073e-3),
      _F(1.3981999507e-3), _F(1.9875691500e-4))
_LOG2E = _F(1.4426950408889634)
_C1, _C2 = _F(0.693359375), _F(-2.12194440e-4)
_EXP_MIN = _F(-104.0)        # e^-104 < 2^-150: below half of float32's least subnormal
_NORMAL_MIN = _F(-126.0)
_EXPONENT_ONE, _BIAS = _F(2.0 ** 23), _F(127.0 * 2.0 ** 23)
# F(q) - 1 = (1 + 2a) e^(a^2) erfc(a) - 1, q = (a - 2) / (a + 2), for q in [-1, 0.7] (a <= 11.3):
# a least-squares fit in Chebyshev polynomials at 2000 Chebyshev nodes, weighted 1 / F (relative
# error), degree 10, in powers of q, rounded to float32 (tests/test_kernels_cpu_special.py).
ERFC_POLY = (_F(2.769784e-01), _F(-9.2763886e-02), _F(-1.6603164e-01), _F(1.6405268e-01),
             _F(-5.4202e-02), _F(-8.039143e-03), _F(8.628669e-03), _F(1.2525879e-03),
             _F(-1.2489947e-03), _F(-3.3980896e-04), _F(3.8017624e-05))
"""F(q) - 1 in powers of q (:func:`erfc_scaled`)."""
_SQRT_HALF = _F(0.7071067811865476)
_SQRT2 = _F(1.4142135623730951)
_SQRT2_LO = _F(1.4142135623730951 - float(_SQRT2))     # sqrt 2 - _SQRT2
_INV_SQRT_2PI = _F(ew._INV_SQRT_2PI)
_TAIL = _F(15.0)             # |x| above: erfc(|x| / sqrt 2) < 2^-165, 0 in float32 products
_SCALE_MIN, _SPLIT = _F(-170.0), _F(-120.0)


def horner(t, c):
    """sum_k c[k] t^k by Horner's rule in ``t``'s type (``c`` a tuple of that type), one rounding
    a step (``simd.fma_scalar``) in compiled code. Called from Python (no ``fma`` there before
    Python 3.13), each step rounds twice."""
    r = c[-1]
    for k in range(len(c) - 2, -1, -1):
        r = r * t + c[k]
    return r


@overload(horner, target="cpu", jit_options=_IEEE, inline="always")
def _horner(t, c):
    """:func:`horner` for a tuple of ``c.count`` coefficients, its steps written out: straight-line
    code, as :func:`_zero_if` is a call (a loop inlined twice into one kernel made Numba's SSA pass
    warn that the loop's variable was "not in scope")."""
    steps = "".join(f"    r = fma_scalar(r, t, c[{k}])\n" for k in range(c.count - 2, -1, -1))
    scope = {"fma_scalar": fma_scalar}
    exec(f"def impl(t, c):\n    r = c[{c.count - 1}]\n{steps}    return r\n", scope)
    return scope["impl"]


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


@numba.njit(**_IEEE)
def _zero_if(cond, v):
    """0 where ``cond``, else the float32 ``v``. Not inlined by Numba (LLVM inlines it, a
    ``select``): a conditional expression inlined twice into one kernel (``gelu_grad(x,
    gelu_grad(x, dy))`` fused) made Numba's SSA pass warn that its value was "not in scope"
    (``NumbaIRAssumptionWarning``), a warning every user compiling such a chain saw."""
    return _ZERO if cond else v


@numba.njit(inline="always", **_IEEE)
def _exp_reduced(a):
    """``(n, w)`` with e^a = 2^n (1 + w), |w| < 0.42, for a float32 ``a`` (Cephes' reduction and
    polynomial: a = n ln 2 + r with n C1 exact, 1 + w = e^r; relative error of 1 + w below 6e-8)."""
    n = np.floor(a * _LOG2E + _HALF)
    r = (a - n * _C1) - n * _C2
    return n, fma_scalar(horner(r, _P), r * r, r)


@numba.njit(inline="always", **_IEEE)
def exp_f32(a):
    """e^a of a float32 ``a <= 0`` in float32 (relative error below 1e-7 in float32's normal
    range; subnormal results rounded twice, 0 below -104 and for NaN: the callers' other terms
    carry a NaN).

    Cephes' ``expf`` (S. L. Moshier, ``cephes/single/expf.c``): a = n ln 2 + r with ln 2 in two
    parts (n C1 exact), e^r by its degree-5 polynomial, and 2^n as two factors 2^max(n, -126)
    2^(n - max(n, -126)), so that results down to 2^-150 are not flushed to 0.
    """
    small = not a >= _EXP_MIN
    n, w = _exp_reduced(_EXP_MIN if small else a)
    n1 = n if n >= _NORMAL_MIN else _NORMAL_MIN
    return _ZERO if small else (w + _ONE) * _pow2(n1) * _pow2(n - n1)


def exp_compute(a):
    """e^a in ``a``'s type, for kernels that take e^a of their compute type (softmax): ``math.exp``
    (libm: one element at a time); a float32 ``a`` takes :func:`exp_f32` (NaN stays NaN), so that
    the loop calling it vectorizes, 16 lanes a 512-bit vector (the float64 evaluation before:
    4096 x 64 float32 softmax on one Zen 4 core 616 -> 390 us). Kernels call it only for
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
def gauss_exp(x):
    """``(w, s1, s2)`` with e^(-x^2 / 2) = (1 + w) s1 s2 for a float32 ``x`` (relative error
    below 7e-8 while the result is above 2^-170; s1 = 2^max(n, -120) and s2 = 2^(n - that) are
    powers of two, so that a product scaled by them last rounds once, subnormal or not).

    x^2 = s + t exactly (t the rounding error of s = x x, by ``fma``): e^(-x^2 / 2) =
    e^(-s / 2) (1 - t / 2), the first by Cephes' ``expf`` reduction (:func:`exp_f32`), and no
    rounding of x^2 / 2 (2^-24 x^2 / 2, a relative error of 1e-5 at x = 6)."""
    s = x * x
    t = fma_scalar(x, x, -s)
    n, w = _exp_reduced(-_HALF * s)
    n = max(n, _SCALE_MIN)
    n1 = max(n, _SPLIT)
    return w - _HALF * t * (_ONE + w), _pow2(n1), _pow2(n - n1)


@numba.njit(inline="always", **_IEEE)
def erfc_scaled(ax):
    """``(f, c)`` with erfc(ax / sqrt 2) = f (1 + c) e^(-ax^2 / 2) for a float32 ``ax >= 0`` up to
    15 (relative error below 1.3e-7 with c, below 1.9e-7 without; |c| below 1.1e-7).

    f = F(q) / (1 + sqrt(2) ax), F(q) = 1 + :data:`ERFC_POLY` (q) (Shepherd and Laframboise,
    the module docstring), computed as ``fma(p, r, r)`` with r = 1 / d, d = 1 + sqrt(2) ax
    rounded; c = 1 - (d + dl) r, with dl the rounding error of d (1 - d is exact for d >= 1),
    corrects both d and r (one Newton step of the division)."""
    a = ax * _SQRT_HALF
    p = horner((a - _TWO) / (a + _TWO), ERFC_POLY)
    d = fma_scalar(ax, _SQRT2, _ONE)
    r = _reciprocal(d)
    dl = fma_scalar(ax, _SQRT2_LO, fma_scalar(ax, _SQRT2, _ONE - d))
    return fma_scalar(p, r, r), fma_scalar(-dl, r, fma_scalar(-d, r, _ONE))


@numba.njit(inline="always", **_IEEE)
def _terms(x):
    """``(E, P, s1, s2)``: erfc(|x| / sqrt 2) = E s1 s2 and x phi(x) = P s1 s2 (phi the normal
    density) for a float32 ``x``; E = P = 0 where |x| > 15 (erfc and phi are 0 in every float32
    product there; the polynomial's range ends at 16), s1 and s2 finite."""
    ax = abs(x)
    f, c = erfc_scaled(ax)
    w, s1, s2 = gauss_exp(x)
    xc = x * _INV_SQRT_2PI
    tail = ax > _TAIL
    return _zero_if(tail, fma_scalar(f, w + c, f)), _zero_if(tail, fma_scalar(xc, w, xc)), s1, s2


def _gelu_f32(x):
    """``ops.elementwise.gelu`` of a float32 ``x`` (the module docstring): x Phi(x) =
    x (2 - erfc(x / sqrt 2)) / 2 for x >= 0, x erfc(|x| / sqrt 2) / 2 below; inf, NaN and the
    sign of zero as the float64 scalar function gives them (gelu(-inf) = -inf * 0 = NaN)."""
    e, _, s1, s2 = _terms(x)
    if x >= _ZERO:
        return _HALF * x * (_TWO - e * s1 * s2)
    return (e * (_HALF * x) * s1) * s2


def _gelu_grad_f32(x, dy):
    """``ops.elementwise.gelu_grad`` of a float32 ``x`` and ``dy``: dy (Phi(x) + x phi(x)) =
    dy + dy (x phi - erfc / 2) s for x >= 0 (one ``fma`` with dy), dy (erfc / 2 + x phi) s below
    (:func:`_terms`; inf and NaN as the float64 scalar function gives them: the terms plus 0 x,
    NaN for an infinite x)."""
    e, p, s1, s2 = _terms(x)
    x0 = _ZERO * x
    if x >= _ZERO:
        return fma_scalar(dy, fma_scalar(-_HALF, e, p) * s1 * s2 + x0, dy)
    return ((dy * (fma_scalar(_HALF, e, p) + x0)) * s1) * s2


def _inlined(fn, name):
    """A copy of the plain function ``fn`` (the same code) for an overload to return: Numba
    compiles it inlined into the kernel (``inline="always"``)."""
    return pytypes.FunctionType(fn.__code__, fn.__globals__, name)


_GELU, _GELU_GRAD = _inlined(_gelu_f32, "gelu_f32"), _inlined(_gelu_grad_f32, "gelu_grad_f32")


@overload(ew.gelu, target="cpu", jit_options=_IEEE, inline="always")
def _gelu(x):
    """float32 ``gelu``: :func:`_gelu_f32`, inlined into the kernel by Numba (LLVM does not
    inline it, and the call keeps the loop scalar); float64 takes the plain scalar function."""
    return _GELU if x == types.float32 else None


@overload(ew.gelu_grad, target="cpu", jit_options=_IEEE, inline="always")
def _gelu_grad(x, dy):
    """float32 ``gelu_grad``: :func:`_gelu_grad_f32`, inlined (a call kept the loop scalar: 19 ms
    for 2^20 elements against 3.3 ms inlined)."""
    return _GELU_GRAD if x == types.float32 else None


for _helper in ew.SCALAR_HELPERS:     # what the float64 scalar functions call (math)
    jitable(_helper)
