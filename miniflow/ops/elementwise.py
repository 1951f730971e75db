"""Elementwise ops: unary math, scalar_* ops, broadcast_* binary ops (maximum and minimum
included), activation grads, bias_add.

An elementwise op is declared once, here: its scalar function (a plain Python function of floats,
``math`` only), its NumPy float64 reference, gradient rule, samples and AMP list, with
:func:`elementwise`. From the scalar function come the CPU kernel (``numba.njit`` loops), the CUDA
kernel (``cuda.jit(device=True)``), the fused kernels and the function of that name in the fused
expression language (minitorch's pattern, ``minitorch/operators.py``, and JAX's one-place
primitives). Adding an op is a scalar function and an :func:`elementwise` call, and its gradient
op the same (lesson 8, ``tutorials/08_add_an_op.py``; ``docs/extending.md``).

Scalar functions: NaN propagates through every one (``relu(nan) = nan``, as in PyTorch). Numba
types float literals as float64, so ``1.0 - y`` on a float32 ``y`` is computed in float64; kernels
round every result to the compute type (float32 for f16/f32 tensors) before storing.

Gradient rules follow OneFlow's (``oneflow/core/autograd/gradient_funcs/*.cpp`` and
``oneflow/user/ops/*_op.cpp``); AMP lists are OneFlow's after PR 9126
(``oneflow/core/job_rewriter/auto_mixed_precision_lists.cpp``).
"""
from __future__ import annotations

import math

import numpy as np

from .common import (broadcast_shape, check_arity, check_float, float_or_int64, float_samples,
                     fmt, rand, unbroadcast, y_dy_infer)
from .registry import register


# ------------------------------------------------------------------------------ scalar functions
def add(a, b):
    """a + b"""
    return a + b


def sub(a, b):
    """a - b"""
    return a - b


def mul(a, b):
    """a * b"""
    return a * b


def div(a, b):
    """a / b (IEEE: x/0 = +-inf, 0/0 = nan; Numba's ``error_model="numpy"`` is needed for this)."""
    return a / b


def neg(x):
    """-x"""
    return -x


def identity(x):
    """x"""
    return x


def exp(x):
    """e**x"""
    return math.exp(x)


def log(x):
    """Natural log (log(0) = -inf, log(x<0) = nan)."""
    return math.log(x)


def sin(x):
    """Sine (sin(+-inf) = nan)."""
    return math.sin(x)


def cos(x):
    """Cosine (cos(+-inf) = nan)."""
    return math.cos(x)


def log1p(x):
    """log(1 + x), exact near 0 (log1p(-1) = -inf, log1p(x < -1) = nan)."""
    return math.log1p(x)


def floor(x):
    """The largest integer <= x, as a float (-0.0 stays -0.0; inf, nan and integers from 2^52
    up are themselves)."""
    return floor_of(x)


def round_half_even(x):
    """x rounded to the nearest integer, halves to the even one (PyTorch's ``torch.round``,
    NumPy's ``np.round``; the sign of a zero result is x's: round(-0.3) = -0.0)."""
    if not abs(x) < 4503599627370496.0:
        return x
    t = floor_of(x)
    d = x - t                     # exact: t and x are within 1 of each other
    if d > 0.5 or (d == 0.5 and t % 2.0 != 0.0):
        t += 1.0
    return math.copysign(0.0, x) if t == 0.0 else t


def relu(x):
    """max(x, 0) with +0.0 for x <= 0 and nan for nan."""
    if x > 0.0 or x != x:
        return x
    return 0.0


def tanh(x):
    """Hyperbolic tangent."""
    return math.tanh(x)


def sigmoid(x):
    """1 / (1 + e**-x), evaluated so that no exp overflows: e**x / (1 + e**x) for x < 0."""
    if x >= 0.0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)        # nan stays nan here
    return z / (1.0 + z)


def rsqrt(x):
    """1 / sqrt(x) (rsqrt(0) = inf, rsqrt(x<0) = nan)."""
    return 1.0 / math.sqrt(x)


def sqrt(x):
    """Square root (sqrt(-0) = -0, sqrt(x<0) = nan)."""
    return math.sqrt(x)


def absolute(x):
    """|x| (|-0| = 0, |nan| = nan)."""
    return math.fabs(x)


def absolute_grad(x, dy):
    """dy * sign(x), 0 at x = 0 and at NaN (PyTorch's ``abs`` backward, ``dy * sgn(x)``)."""
    if x > 0.0:
        return dy
    if x < 0.0:
        return -dy
    return 0.0


def power(x, p):
    """x ** p as PyTorch's ``pow(x, p)`` with a number ``p``: C's ``pow``, but ``p = 0.5`` and
    ``p = -0.5`` are ``sqrt`` and ``1 / sqrt`` (so ``(-0) ** 0.5 = -0``, as PyTorch's kernel
    computes those exponents; ``aten/src/ATen/native/cpu/PowKernel.cpp``). ``x ** 0 = 1`` for
    every x, NaN included; a negative x to a non-integer p is nan."""
    if p == 0.5:
        return math.sqrt(x)
    if p == -0.5:
        return 1.0 / math.sqrt(x)
    return math.pow(x, p)


def power_derivative(x, p):
    """d x**p / dx = p * x ** (p - 1), and 0 for p = 0 everywhere (PyTorch's ``pow_backward``)."""
    if p == 0.0:
        return 0.0
    return p * power(x, p - 1.0)


def power_exponent_derivative(x, y):
    """d x**y / dy = x**y * log(x), and 0 where x = 0 and y >= 0 (PyTorch's
    ``pow_backward_exponent``); nan for a negative x (a real logarithm)."""
    if x == 0.0 and y >= 0.0:
        return 0.0
    return power(x, y) * math.log(x)


def relu_grad(y, dy):
    """dy where y > 0, else 0 (y = relu(x); PyTorch's threshold_backward: y <= 0 -> 0)."""
    if y <= 0.0:
        return 0.0
    return dy


