"""The float32 gelu and gelu_grad of the CPU kernels (``kernels.cpu.special``: erfc and exp without
libm calls), the polynomial of their erfc and the softmax kernels' exponential against the exact
values in float64 (``math.erfc``, ``np.exp``), and float64 unchanged."""
import math

import numpy as np
import pytest

from miniflow.kernels.cpu.elementwise import map_kernel, zip_kernel
from miniflow.ops import elementwise as ew

TINY = np.float64(2.0 ** -149)              # float32's least subnormal
SPECIAL = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30, 1e-45, -1e-45, 3e38,
                      -3e38, 4.0, -4.0, 13.0, -13.0, 14.5, -14.5, 40.0, -40.0])
_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _grid():
    """A dense float32 grid over [-16, 16] (the tails: gelu(-16) underflows to -0) and the
    special values."""
    return np.concatenate([np.linspace(-16, 16, 1 << 18, dtype=np.float32), SPECIAL])


def _cdf(x):
    return 0.5 * _erfc(-x * ew._SQRT_HALF)


def _gelu(x):
    out = np.empty_like(x)
    map_kernel(ew.gelu, False)(x, out)
    return out


def _gelu_grad(x, dy):
    out = np.empty_like(x)
    zip_kernel(ew.gelu_grad, False)(x, dy, out)
    return out


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_float32_gelu_is_within_3e_7_of_the_exact_value():
    x = _grid()
    got = _gelu(x).astype(np.float64)
    xd = x.astype(np.float64)
    exact = xd * _cdf(xd)
    finite = np.isfinite(xd)
    err = np.abs(got[finite] - exact[finite])
    assert np.all(err <= 3e-7 * np.abs(exact[finite]) + TINY)
    # infinities and NaN as the float64 scalar function gives them (gelu(-inf) = -inf * 0 = nan)
    edge = ~finite
    want = np.array([ew.gelu(float(v)) for v in xd[edge]], np.float32)
    np.testing.assert_array_equal(got[edge].astype(np.float32), want)
    assert np.signbit(_gelu(np.float32([-0.0, -1e-45])))[0]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_float32_gelu_grad_is_within_3e_7_of_the_exact_value():
    x = _grid()
    dy = np.random.default_rng(0).uniform(-2, 2, x.shape).astype(np.float32)
    got = _gelu_grad(x, dy).astype(np.float64)
    xd, dyd = x.astype(np.float64), dy.astype(np.float64)
    pdf = np.exp(-0.5 * xd * xd) * ew._INV_SQRT_2PI
    exact = dyd * (_cdf(xd) + xd * pdf)
    size = np.abs(dyd) * (_cdf(xd) + np.abs(xd) * pdf)      # gelu' crosses 0 near x = -0.75
    finite = np.isfinite(xd)
    assert np.all(np.abs(got[finite] - exact[finite]) <= 3e-7 * size[finite] + TINY)
    edge = ~finite
    want = np.array([ew.gelu_grad(float(v), float(d)) for v, d in zip(xd[edge], dyd[edge])],
                    np.float32)
    np.testing.assert_array_equal(got[edge].astype(np.float32), want)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_float64_gelu_and_gelu_grad_are_the_scalar_functions_bit_for_bit():
    x = np.concatenate([np.linspace(-40, 40, 20001), SPECIAL.astype(np.float64)])
    dy = np.random.default_rng(1).uniform(-2, 2, x.shape)
    out = np.empty_like(x)
    map_kernel(ew.gelu, False)(x, out)
    np.testing.assert_array_equal(out, [ew.gelu(v) for v in x])
    zip_kernel(ew.gelu_grad, False)(x, dy, out)
    np.testing.assert_array_equal(out, [ew.gelu_grad(v, d) for v, d in zip(x, dy)])


def _exp_compute(a):
    import numba
    from miniflow.kernels.cpu.special import exp_compute

    @numba.njit
    def run(a, out):
        for i in range(a.size):
            out[i] = exp_compute(a[i])

    out = np.empty_like(a)
    run(a, out)
    return out


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_float32_exp_compute_is_within_3e_7_of_the_exact_value():
    """The softmax kernels' exponential (``special.exp_compute``) of x - max(x) <= 0."""
    a = np.concatenate([np.linspace(-110, 0, 1 << 18, dtype=np.float32),
                        np.float32([-0.0, -1e-30, -1e-45, -87.3, -103.9, -104.0, -3e38])])
    got = _exp_compute(a).astype(np.float64)
    exact = np.exp(a.astype(np.float64))
    assert np.all(np.abs(got - exact) <= 3e-7 * exact + TINY)
    edge = _exp_compute(np.float32([-np.inf, np.nan]))
    assert edge[0] == 0 and np.isnan(edge[1])


