"""The normalization family of every backend: batch norm (``normalization``, training and eval;
``normalization_grad``; ``increment``, its step counter) and layer norm (``layer_norm``,
``layer_norm_grad``, ``layer_norm_param_grad``). Planned the same way everywhere (:func:`plan_of`):
batch norm views ``x`` as ``[outer, C, inner]`` around ``axis``
(``miniflow.ops.geometry.norm_layout``), layer norm as ``[rows, cols]`` around
``begin_norm_axis`` / ``begin_params_axis``, with no step where there is nothing to normalize.
The backend's step makers (``family.StepMaker``, one per op type; :func:`by_mode` picks the
training or eval one of ``normalization`` from the node's ``training`` attribute, which the op's
``written`` inputs follow too) run the loops: one channel per iteration or block, two passes for
the variance.

A backend fills its record, ``BUILDERS`` of its ``normalization.py``, by op type::

    BUILDERS = normalization.builders(normalization=by_mode(train_steps, eval_steps), ...)
"""
from __future__ import annotations

from ...ops.geometry import norm_layout
from .family import StepMaker, record

__all__ = ["OPS", "plan_of", "by_mode", "param", "builders"]

OPS = ("normalization", "normalization_grad", "increment", "layer_norm", "layer_norm_grad",
       "layer_norm_param_grad")
"""The library's normalization op types: every backend's record has a step maker for each."""


def _rows_cols(shape, axis: int) -> tuple:
    """``(rows, cols)``: the products of ``shape[:axis]`` and ``shape[axis:]``."""
    rows = cols = 1
    for d in shape[:axis]:
        rows *= int(d)
    for d in shape[axis:]:
        cols *= int(d)
    return rows, cols


def plan_of(node, ins: list, outs: list):
    """The plan a normalization step maker gets, or None (no step):

    * ``normalization`` (x, moving_mean, moving_variance, gamma, beta) and ``normalization_grad``
      (x, dy, mean, inv_variance, gamma): ``(outer, C, inner)``;
    * ``increment``: ``()``;
    * ``layer_norm`` (x[, gamma, beta]): ``(rows, cols)`` of x at ``begin_norm_axis``, None
      without rows;
    * ``layer_norm_grad`` (dy, x, mean, inv_variance[, gamma]): the same of x, None when empty;
    * ``layer_norm_param_grad`` (dy, x, mean, inv_variance): ``(rows, cols)`` of x at
      ``begin_params_axis``, None without columns.
    """
    op, a = node.op.name, node.attrs
    if op in ("normalization", "normalization_grad"):
        return norm_layout(op, tuple(ins[0].shape), a["axis"])
    if op == "increment":
        return ()
    if op == "layer_norm":
        rows, cols = _rows_cols(ins[0].shape, a["begin_norm_axis"])
        return (rows, cols) if rows else None
    if op == "layer_norm_grad":
        rows, cols = _rows_cols(ins[1].shape, a["begin_norm_axis"])
        return (rows, cols) if rows * cols else None
    rows, cols = _rows_cols(ins[1].shape, a["begin_params_axis"])
    return (rows, cols) if cols else None


def by_mode(train: StepMaker, evaluate: StepMaker) -> StepMaker:
    """The step maker of ``normalization``: ``train`` (``y, mean, inv_variance`` and the moving
    statistics updated in place) for a node with ``training``, else ``evaluate`` (``y`` from the
    moving statistics)."""
    def steps(ins, outs, layout, attrs):
        return (train if attrs["training"] else evaluate)(ins, outs, layout, attrs)

    steps.__name__ = f"by_mode({train.__name__}, {evaluate.__name__})"
    return steps


def param(ins: list, i: int):
    """Input ``i`` of a layer-norm node, or None where the node has no affine parameters."""
    return ins[i] if len(ins) > i else None


def builders(**steps: StepMaker) -> dict:
    """Op type -> builder over a backend's step makers ``steps`` (keyword: op type, value: its
    ``family.StepMaker``, with the plan of :func:`plan_of`), the backend's record of the
    normalization family."""
    return record("normalization", plan_of, steps)