def tanh_grad(y, dy):
    """dy * (1 - y*y) with y = tanh(x)."""
    return dy * (1.0 - y * y)


def sigmoid_grad(y, dy):
    """dy * (1 - y) * y with y = sigmoid(x) (PyTorch's order)."""
    return dy * (1.0 - y) * y


_SQRT_HALF = 0.7071067811865476        # 1 / sqrt(2)
_INV_SQRT_2PI = 0.3989422804014327     # 1 / sqrt(2 pi)


def one_plus_erf_sqrt_half(x):
    """1 + erf(x / sqrt(2)) = 2 Phi(x), the erf term of :func:`gelu` and :func:`gelu_grad`, in
    float64 (CUDA compiles it: libdevice ``erf``; the CPU kernels take float32 versions of gelu
    and gelu_grad themselves for a float32 ``x``, without a libm call, so that the loops
    vectorize: ``kernels.cpu.special``)."""
    return 1.0 + math.erf(x * _SQRT_HALF)


def exp_neg_half_square(x):
    """exp(-x^2 / 2), the unnormalised normal density of :func:`gelu_grad`, in float64 (as
    :func:`one_plus_erf_sqrt_half`)."""
    return math.exp(-0.5 * x * x)


def floor_of(x):
    """floor(x) as a float without ``math.floor`` (Numba's returns an int, undefined for inf
    and nan): truncation by ``int`` where |x| < 2^52, one less below a negative non-integer."""
    if not abs(x) < 4503599627370496.0:
        return x
    t = float(int(x))
    if t > x:
        t -= 1.0
    return math.copysign(0.0, x) if t == 0.0 else t


SCALAR_HELPERS = (one_plus_erf_sqrt_half, exp_neg_half_square, power, floor_of)
"""The functions that scalar functions call (backends compile them with the scalar function: the
CPU through Numba overloads, CUDA as device functions)."""


def gelu(x):
    """x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2))): the exact GELU (Hendrycks & Gimpel 2016,
    arXiv:1606.08415), PyTorch's default (``approximate='none'``)."""
    return 0.5 * x * one_plus_erf_sqrt_half(x)


def gelu_grad(x, dy):
    """dy * (Phi(x) + x phi(x)), phi the normal density (OneFlow's ``gelu_grad(x, dy)``)."""
    cdf = 0.5 * one_plus_erf_sqrt_half(x)
    return dy * (cdf + x * _INV_SQRT_2PI * exp_neg_half_square(x))


def silu(x):
    """x * sigmoid(x) (SiLU, also "swish"; Elfwing et al. 2017, arXiv:1702.03118), evaluated as
    sigmoid is, so that no exp overflows."""
    if x >= 0.0:
        return x / (1.0 + math.exp(-x))
    z = math.exp(x)        # nan stays nan here
    return x * z / (1.0 + z)


def silu_grad(x, dy):
    """dy * (s * (1 + x (1 - s))) with s = sigmoid(x) (OneFlow's ``silu_grad(x, dy)``)."""
    if x >= 0.0:
        s = 1.0 / (1.0 + math.exp(-x))
    else:
        z = math.exp(x)
        s = z / (1.0 + z)
    return dy * (s * (1.0 + x * (1.0 - s)))


def softplus(x, beta, threshold):
    """PyTorch's ``softplus(x, beta, threshold)``: ``x`` where ``beta * x > threshold``, else
    ``log(1 + exp(beta * x)) / beta``, evaluated as ``(max(z, 0) + log1p(exp(-|z|))) / beta``
    with ``z = beta * x`` so that no exp overflows (NaN propagates: it takes the last branch).
    Source: https://pytorch.org/docs/stable/generated/torch.nn.Softplus.html; OneFlow's op
    ``softplus`` (``UnaryOp::kSoftPlus``)."""
    z = x * beta
    if z > threshold:
        return x
    m = z if z > 0.0 else 0.0
    return (m + math.log1p(math.exp(-abs(z)))) / beta


def softplus_derivative(x, beta, threshold):
    """d softplus(x, beta, threshold) / dx: 1 where ``beta * x > threshold``, else
    ``sigmoid(beta * x)``, evaluated as :func:`sigmoid` is (PyTorch's ``softplus_backward`` and
    OneFlow's ``softplus_grad`` without the factor dy)."""
    z = x * beta
    if z > threshold:
        return 1.0
    if z >= 0.0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)        # nan stays nan here
    return e / (1.0 + e)


# ------------------------------------------------------------------------------ the declaration
def _unary_infer(op, check=check_float):
    def infer(inputs, attrs):
        check_arity(op, inputs, 1)
        dt = check(op, inputs[0])
        return [(inputs[0].shape, dt)]
    return infer


def _any_dtype_samples(edge=()):
    """:func:`unary_samples` and int64 ones (large values, which a float64 path would round,
    and the ints of ``edge``), of an op OneFlow runs on any dtype (``identity``)."""
    r = np.random.default_rng(8)
    ints = [([r.integers(-2 ** 62, 2 ** 62, (3, 4))], {}),
            ([np.array([0, 1, -1, 2 ** 53 + 1, *edge], np.int64)], {})]
    return lambda: unary_samples()() + ints


def _binary_infer(op):
    def infer(inputs, attrs):
        check_arity(op, inputs, 2)
        dt = check_float(op, *inputs)
        return [(broadcast_shape(op, inputs[0], inputs[1]), dt)]
    return infer


def unary_samples(lo=-2.0, hi=2.0, scalar=None, attrs=None):
    """Samples of a one-input elementwise op: random values in [lo, hi), special values (signed
    zero, NaN, +-1e4: inf in float16), an empty array and a long one; f32 and f16. ``attrs``:
    the op's attributes in every sample (``{"beta": 2.0, "threshold": 5.0}``); ``scalar``: short
    for ``attrs={"scalar": scalar}`` (the ``scalar_*`` ops)."""
    attrs = dict(attrs or {}) if scalar is None else {"scalar": scalar, **(attrs or {})}

    def make(dt):
        edge = np.array([0.0, -0.0, np.nan, 1e4, -1e4], dt)
        return [([rand(3, 5, dtype=dt, lo=lo, hi=hi)], attrs), ([edge], attrs),
                ([rand(0, 4, dtype=dt)], attrs), ([rand(70, dtype=dt, lo=lo, hi=hi)], attrs)]
    return lambda: float_samples(make)


