"""The reduce family of every backend: ``reduce_sum``, ``softmax``, ``log_softmax`` (+ grads),
``sparse_softmax_cross_entropy`` (+ grad). Planned the same way everywhere (:func:`plan_of`):
``reduce_sum``'s ``[outer, red, inner]`` layout and the gather that makes its reduced dims one
block (``layout.reduce_layout``), the row ops' ``[rows, cols]`` view over the last axis
(``layout.rows_cols``). The backend's step makers (``family.StepMaker``, one per op type) run
the loops; :func:`gathered` makes ``reduce_sum``'s from the backend's sum loop.

A backend fills its record, ``BUILDERS`` of its ``reduce.py``, by op type::

    BUILDERS = reduce.builders(reduce_sum=gathered(transpose_steps, scratch, sum_steps),
                               **with_log(softmax=softmax_steps, ...), ...)
"""
from __future__ import annotations

import functools

from .family import StepMaker, record
from .layout import reduce_layout, rows_cols

__all__ = ["OPS", "plan_of", "gathered", "with_log", "builders"]

OPS = ("reduce_sum", "softmax", "log_softmax", "softmax_grad", "log_softmax_grad",
       "sparse_softmax_cross_entropy", "sparse_softmax_cross_entropy_grad")
"""The library's reduce op types: every backend's record has a step maker for each."""


def plan_of(node, ins: list, outs: list):
    """The plan a reduce step maker gets: for ``reduce_sum`` ``(gather, (outer, red, inner))``
    (``layout.reduce_layout``; None, no step, for an empty output); for the row ops
    ``(rows, cols)`` of x (softmax: x; its gradients: y; cross entropy: the prediction; its
    gradient: prob)."""
    op = node.op.name
    if op == "reduce_sum":
        if outs[0].size == 0:
            return None
        return reduce_layout(ins[0].shape, tuple(node.attrs["axis"]))
    return rows_cols(ins[2 if op == "sparse_softmax_cross_entropy_grad" else 0].shape)


def gathered(transpose_steps, scratch, sum_steps) -> StepMaker:
    """``reduce_sum``'s step maker over a backend's ``transpose_steps(x, shape, perm, out)``
    (``out = x.reshape(shape).transpose(perm)``, flat ``out``), ``scratch(like, shape, dtype)``
    (a buffer in ``like``'s memory) and ``sum_steps(x, out, outer, red, inner)``
    (``out[o, k] = sum_r x[o, r, k]`` in the compute type): ``out = x.sum(axis, keepdims)``;
    when the reduced dims are not one block (axis (0, 2) of a 3-D x), x is first copied, kept
    dims first, into a scratch buffer."""
    def steps(ins, outs, plan, attrs):
        (gather, (outer, red, inner)), x = plan, ins[0]
        pre, src = [], x
        if gather is not None:
            sizes, order = gather
            src = scratch(x, (x.size,), x.dtype)
            pre = transpose_steps(x, sizes, order, src)
        return pre + sum_steps(src, outs[0], outer, red, inner)

    steps.__name__ = f"gathered({getattr(sum_steps, '__name__', 'sum_steps')})"
    return steps


def with_log(**steps) -> dict:
    """The step makers of each ``op`` and its ``log_`` twin from a backend's
    ``steps(log, ins, outs, plan, attrs)`` (``softmax=softmax_steps`` gives ``softmax`` and
    ``log_softmax``): ``log`` bound to False and True."""
    return {("log_" if log else "") + op: functools.partial(make, log)
            for op, make in steps.items() for log in (False, True)}


def builders(**steps: StepMaker) -> dict:
    """Op type -> builder over a backend's step makers ``steps`` (keyword: op type, value: its
    ``family.StepMaker``, with the plan of :func:`plan_of`), the backend's record of the reduce
    family:

    * ``reduce_sum``: see :func:`gathered`;
    * ``softmax`` / ``log_softmax`` (x -> out): per row ``softmax(x)`` or ``log_softmax(x)``;
    * ``softmax_grad`` / ``log_softmax_grad`` (y, dy -> dx): per row
      ``dx = y * (dy - sum(dy * y))``, or (y = log_softmax) ``dx = dy - exp(y) * sum(dy)``;
    * ``sparse_softmax_cross_entropy`` (x, label -> prob, out): per row ``prob = softmax(x)``,
      ``out[r] = logsumexp(x[r]) - x[r, label[r]]``;
    * ``sparse_softmax_cross_entropy_grad`` (dy, label, prob -> dx):
      ``dx[r, c] = dy[r] * (prob[r, c] - (c == label[r]))``.
    """
    return record("reduce", plan_of, steps)
