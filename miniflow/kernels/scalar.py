"""Scalar math shared by every backend: plain Python functions of floats, ``math`` only.

Each function is compiled twice, never decorated here: by the CPU backend (registered with
``numba.extending.register_jitable`` and called inside ``njit`` loops) and by the
CUDA backend (``numba.cuda.jit(device=True)``). Adding an elementwise op is one function here plus
one op definition (minitorch's pattern, ``minitorch/operators.py``).

Typing note: Numba types float literals as float64, so ``1.0 - y`` on a float32 ``y`` is computed in
float64. Kernels round every result to the compute type (float32 for f16/f32 tensors) before storing.

NaN propagates through every function (``relu(nan) = nan``, as in PyTorch).
"""
import math

__all__ = ["add", "sub", "mul", "div", "neg", "identity", "exp", "log", "relu", "tanh", "sigmoid",
           "relu_grad", "tanh_grad", "sigmoid_grad", "reciprocal"]


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


def reciprocal(x):
    """1 / x (IEEE: 1/0 = inf)"""
    return 1.0 / x