def binary_samples(positive_rhs=False):
    """Samples of a broadcasting two-input op: equal shapes, a row, a 3-D broadcast, an empty
    array and float16 overflow with NaN; f32 and f16."""
    lo = 0.5 if positive_rhs else -2.0

    def make(dt):
        r = np.random.default_rng(7)
        big = np.array([60000.0, -60000.0, np.nan], dt)
        return [([rand(3, 4, dtype=dt, r=r), rand(3, 4, dtype=dt, r=r, lo=lo)], {}),
                ([rand(3, 4, dtype=dt, r=r), rand(4, dtype=dt, r=r, lo=lo)], {}),
                ([rand(2, 1, 3, dtype=dt, r=r), rand(4, 1, dtype=dt, r=r, lo=lo)], {}),
                ([rand(0, 3, dtype=dt, r=r), rand(1, 3, dtype=dt, r=r, lo=lo)], {}),
                ([big, np.array([2.0, 2.0, 1.0], dt)], {})]
    return lambda: float_samples(make)


def grad_samples(lo, hi):
    """Samples of an activation gradient ``op(y or x, dy)``: the first input in [lo, hi)."""
    def make(dt):
        r = np.random.default_rng(3)
        return [([rand(4, 6, dtype=dt, lo=lo, hi=hi, r=r), rand(4, 6, dtype=dt, r=r)], {}),
                ([rand(0, 2, dtype=dt, r=r), rand(0, 2, dtype=dt, r=r)], {})]
    return lambda: float_samples(make)


def elementwise(name: str, scalar, reference, *, amp: str | None, amp_note: str = "", grad=None,
                samples=None, infer=None, scalar_attrs: tuple = (), defaults=None, doc: str = ""):
    """Declare the elementwise op ``name``: ``out = scalar(x[, y], *attrs of scalar_attrs)`` per
    element, inputs broadcast (NumPy rules); returns its OpDef.

    Args:
        scalar: the scalar function (this module's functions; ``math`` only).
        reference: the same function on NumPy float64 arrays (``np.tanh``), taking the scalar
            attributes as floats after the arrays, in ``scalar_attrs`` order.
        amp, amp_note: the op's AMP list and remark (``OpDef.amp``).
        grad: the gradient rule (``OpDef.grad``), or None.
        samples: sample inputs; default :func:`unary_samples` / :func:`binary_samples` by arity.
        infer: shape/dtype inference; default: one float input, or two broadcast float inputs.
        scalar_attrs: the attributes that are the scalar function's last operands, in order (one
            tensor operand only: ``OpDef.scalar_attrs``).
        defaults: attribute -> value used when a node omits it (``{"beta": 1.0}``); an attribute
            without one must be given.
    """
    def ref(arrays, attrs):
        out = np.asarray(reference(*arrays, *op.scalar_args(attrs)))
        return [out if out.dtype == np.int64 else out.astype(np.float64)]

    unary = scalar.__code__.co_argcount - len(scalar_attrs) == 1
    default_infer = _unary_infer(name) if unary else _binary_infer(name)
    default_samples = unary_samples() if unary else binary_samples()
    op = register(name, infer or default_infer, grad=grad, reference=ref,
                  samples=samples or default_samples, amp=amp, amp_note=amp_note,
                  scalar=scalar, scalar_attrs=scalar_attrs,
                  scalar_defaults=dict(defaults or {}), doc=doc)
    return op


def _derivative_grad(derivative: str):
    """The gradient rule ``dx = dy * <derivative>(x)`` with the node's attributes: OneFlow's
    ``<op>_grad(x, dy)`` as two ops, which fusion makes one kernel (an elementwise op with
    scalar attributes has one tensor operand)."""
    def grad(n, gs, emit):
        return [emit("broadcast_mul", gs[0], emit(derivative, n.inputs[0], **n.attrs))]
    return grad


# ------------------------------------------------------------------------------ unary
def _relu_ref(x):
    return np.where(np.isnan(x) | (x > 0), x, 0.0)


def _sigmoid_ref(x):
    return 1.0 / (1.0 + np.exp(-x))


elementwise("negative", neg, np.negative, amp=None, amp_note="not in OneFlow's lists",
            infer=_unary_infer("negative", float_or_int64),
            samples=_any_dtype_samples([-2 ** 63, 2 ** 63 - 1]),
            grad=lambda n, gs, emit: [emit("negative", gs[0])],
            doc="out = -x (floating or int64: -(-2**63) wraps to -2**63, as PyTorch's)")
elementwise("identity", identity, np.copy, amp="clear",
            infer=_unary_infer("identity", float_or_int64), samples=_any_dtype_samples(),
            grad=lambda n, gs, emit: [emit("identity", gs[0])],
            doc="out = x (a copy; floating or int64)")
elementwise("exp", exp, np.exp, amp=None,
            amp_note="not in OneFlow's lists (PyTorch's autocast also runs exp in float32)",
            grad=lambda n, gs, emit: [emit("broadcast_mul", gs[0], n.outputs[0])],
            doc="out = exp(x); dx = dy * out")
elementwise("log", log, np.log, amp=None,
            amp_note="not in OneFlow's lists (PyTorch's autocast also runs log in float32)",
            grad=lambda n, gs, emit: [emit("broadcast_div", gs[0], n.inputs[0])],
            samples=unary_samples(0.1, 3.0), doc="out = log(x); dx = dy / x")
elementwise("sin", sin, np.sin, amp=None,
            amp_note="not in OneFlow's lists (PyTorch's autocast runs it in the input's dtype)",
            grad=lambda n, gs, emit: [emit("broadcast_mul", gs[0], emit("cos", n.inputs[0]))],
            doc="out = sin(x); dx = dy * cos(x)")