def test_float64_exp_compute_is_math_exp_bit_for_bit():
    a = np.concatenate([np.linspace(-745, 0, 20001), [-np.inf, np.nan, -0.0]])
    np.testing.assert_array_equal(_exp_compute(a), [math.exp(v) for v in a])


# ------------------------------------------------------------------------ half-type results
def _half_steps(fn, dtype, *arrays):
    """``fn``'s result as the CPU step makers compute it for ``dtype``."""
    from miniflow.kernels.cpu.elementwise import map_steps, zip_steps
    args = [a.astype(dtype) for a in arrays]
    out = np.empty_like(args[0])
    steps = map_steps(fn, *args, out) if len(args) == 1 else zip_steps(fn, *args, out)
    for kernel, kargs in steps:
        kernel(*kargs)
    return args, out


def _rounded_within(got, exact, err, dtype):
    """Whether each half-type ``got`` is the rounding to ``dtype`` of some value within ``err``
    of ``exact`` (float64): between the roundings of ``exact - err`` and ``exact + err``
    (rounding is monotonic), which is ``exact`` rounded but near a rounding boundary."""
    low, high = ((exact + s * err).astype(dtype).astype(np.float64) for s in (-1, 1))
    g = got.astype(np.float64)
    return (low <= g) & (g <= high)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_half_gelu_and_gelu_grad_are_the_exact_values_rounded(name):
    """float16 and bfloat16 results come from the float32 evaluation of float32 results: each is
    the exact value (float64 ``math.erfc``) rounded to its type, or, within the float32
    evaluation's error of a rounding boundary, its neighbour; infinities, NaN and the sign of
    zero as the float32 kernels give them."""
    from miniflow.dtype import as_dtype
    dtype = as_dtype(name).np
    x = _grid()
    dy = np.random.default_rng(2).uniform(-2, 2, x.shape).astype(np.float32)
    (xh,), got = _half_steps(ew.gelu, dtype, x)
    xd = xh.astype(np.float64)
    finite = np.isfinite(xd)
    exact = xd * _cdf(xd)
    err = 3e-7 * np.abs(exact) + TINY
    assert np.all(_rounded_within(got, exact, err, dtype)[finite])
    np.testing.assert_array_equal(got[~finite].astype(np.float32),
                                  _gelu(xh[~finite].astype(np.float32)))
    assert np.signbit(got[x == 0][np.signbit(x[x == 0])]).all()

    (xh, dyh), got = _half_steps(ew.gelu_grad, dtype, x, dy)
    xd, dyd = xh.astype(np.float64), dyh.astype(np.float64)
    pdf = np.exp(-0.5 * xd * xd) * ew._INV_SQRT_2PI
    exact = dyd * (_cdf(xd) + xd * pdf)
    size = np.abs(dyd) * (_cdf(xd) + np.abs(xd) * pdf)
    err = 3e-7 * size + TINY
    assert np.all(_rounded_within(got, exact, err, dtype)[finite])
    np.testing.assert_array_equal(
        got[~finite].astype(np.float32),
        _gelu_grad(xh[~finite].astype(np.float32), dyh[~finite].astype(np.float32)))


def test_erfc_polynomial_is_within_2_5e_8_of_shepherd_and_laframboise_function():
    """``special.ERFC_POLY``: 1 + p(q) against F(q) = (1 + 2a) e^(a^2) erfc(a), a = 2 (1 + q) /
    (1 - q), in float64 over its range q in [-1, 0.7] (a from 0 to 11.3, |x| to 16)."""
    from numpy.polynomial import polynomial
    from miniflow.kernels.cpu.special import ERFC_POLY
    q = np.linspace(-1, 0.7, 100001)
    a = 2 * (1 + q) / (1 - q)
    exact = (1 + 2 * a) * np.exp(a * a) * _erfc(a)
    got = 1 + polynomial.polyval(q, np.float64(ERFC_POLY))
    assert np.all(np.abs(got / exact - 1) <= 2.5e-8)
