"""Gradient checking: an op's gradient rule, run through the autograd pass and a real plan, against
central finite differences in float64 (minitorch's ``grad_check`` idea).

The check builds an IR graph ``loss = reduce_sum(op(*inputs)[k] * w)`` with a fixed random ``w`` for
every float output ``k``, differentiates it with the autograd pass, and compares each input's
gradient with ``(loss(x + eps) - loss(x - eps)) / (2 eps)`` element by element.
"""
from __future__ import annotations

import numpy as np

from .dtype import as_dtype
from .ir import Graph
from .ops import emitter
from .passes.autograd import autograd
from .passes.pipeline import CompileContext, CompileSettings
from .runtime.backend import get_backend
from .runtime.plan import Plan

__all__ = ["gradient_graph", "check_grad"]


def gradient_graph(op: str, inputs: list, attrs: dict, seed: int = 0):
    """Build and differentiate ``loss = sum_k reduce_sum(op(*inputs)[k] * w_k)``.

    Float inputs become variables (differentiated), int inputs constants.

    Returns:
        (graph, plan, var_arrays) where running the plan returns ``[loss, *grads]`` and
        ``var_arrays`` are the (mutable) backend arrays of the float inputs that got a gradient
        (an op may leave an input undifferentiated, e.g. the labels of sparse_softmax_cross_entropy).
    """
    backend = get_backend()
    g = Graph()
    rng = np.random.default_rng(seed)
    vals, names, arrays = [], [], []
    for i, a in enumerate(inputs):
        a = np.asarray(a, order="C")    # a 0-d input stays 0-d (ascontiguousarray: [1])
        if as_dtype(a.dtype).is_float:
            data = backend.from_numpy(a)
            vals.append(g.add_variable(f"x{i}", a.shape, as_dtype(a.dtype), data=data))
            names.append(f"x{i}")
            arrays.append(data)
        else:
            vals.append(g.add_constant(a))
    emit = emitter(g)
    outs = emit(op, *vals, **attrs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    terms = []
    for o in outs:
        if not o.dtype.is_float:
            continue
        w = g.add_constant(rng.uniform(0.5, 1.5, o.shape).astype(o.dtype.np))
        terms.append(emit("reduce_sum", emit("broadcast_mul", o, w), axis=None))
    wide = max((t.dtype for t in terms), key=lambda d: d.itemsize)   # a half op's float32
    terms = [t if t.dtype is wide else emit("cast", t, dtype=wide) for t in terms]  # statistics
    loss = terms[0] if len(terms) == 1 else emit("add_n", *terms)
    g.results["loss"] = loss
    g = autograd(g, CompileContext(CompileSettings(trainable=names)))
    differentiated = [i for i, n in enumerate(names) if n in g.grads]
    g.set_outputs([loss] + [g.grads[names[i]] for i in differentiated])
    g.verify()
    return g, Plan(g, backend), [arrays[i] for i in differentiated]


def check_grad(op: str, inputs: list, attrs: dict | None = None, eps: float = 1e-6,
               rtol: float = 1e-5, atol: float = 1e-7) -> float:
    """Compare the gradient rule of ``op`` with central differences; inputs must be float64.

    Returns:
        the largest absolute difference seen.

    Raises:
        AssertionError: naming the op, the input, the element and both values on a mismatch.
    """
    backend = get_backend()
    g, plan, arrays = gradient_graph(op, inputs, attrs or {})
    res = plan.run([])
    grads = res[1:]
    worst = 0.0
    for k, (arr, grad) in enumerate(zip(arrays, grads)):
        host = backend.to_numpy(arr)
        num = np.zeros_like(host, dtype=np.float64)
        for idx in np.ndindex(host.shape):
            for sign in (1, -1):
                h = host.copy()
                h[idx] += sign * eps
                backend.copy_in(arr, h)
                num[idx] += sign * float(plan.run([])[0]) / (2 * eps)
            backend.copy_in(arr, host)
        err = np.abs(num - grad)
        worst = max(worst, float(err.max(initial=0.0)))
        bad = err > atol + rtol * np.abs(num)
        if bad.any():
            i = tuple(int(j) for j in np.argwhere(bad)[0])
            raise AssertionError(f"{op}{attrs or ''}: gradient of input {k} (shape {host.shape}) "
                                 f"at {i}: rule gives {grad[i]!r}, finite differences "
                                 f"{num[i]!r} (|diff| {err[i]:.3g})")
    return worst