def _zero_grad(dy, emit):
    """A zero gradient of ``dy``'s shape and dtype (``floor``, ``round``: 0 even where ``dy`` is
    inf or NaN, as PyTorch's ``zeros_like``)."""
    return emit("scalar_mul", emit("ones_like", dy), scalar=0.0)


def _round_samples():
    """:func:`unary_samples` and the halves, where rounding to even shows."""
    halves = [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, -0.3, 0.49999997, 1000.5, np.inf, -np.inf]
    return lambda: unary_samples(-4.0, 4.0)() + float_samples(
        lambda dt: [([np.array(halves, dt)], {})])


elementwise("log1p", log1p, np.log1p, amp=None,
            amp_note="not in OneFlow's lists (PyTorch's autocast runs it in float32)",
            grad=lambda n, gs, emit: [emit("broadcast_div", gs[0],
                                           emit("scalar_add", n.inputs[0], scalar=1.0))],
            samples=unary_samples(-0.9, 3.0), doc="out = log(1 + x); dx = dy / (1 + x)")
elementwise("floor", floor, np.floor, amp=None,
            amp_note="not in OneFlow's lists (exact in any floating dtype)",
            grad=lambda n, gs, emit: [_zero_grad(gs[0], emit)],
            samples=unary_samples(-4.0, 4.0), doc="out = floor(x); dx = 0")
elementwise("round", round_half_even, np.round, amp=None,
            amp_note="not in OneFlow's lists (exact in any floating dtype)",
            grad=lambda n, gs, emit: [_zero_grad(gs[0], emit)],
            samples=_round_samples(), doc="out = x rounded half to even; dx = 0")
elementwise("cos", cos, np.cos, amp=None,
            amp_note="not in OneFlow's lists (PyTorch's autocast runs it in the input's dtype)",
            grad=lambda n, gs, emit: [emit("broadcast_mul", gs[0],
                                           emit("negative", emit("sin", n.inputs[0])))],
            doc="out = cos(x); dx = -dy * sin(x)")


def _rsqrt_grad(n, gs, emit):
    """dx = -0.5 * dy * y^3 with y = rsqrt(x)."""
    y = n.outputs[0]
    cube = emit("broadcast_mul", emit("broadcast_mul", y, y), y)
    return [emit("scalar_mul", emit("broadcast_mul", gs[0], cube), scalar=-0.5)]


elementwise("rsqrt", rsqrt, lambda x: 1.0 / np.sqrt(x), amp=None,
            amp_note="not in OneFlow's lists (batch norm's eval-mode gradient uses it on the "
                     "float32 moving variance)",
            grad=_rsqrt_grad, samples=unary_samples(0.1, 3.0), doc="out = 1 / sqrt(x)")
elementwise("sqrt", sqrt, np.sqrt, amp="gray",
            grad=lambda n, gs, emit: [emit("broadcast_div", gs[0],
                                           emit("scalar_mul", n.outputs[0], scalar=2.0))],
            samples=unary_samples(0.1, 3.0), doc="out = sqrt(x); dx = dy / (2 out)")
elementwise("abs", absolute, np.abs, amp=None,
            amp_note="not in OneFlow's lists (there it runs in float32)",
            grad=lambda n, gs, emit: [emit("abs_grad", n.inputs[0], gs[0])],
            doc="out = |x|; dx = abs_grad(x, dy)")
elementwise("abs_grad", absolute_grad,
            lambda x, dy: np.where(x > 0, dy, np.where(x < 0, -dy, 0.0)), amp=None,
            amp_note="not in OneFlow's lists (there it runs in float32)",
            infer=y_dy_infer("abs_grad", first="x"), samples=grad_samples(-2.0, 2.0),
            doc="dx = dy * sign(x), 0 at x = 0 and at NaN (PyTorch's)")


def _power_ref(x, p):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(x) if p == 0.5 else 1.0 / np.sqrt(x) if p == -0.5 else np.power(x, p)


def _power_derivative_ref(x, p):
    return np.zeros_like(x) if p == 0.0 else p * _power_ref(x, p - 1.0)


def _power_samples():
    """Exponents with PyTorch's special cases (0, 0.5, -0.5, 2) and others, over x in [0.1, 3)
    (non-integer powers of negative x are nan) and, for integer exponents, [-2, 2)."""
    cases = [unary_samples(0.1, 3.0, scalar=p) for p in (2.5, 0.5, -0.5, -1.0, 0.0)]
    cases += [unary_samples(-2.0, 2.0, scalar=p) for p in (2.0, 3.0)]
    return lambda: [s for make in cases for s in make()]


elementwise("scalar_pow", power, _power_ref, amp="gray", scalar_attrs=("scalar",),
            grad=_derivative_grad("scalar_pow_derivative"), samples=_power_samples(),
            doc="out = x ** scalar (PyTorch's pow with a number exponent); "
                "dx = dy * scalar_pow_derivative(x)")
elementwise("scalar_pow_derivative", power_derivative, _power_derivative_ref, amp="gray",
            amp_note="OneFlow's scalar_pow_grad is in no list (float32 there); gray here, as "
                     "scalar_pow: its kernel computes in float32 and rounds once",
            scalar_attrs=("scalar",), samples=_power_samples(),
            doc="out = scalar * x ** (scalar - 1), 0 for scalar 0: scalar_pow's derivative")
elementwise("relu", relu, _relu_ref, amp="clear",
            grad=lambda n, gs, emit: [emit("relu_grad", n.outputs[0], gs[0])],
            doc="out = max(x, 0) (NaN propagates); dx = relu_grad(out, dy)")
elementwise("tanh", tanh, np.tanh, amp="gray",
            grad=lambda n, gs, emit: [emit("tanh_grad", n.outputs[0], gs[0])],
            doc="out = tanh(x); dx = tanh_grad(out, dy)")
