"""Elementwise ops: unary math, scalar_* ops, broadcast_* binary ops, bias_add and activation grads.

Each op names its scalar function in ``miniflow.kernels.scalar`` (``elementwise=``); the CPU and CUDA
kernels are built from that one function. Gradient rules follow OneFlow's
(``oneflow/core/autograd/gradient_funcs`` and ``oneflow/user/ops/*_op.cpp``).
"""
from __future__ import annotations

import numpy as np

from .common import (broadcast_shape, check_arity, check_float, float_samples, fmt, rand,
                     unbroadcast, y_dy_infer)
from .registry import register


# ------------------------------------------------------------------------------ unary
def _unary_infer(op):
    def infer(inputs, attrs):
        check_arity(op, inputs, 1)
        dt = check_float(op, inputs[0])
        return [(inputs[0].shape, dt)]
    return infer


def _unary_samples(lo=-2.0, hi=2.0, scalar=None):
    attrs = {} if scalar is None else {"scalar": scalar}

    def make(dt):
        edge = np.array([0.0, -0.0, np.nan, 1e4, -1e4], dt)
        return [([rand(3, 5, dtype=dt, lo=lo, hi=hi)], attrs), ([edge], attrs),
                ([rand(0, 4, dtype=dt)], attrs), ([rand(70, dtype=dt, lo=lo, hi=hi)], attrs)]
    return lambda: float_samples(make)


def _def_unary(name, scalar_fn, grad, lo=-2.0, hi=2.0, doc=""):
    register(name, _unary_infer(name), grad=grad, elementwise=scalar_fn,
             samples=_unary_samples(lo, hi), doc=doc)


_def_unary("negative", "neg", lambda n, gs, emit: [emit("negative", gs[0])],
           doc="out = -x")
_def_unary("identity", "identity", lambda n, gs, emit: [emit("identity", gs[0])],
           doc="out = x (a copy)")
_def_unary("exp", "exp", lambda n, gs, emit: [emit("broadcast_mul", gs[0], n.outputs[0])],
           doc="out = exp(x); dx = dy * out")
_def_unary("log", "log", lambda n, gs, emit: [emit("broadcast_div", gs[0], n.inputs[0])],
           lo=0.1, hi=3.0, doc="out = log(x); dx = dy / x")
_def_unary("relu", "relu", lambda n, gs, emit: [emit("relu_grad", n.outputs[0], gs[0])],
           doc="out = max(x, 0) (NaN propagates); dx = relu_grad(out, dy)")
_def_unary("tanh", "tanh", lambda n, gs, emit: [emit("tanh_grad", n.outputs[0], gs[0])],
           doc="out = tanh(x); dx = tanh_grad(out, dy)")
_def_unary("sigmoid", "sigmoid", lambda n, gs, emit: [emit("sigmoid_grad", n.outputs[0], gs[0])],
           doc="out = 1 / (1 + exp(-x)); dx = sigmoid_grad(out, dy)")


def _scalar_norm(op):
    def normalize(inputs, attrs):
        if "scalar" not in attrs:
            raise ValueError(f"{op}: missing attribute 'scalar'")
        attrs["scalar"] = float(attrs["scalar"])
        return attrs
    return normalize


register("scalar_add", _unary_infer("scalar_add"), normalize=_scalar_norm("scalar_add"),
         grad=lambda n, gs, emit: [gs[0]], elementwise="add",
         samples=_unary_samples(scalar=0.5), doc="out = x + scalar; dx = dy")
register("scalar_mul", _unary_infer("scalar_mul"), normalize=_scalar_norm("scalar_mul"),
         grad=lambda n, gs, emit: [emit("scalar_mul", gs[0], scalar=n.attrs["scalar"])],
         elementwise="mul", samples=_unary_samples(scalar=2.0),
         doc="out = x * scalar; dx = dy * scalar")


# ------------------------------------------------------------------------------ binary
def _binary_infer(op):
    def infer(inputs, attrs):
        check_arity(op, inputs, 2)
        dt = check_float(op, *inputs)
        return [(broadcast_shape(op, inputs[0], inputs[1]), dt)]
    return infer


def _binary_samples(positive_rhs=False):
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


for _name, _fn, _grad, _pos in (("broadcast_add", "add", _add_grad, False),
                                ("broadcast_sub", "sub", _sub_grad, False),
                                ("broadcast_mul", "mul", _mul_grad, False),
                                ("broadcast_div", "div", _div_grad, True)):
    register(_name, _binary_infer(_name), grad=_grad, elementwise=_fn,
             samples=_binary_samples(_pos), doc=f"out = x {_fn} y with NumPy broadcasting")


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
    a = n.inputs[0]
    axes = tuple(i for i in range(len(a.shape)) if i != n.attrs["axis"])
    return [gs[0], emit("reduce_sum", gs[0], axis=axes, keepdims=False)]


def _bias_samples():
    def make(dt):
        return [([rand(5, 3, dtype=dt), rand(3, dtype=dt)], {"axis": 1}),
                ([rand(2, 3, 4, dtype=dt), rand(3, dtype=dt)], {"axis": 1})]
    return float_samples(make)


register("bias_add", _bias_add_infer, normalize=_bias_add_norm, grad=_bias_add_grad,
         samples=_bias_samples, elementwise="add",
         doc="out = a + b broadcast along `axis` (b is 1-D); da = dy, db = reduce_sum(dy)")


# ------------------------------------------------------------------------------ activation grads
def _grad_samples(lo, hi):
    def make(dt):
        r = np.random.default_rng(3)
        return [([rand(4, 6, dtype=dt, lo=lo, hi=hi, r=r), rand(4, 6, dtype=dt, r=r)], {}),
                ([rand(0, 2, dtype=dt, r=r), rand(0, 2, dtype=dt, r=r)], {})]
    return lambda: float_samples(make)


register("relu_grad", y_dy_infer("relu_grad"), elementwise="relu_grad",
         samples=_grad_samples(-1.0, 1.0), doc="dx = dy where y > 0 else 0")
register("tanh_grad", y_dy_infer("tanh_grad"), elementwise="tanh_grad",
         samples=_grad_samples(-1.0, 1.0), doc="dx = dy * (1 - y^2)")
register("sigmoid_grad", y_dy_infer("sigmoid_grad"), elementwise="sigmoid_grad",
         samples=_grad_samples(0.0, 1.0), doc="dx = dy * y * (1 - y)")
