"""Exercise 1 checker: the gradient rule of ``exercise1_cube`` (``y = x**3``).

The learner's ``cube_grad(node, grads, emit)`` is registered as the rule of a throwaway op
``exercise1_cube`` (unregistered after the check), the autograd pass differentiates
``loss = sum(cube(x) * w)`` with it, and the IR's gradient, computed by the reference interpreter
``miniflow.ir.evaluate`` in float64, is compared with the derivative ``3 x**2 * w`` (the oracle)
and with central finite differences of the forward loss. Source: minitorch's module 1 tasks
(derivatives checked against central differences).
"""
from __future__ import annotations

import numpy as np

from .. import ops
from ..dtype import float64
from ..ir import Graph, Value, evaluate
from ..ops import emitter
from ..ops.elementwise import elementwise
from ..passes.autograd import autograd
from ..passes.pipeline import CompileContext, CompileSettings
from . import NotYet, learner_call

TITLE = "the gradient rule of an op (y = x**3)"
STUB = "ex1_gradient_rule.py"
FUNCTION = "cube_grad"
OP = "exercise1_cube"


def exercise1_cube(x):
    """The throwaway op's scalar function: ``x**3``."""
    return x * x * x


def _graph(rule, x_data: np.ndarray, w_data: np.ndarray) -> Graph:
    """Register ``exercise1_cube`` with ``rule`` (the caller unregisters it) and return
    ``loss = reduce_sum(exercise1_cube(x) * w)`` differentiated; results: loss and dL/dx."""
    def checked_rule(node, grads, emit):
        out = learner_call(f"{FUNCTION}(node, grads, emit)", rule, node, grads, emit)
        if not isinstance(out, (list, tuple)) or len(out) != 1:
            raise NotYet(f"{FUNCTION} must return a list with one entry per input of the op (one "
                         f"here: [dx]); it returned {out!r}")
        if not isinstance(out[0], Value):
            raise NotYet(f"{FUNCTION} must return [dx] with dx a Value made by emit(...) (e.g. "
                         f"emit('broadcast_mul', a, b)); it returned [{out[0]!r}]")
        if out[0].shape != node.inputs[0].shape or out[0].dtype != node.inputs[0].dtype:
            raise NotYet(f"dx must have x's shape and dtype {node.inputs[0].type_str}; yours is "
                         f"{out[0].type_str}")
        return out

    elementwise(OP, exercise1_cube, lambda a: a ** 3, amp="gray", grad=checked_rule,
                doc="exercise 1's throwaway op: out = x**3, with the learner's gradient rule")
    g = Graph()
    emit = emitter(g)
    x = g.add_variable("x", x_data.shape, float64, data=x_data)
    w = g.add_constant(w_data)
    loss = emit("reduce_sum", emit("broadcast_mul", emit(OP, x), w), axis=None)
    g.results["loss"] = loss
    try:
        g = autograd(g, CompileContext(CompileSettings(trainable=["x"])))
    except (NotYet, NotImplementedError):
        raise
    except Exception as e:
        raise NotYet(f"the autograd pass failed with your rule: {type(e).__name__}: {e}") from e
    g.set_outputs([loss, g.grads["x"]])
    try:
        g.verify()
    except Exception as e:
        raise NotYet(f"the IR your rule emitted does not verify: {e}") from e
    return g


def check(module) -> list:
    """Raise :class:`NotYet` on the first wrong thing; return the passed checks."""
    rng = np.random.default_rng(1)
    x = np.concatenate([[0.0, 1.0, -2.0, 0.5], rng.uniform(-3, 3, 8)]).reshape(3, 4)
    w = rng.uniform(0.5, 1.5, (3, 4))
    try:
        g = _graph(module.cube_grad, x, w)
        got = evaluate(g, [])["output1"]
    finally:
        if OP in ops.all_ops():
            ops.unregister(OP)
    want = 3.0 * x ** 2 * w
    passed = [f"{FUNCTION} returns [dx] of x's shape and dtype, and the IR verifies"]
    if not np.allclose(got, want, rtol=1e-12, atol=1e-12):
        i = np.unravel_index(np.argmax(np.abs(got - want)), x.shape)
        hint = ""
        if np.allclose(got, 3.0 * x ** 2):
            hint = (" It equals 3 x**2 without the incoming gradient: the chain rule multiplies "
                    "the op's derivative by dy = grads[0].")
        elif np.allclose(got, 3.0 * x * w) or np.allclose(got, 2.0 * x * w):
            hint = " It is linear in x: the derivative of x**3 is 3 x**2."
        elif np.allclose(got, x ** 2 * w):
            hint = " It is off by the factor 3: d(x**3)/dx = 3 x**2."
        raise NotYet(f"wrong gradient: at x = {x[i]:g} with incoming gradient dy = {w[i]:.4f}, "
                      f"your rule gives dx = {got[i]:.6g}, but dy * 3 x**2 = {want[i]:.6g}.{hint}")
    passed.append("dx = dy * 3 x**2 on 12 values (0, 1, -2, 0.5 and random ones), float64")
    eps = 1e-6
    fd = ((x + eps) ** 3 - (x - eps) ** 3) / (2 * eps) * w
    worst = float(np.abs(got - fd).max())
    passed.append(f"agrees with central finite differences (eps=1e-6): max |difference| "
                  f"{worst:.1e}")
    return passed