elementwise("sigmoid", sigmoid, _sigmoid_ref, amp=None,
            amp_note="not in OneFlow's lists after PR 9126 (only sigmoid_grad is gray); kept "
                     "unlisted to match, so it runs in float32",
            grad=lambda n, gs, emit: [emit("sigmoid_grad", n.outputs[0], gs[0])],
            doc="out = 1 / (1 + exp(-x)); dx = sigmoid_grad(out, dy)")

elementwise("scalar_add", add, np.add, amp="gray", scalar_attrs=("scalar",),
            grad=lambda n, gs, emit: [gs[0]], samples=unary_samples(scalar=0.5),
            doc="out = x + scalar; dx = dy")
elementwise("scalar_mul", mul, np.multiply, amp="gray", scalar_attrs=("scalar",),
            grad=lambda n, gs, emit: [emit("scalar_mul", gs[0], scalar=n.attrs["scalar"])],
            samples=unary_samples(scalar=2.0), doc="out = x * scalar; dx = dy * scalar")
elementwise("scalar_div", div, np.divide, amp="gray", scalar_attrs=("scalar",),
            grad=lambda n, gs, emit: [emit("scalar_div", gs[0], scalar=n.attrs["scalar"])],
            samples=unary_samples(scalar=3.0),
            doc="out = x / scalar (one IEEE division, as PyTorch's ``x / 3.0``: not x times the "
                "rounded 1 / scalar, which is 1 ulp off for some x); dx = dy / scalar")


# ------------------------------------------------------------------------------ binary
def _add_grad(n, gs, emit):
    a, b = n.inputs
    return [unbroadcast(emit, gs[0], a.shape), unbroadcast(emit, gs[0], b.shape)]


def _sub_grad(n, gs, emit):
    a, b = n.inputs
    return [unbroadcast(emit, gs[0], a.shape),
            unbroadcast(emit, emit("negative", gs[0]), b.shape)]


def _mul_grad(n, gs, emit):
    a, b = n.inputs
    return [unbroadcast(emit, emit("broadcast_mul", gs[0], b), a.shape),
            unbroadcast(emit, emit("broadcast_mul", gs[0], a), b.shape)]


def _div_grad(n, gs, emit):
    # out = a / b;  da = dy / b;  db = -dy * out / b
    a, b = n.inputs
    da = emit("broadcast_div", gs[0], b)
    db = emit("negative", emit("broadcast_div", emit("broadcast_mul", gs[0], n.outputs[0]), b))
    return [unbroadcast(emit, da, a.shape), unbroadcast(emit, db, b.shape)]


for _name, _fn, _ref, _grad in (("broadcast_add", add, np.add, _add_grad),
                                ("broadcast_sub", sub, np.subtract, _sub_grad),
                                ("broadcast_mul", mul, np.multiply, _mul_grad),
                                ("broadcast_div", div, np.divide, _div_grad)):
    elementwise(_name, _fn, _ref, amp="gray", grad=_grad,
                samples=binary_samples(positive_rhs=_fn is div),
                doc=f"out = x {_fn.__name__} y with NumPy broadcasting")


def _broadcast_power_ref(x, y):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(y == 0.5, np.sqrt(x), np.where(y == -0.5, 1.0 / np.sqrt(x),
                                                      np.power(x, y)))


def _power_derivative_pair_ref(x, y):
    return np.where(y == 0.0, 0.0, y * _broadcast_power_ref(x, y - 1.0))


def _power_exponent_derivative_ref(x, y):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((x == 0.0) & (y >= 0.0), 0.0, _broadcast_power_ref(x, y) * np.log(x))


def _pow_grad(n, gs, emit):
    """dx = dy * broadcast_pow_x_derivative(x, y), dy' = dy * broadcast_pow_y_derivative(x, y),
    each summed over its broadcast dims (OneFlow's ``broadcast_pow_x_grad`` / ``_y_grad``
    without the factor dy)."""
    a, b = n.inputs
    return [unbroadcast(emit, emit("broadcast_mul", gs[0],
                                   emit("broadcast_pow_x_derivative", a, b)), a.shape),
            unbroadcast(emit, emit("broadcast_mul", gs[0],
                                   emit("broadcast_pow_y_derivative", a, b)), b.shape)]


def _pow_samples():
    """x in [0.1, 3) against exponents in [-2, 2) (non-integer powers of a negative x are nan),
    broadcast both ways, with 0 ** y and y = 0.5 (sqrt)."""
    def make(dt):
        r = np.random.default_rng(11)
        return [([rand(3, 4, dtype=dt, r=r, lo=0.1, hi=3.0), rand(3, 4, dtype=dt, r=r)], {}),
                ([rand(4, dtype=dt, r=r, lo=0.1, hi=3.0), rand(2, 1, dtype=dt, r=r)], {}),
                ([np.array([0.0, 0.0, 4.0, 2.0], dt), np.array([2.0, 0.0, 0.5, -1.0], dt)], {})]
    return lambda: float_samples(make)


_POW_AMP_NOTE = "not in OneFlow's lists: it runs in float32"
elementwise("broadcast_pow", power, _broadcast_power_ref, amp=None, amp_note=_POW_AMP_NOTE,
            grad=_pow_grad, samples=_pow_samples(),
            doc="out = x ** y with NumPy broadcasting (PyTorch's pow of two tensors)")
elementwise("broadcast_pow_x_derivative", power_derivative, _power_derivative_pair_ref,
            amp=None, amp_note=_POW_AMP_NOTE, samples=_pow_samples(),
            doc="out = d x**y / dx = y * x ** (y - 1), 0 where y = 0")
elementwise("broadcast_pow_y_derivative", power_exponent_derivative,
            _power_exponent_derivative_ref, amp=None, amp_note=_POW_AMP_NOTE,
            samples=_pow_samples(),
            doc="out = d x**y / dy = x ** y * log(x), 0 where x = 0 and y >= 0")


# ------------------------------------------------------------------------------ maximum, minimum
def maximum(a, b):
    """The larger of ``a`` and ``b``, NaN where either is NaN (PyTorch's ``torch.maximum``,
    https://pytorch.org/docs/stable/generated/torch.maximum.html; OneFlow's
    ``broadcast_maximum``)."""
    if a != a or a > b:
        return a
    return b


def minimum(a, b):
    """The smaller of ``a`` and ``b``, NaN where either is NaN (``torch.minimum``)."""
    if a != a or a < b:
        return a
    return b


def maximum_derivative(a, b):
    """d maximum(a, b) / da as PyTorch's autograd takes it: 0 where ``a < b``, 0.5 where
    ``a == b`` (a tie's gradient is split between the two), else 1 (NaN on either side included:
    both get the gradient). d maximum(a, b) / db and d minimum(a, b) / da are
    ``maximum_derivative(b, a)``, d minimum(a, b) / db is ``maximum_derivative(a, b)``."""
    if a < b:
        return 0.0
    if a == b:
        return 0.5
    return 1.0


def _maximum_derivative_ref(a, b):
    with np.errstate(invalid="ignore"):
        return np.where(a < b, 0.0, np.where(a == b, 0.5, 1.0))


def _min_max_grad(first: int):
    """The gradient of ``broadcast_maximum`` (``first`` 0) or ``broadcast_minimum`` (1): each
    input gets ``dy * broadcast_maximum_derivative`` of the inputs in the order that makes it
    the larger one for maximum (the smaller one for minimum), summed over its broadcast dims."""
    def grad(n, gs, emit):
        a, b = n.inputs
        share = [emit("broadcast_maximum_derivative", *((a, b) if k == first else (b, a)))
                 for k in (0, 1)]
        return [unbroadcast(emit, emit("broadcast_mul", gs[0], share[0]), a.shape),
                unbroadcast(emit, emit("broadcast_mul", gs[0], share[1]), b.shape)]
    return grad


_MIN_MAX_AMP_NOTE = "not in OneFlow's lists: it runs in float32"
elementwise("broadcast_maximum", maximum, np.maximum, amp=None, amp_note=_MIN_MAX_AMP_NOTE,
            grad=_min_max_grad(0),
            doc="out = maximum(x, y) with NumPy broadcasting (NaN propagates, torch.maximum); "
                "a tie's gradient is split in halves")
elementwise("broadcast_minimum", minimum, np.minimum, amp=None, amp_note=_MIN_MAX_AMP_NOTE,
            grad=_min_max_grad(1),
            doc="out = minimum(x, y) with NumPy broadcasting (NaN propagates, torch.minimum); "
                "a tie's gradient is split in halves")
elementwise("broadcast_maximum_derivative", maximum_derivative, _maximum_derivative_ref,
            amp=None, amp_note=_MIN_MAX_AMP_NOTE,
            doc="out = d maximum(x, y) / dx: 0 where x < y, 0.5 where x == y, else 1")


# ------------------------------------------------------------------------------ activation grads
elementwise("relu_grad", relu_grad, lambda y, dy: np.where(y <= 0, 0.0, dy), amp="clear",
            infer=y_dy_infer("relu_grad"), samples=grad_samples(-1.0, 1.0),
            doc="dx = dy where y > 0 else 0")
elementwise("tanh_grad", tanh_grad, lambda y, dy: dy * (1.0 - y * y), amp="gray",
            infer=y_dy_infer("tanh_grad"), samples=grad_samples(-1.0, 1.0),
            doc="dx = dy * (1 - y^2)")
elementwise("sigmoid_grad", sigmoid_grad, lambda y, dy: dy * (1.0 - y) * y, amp="gray",
            infer=y_dy_infer("sigmoid_grad"), samples=grad_samples(0.0, 1.0),
            doc="dx = dy * y * (1 - y)")


# ------------------------------------------------------------------------------ gelu
_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _normal_cdf(x):
    """Phi(x) = erfc(-x / sqrt(2)) / 2 in float64 (the erfc form: no cancellation for x << 0)."""
    return 0.5 * _erfc(-x * _SQRT_HALF)


elementwise("gelu", gelu, lambda x: x * _normal_cdf(x), amp="gray",
            grad=lambda n, gs, emit: [emit("gelu_grad", n.inputs[0], gs[0])],
            doc="out = x Phi(x) (erf form); dx = gelu_grad(x, dy)")
elementwise("gelu_grad", gelu_grad,
            lambda x, dy: dy * (_normal_cdf(x) + x * _INV_SQRT_2PI * np.exp(-0.5 * x * x)),
            amp="gray", infer=y_dy_infer("gelu_grad", first="x"), samples=grad_samples(-3.0, 3.0),
            doc="dx = dy * (Phi(x) + x phi(x))")


# ------------------------------------------------------------------------------ silu
elementwise("silu", silu, lambda x: x * _sigmoid_ref(x), amp="gray",
            grad=lambda n, gs, emit: [emit("silu_grad", n.inputs[0], gs[0])],
            doc="out = x * sigmoid(x); dx = silu_grad(x, dy)")
elementwise("silu_grad", silu_grad,
            lambda x, dy: dy * _sigmoid_ref(x) * (1.0 + x * (1.0 - _sigmoid_ref(x))),
            amp="gray", infer=y_dy_infer("silu_grad", first="x"), samples=grad_samples(-3.0, 3.0),
            doc="dx = dy * s * (1 + x (1 - s)), s = sigmoid(x)")


# ------------------------------------------------------------------------------ softplus
SOFTPLUS_DEFAULTS = {"beta": 1.0, "threshold": 20.0}
"""PyTorch's (and OneFlow's) defaults of softplus's attributes."""
_UNLISTED_AMP_NOTE = ("not in OneFlow's lists (there it runs in float32); gray here, like gelu "
                      "and silu: its kernel computes in float32 and rounds once")
"""The AMP note of the pointwise activations OneFlow's lists leave out (softplus, leaky_relu,
elu and their derivatives)."""


def _softplus_ref(x, beta, threshold):
    z = x * beta
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        return np.where(z > threshold, x, np.logaddexp(0.0, z) / beta)


def _softplus_derivative_ref(x, beta, threshold):
    z = x * beta
    with np.errstate(over="ignore"):
        return np.where(z > threshold, 1.0, np.exp(-np.logaddexp(0.0, -z)))


def _softplus_samples(lo: float, hi: float):
    """Both sides of the threshold: beta 2, threshold 5 (the jump at x = 2.5) over [lo, hi), and
    the defaults over [-30, 30) (attributes omitted: the defaults are filled)."""
    given = unary_samples(lo, hi, attrs={"beta": 2.0, "threshold": 5.0})
    default = unary_samples(-30.0, 30.0)
    return lambda: given() + default()


elementwise("softplus", softplus, _softplus_ref, amp="gray", amp_note=_UNLISTED_AMP_NOTE,
            scalar_attrs=("beta", "threshold"), defaults=SOFTPLUS_DEFAULTS,
            grad=_derivative_grad("softplus_derivative"), samples=_softplus_samples(-6.0, 6.0),
            doc="out = x where beta*x > threshold, else log(1 + exp(beta*x)) / beta (PyTorch's "
                "softplus); dx = dy * softplus_derivative(x)")
elementwise("softplus_derivative", softplus_derivative, _softplus_derivative_ref, amp="gray",
            amp_note=_UNLISTED_AMP_NOTE, scalar_attrs=("beta", "threshold"),
            defaults=SOFTPLUS_DEFAULTS, samples=_softplus_samples(-6.0, 6.0),
            doc="out = 1 where beta*x > threshold, else sigmoid(beta*x): softplus's derivative")


# ------------------------------------------------------------------------------ leaky_relu, elu
def leaky_relu(x, alpha):
    """PyTorch's ``leaky_relu(x, negative_slope)``: ``x`` where ``x > 0``, else ``alpha * x``
    (NaN propagates; -0.0 stays -0.0 for a positive slope). Source:
    https://pytorch.org/docs/stable/generated/torch.nn.LeakyReLU.html; OneFlow's op
    ``leaky_relu`` (attribute ``alpha``, ``UnaryOp::kLeakyRelu``)."""
    return x if x > 0.0 else x * alpha


def leaky_relu_derivative(x, alpha):
    """d leaky_relu(x, alpha) / dx: 1 where ``x > 0``, else ``alpha`` (also at NaN and at 0, as
    PyTorch's ``leaky_relu_backward``; OneFlow's ``leaky_relu_grad(x, dy)`` without the factor
    dy)."""
    return 1.0 if x > 0.0 else alpha


def elu(x, alpha):
    """PyTorch's ``elu(x, alpha)``: ``x`` where ``x > 0``, else ``alpha * (exp(x) - 1)``, the
    latter as ``alpha * expm1(x)`` (exact near 0); NaN and both zeros pass through unchanged, as
    PyTorch's kernel gives them. Source:
    https://pytorch.org/docs/stable/generated/torch.nn.ELU.html; OneFlow's op ``elu`` (attribute
    ``alpha``, ``UnaryOp::kElu``)."""
    if not x < 0.0:
        return x
    return alpha * math.expm1(x)


def elu_derivative(x, alpha):
    """d elu(x, alpha) / dx: 1 where ``x > 0``, else ``alpha * exp(x)`` (at 0 too), as PyTorch's
    ``elu_backward``; NaN propagates, as in OneFlow's ``elu_grad(x, dy)`` (this without the factor
    dy) and PyTorch's vectorized kernel (its scalar loop, for small tensors, gives 1)."""
    return 1.0 if x > 0.0 else alpha * math.exp(x)


LEAKY_RELU_DEFAULTS = {"alpha": 0.01}
"""PyTorch's (and OneFlow's ``nn.LeakyReLU``) default slope, ``negative_slope=0.01``."""
ELU_DEFAULTS = {"alpha": 1.0}
"""PyTorch's (and OneFlow's ``nn.ELU``) default ``alpha=1.0``."""


def _leaky_relu_ref(x, alpha):
    with np.errstate(invalid="ignore"):
        return np.where(x > 0, x, x * alpha)


def _leaky_relu_derivative_ref(x, alpha):
    return np.where(x > 0, 1.0, alpha)


def _elu_ref(x, alpha):
    with np.errstate(over="ignore", invalid="ignore"):
        return np.where(x < 0, alpha * np.expm1(np.minimum(x, 0.0)), x)


def _elu_derivative_ref(x, alpha):
    with np.errstate(over="ignore", invalid="ignore"):
        return np.where(x > 0, 1.0, alpha * np.exp(np.minimum(x, 0.0)))


def _alpha_samples(given: float, lo: float = -6.0, hi: float = 6.0):
    """Samples at ``alpha=given`` over [lo, hi), at alpha 0 and -0.5 (edge slopes), and at the
    default (attribute omitted) over [-30, 30)."""
    cases = [unary_samples(lo, hi, attrs={"alpha": a}) for a in (given, 0.0, -0.5)]
    default = unary_samples(-30.0, 30.0)
    return lambda: [s for make in cases + [default] for s in make()]


elementwise("leaky_relu", leaky_relu, _leaky_relu_ref, amp="gray", amp_note=_UNLISTED_AMP_NOTE,
            scalar_attrs=("alpha",), defaults=LEAKY_RELU_DEFAULTS,
            grad=_derivative_grad("leaky_relu_derivative"), samples=_alpha_samples(0.2),
            doc="out = x where x > 0, else alpha*x (PyTorch's leaky_relu, negative_slope=alpha); "
                "dx = dy * leaky_relu_derivative(x)")
elementwise("leaky_relu_derivative", leaky_relu_derivative, _leaky_relu_derivative_ref,
            amp="gray", amp_note=_UNLISTED_AMP_NOTE, scalar_attrs=("alpha",),
            defaults=LEAKY_RELU_DEFAULTS, samples=_alpha_samples(0.2),
            doc="out = 1 where x > 0, else alpha: leaky_relu's derivative")
elementwise("elu", elu, _elu_ref, amp="gray", amp_note=_UNLISTED_AMP_NOTE,
            scalar_attrs=("alpha",), defaults=ELU_DEFAULTS, grad=_derivative_grad("elu_derivative"),
            samples=_alpha_samples(2.0),
            doc="out = x where x > 0, else alpha*(exp(x) - 1) (PyTorch's elu); "
                "dx = dy * elu_derivative(x)")
elementwise("elu_derivative", elu_derivative, _elu_derivative_ref, amp="gray",
            amp_note=_UNLISTED_AMP_NOTE, scalar_attrs=("alpha",), defaults=ELU_DEFAULTS,
            samples=_alpha_samples(2.0),
            doc="out = 1 where x > 0, else alpha*exp(x): elu's derivative")


# ------------------------------------------------------------------------------ clip_by_scalar
def clip(x, lo, hi):
    """PyTorch's ``clamp(x, min=lo, max=hi)``: ``min(max(x, lo), hi)``, so ``hi`` where ``lo >
    hi``; NaN propagates, from ``x`` or from a bound (``clamp(x, min=nan)`` is NaN, as
    PyTorch's). Source: https://pytorch.org/docs/stable/generated/torch.clamp.html; OneFlow's
    op ``clip_by_scalar`` (attributes ``floating_min``, ``floating_max``)."""
    if x != x:
        return x
    y = x if x > lo else lo                 # NaN where lo is
    return y if y < hi or y != y else hi    # hi where hi is NaN


def clip_derivative(x, lo, hi):
    """d clip(x, lo, hi) / dx: 1 where ``lo <= x <= hi``, else 0 (NaN included), as PyTorch's
    ``clamp_backward`` and OneFlow's ``clip_by_scalar_grad(dy, x)`` without the factor dy."""
    return 1.0 if lo <= x <= hi else 0.0


CLIP_DEFAULTS = {"floating_min": -math.inf, "floating_max": math.inf}
"""No bound on a side: ``clamp(x, min=lo)`` leaves ``floating_max`` at inf."""


def _clip_ref(x, lo, hi):
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(x), x, np.minimum(np.maximum(x, lo), hi))


def _clip_derivative_ref(x, lo, hi):
    with np.errstate(invalid="ignore"):
        return np.where((x >= lo) & (x <= hi), 1.0, 0.0)


def _clip_samples():
    """Both bounds, one of them (the default the other), ``lo > hi`` (every result hi) and a
    NaN bound (every result NaN)."""
    cases = [unary_samples(attrs=a) for a in (
        {"floating_min": -0.5, "floating_max": 1.0}, {"floating_min": 0.25},
        {"floating_max": -1.0}, {"floating_min": 1.0, "floating_max": -1.0},
        {"floating_min": math.nan, "floating_max": 1.0}, {"floating_max": math.nan})]
    return lambda: [s for make in cases for s in make()]


elementwise("clip_by_scalar", clip, _clip_ref, amp="gray", amp_note=_UNLISTED_AMP_NOTE,
            scalar_attrs=("floating_min", "floating_max"), defaults=CLIP_DEFAULTS,
            grad=_derivative_grad("clip_by_scalar_derivative"), samples=_clip_samples(),
            doc="out = min(max(x, floating_min), floating_max) (PyTorch's clamp); "
                "dx = dy * clip_by_scalar_derivative(x)")
elementwise("clip_by_scalar_derivative", clip_derivative, _clip_derivative_ref, amp="gray",
            amp_note=_UNLISTED_AMP_NOTE, scalar_attrs=("floating_min", "floating_max"),
            defaults=CLIP_DEFAULTS, samples=_clip_samples(),
            doc="out = 1 where floating_min <= x <= floating_max, else 0: clip's derivative")


# ------------------------------------------------------------------------------ bias_add
def _bias_add_norm(inputs, attrs):
    ndim = len(inputs[0].shape) if inputs else 0
    axis = int(attrs.get("axis", 1 if ndim > 1 else 0))
    attrs["axis"] = axis % max(ndim, 1)
    return attrs


def _bias_add_infer(inputs, attrs):
    check_arity("bias_add", inputs, 2)
    a, b = inputs
    dt = check_float("bias_add", a, b)
    axis = attrs["axis"]
    if len(b.shape) != 1 or axis >= len(a.shape) or a.shape[axis] != b.shape[0]:
        raise ValueError(f"bias_add: bias {fmt(b)} must be 1-D with length a.shape[{axis}] "
                         f"of {fmt(a)}")
    return [(a.shape, dt)]


def _bias_add_grad(n, gs, emit):
    """da = dy; db = dy summed over every axis but ``axis``: ``conv_bias_grad`` for a channel bias
    of an NCHW input (a convolution's bias, a white op under AMP), else ``reduce_sum``."""
    a = n.inputs[0]
    if len(a.shape) == 4 and n.attrs["axis"] == 1:
        return [gs[0], emit("conv_bias_grad", gs[0])]
    axes = tuple(i for i in range(len(a.shape)) if i != n.attrs["axis"])
    return [gs[0], emit("reduce_sum", gs[0], axis=axes, keepdims=False)]


def _bias_add_ref(arrays, attrs):
    a, b = arrays
    shape = [1] * a.ndim
    shape[attrs["axis"]] = b.shape[0]
    return [a + b.reshape(shape)]


def _bias_samples():
    def make(dt):
        return [([rand(5, 3, dtype=dt), rand(3, dtype=dt)], {"axis": 1}),
                ([rand(2, 3, 4, dtype=dt), rand(3, dtype=dt)], {"axis": 1})]
    return float_samples(make)


register("bias_add", _bias_add_infer, normalize=_bias_add_norm, grad=_bias_add_grad,
         reference=_bias_add_ref, samples=_bias_samples, amp="gray",
         doc="out = a + b broadcast along `axis` (b is 1-D); da = dy, db = reduce_sum(dy) "
             "(conv_bias_grad(dy) for a channel bias of NCHW). Not "
             "NumPy broadcasting, so no scalar function: its kernels and fusion have their own "
             "rule (fused along the last axis only)")
