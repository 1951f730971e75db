"""The builders of batch norm on every backend: ``normalization`` (training and eval),
``normalization_grad`` and ``increment``. Planned the same way everywhere: ``x`` viewed as
``[outer, C, inner]`` around ``axis`` (``miniflow.ops.geometry.norm_layout``), the training or
eval variant from the node's ``training`` attribute (the op's ``written`` inputs follow it too).
The backend's step makers run the loops (one channel per iteration or block, two passes for the
variance).

The layer-norm builders (``layer_norm``, ``layer_norm_grad``, ``layer_norm_param_grad``) view
``x`` as ``[rows, cols]`` around ``begin_norm_axis`` (:func:`layer_norm_builders`)."""
from __future__ import annotations

from ...ops.geometry import norm_layout

__all__ = ["builders", "layer_norm_builders"]


def builders(*, train_steps, eval_steps, grad_steps, increment_steps) -> dict:
    """Op type -> builder of the batch-norm ops, over a backend's step makers (``layout`` is
    ``(outer, C, inner)``):

    * ``train_steps(x, y, mean, inv_variance, moving_mean, moving_variance, gamma, beta, layout,
      epsilon, momentum)``: batch statistics, ``y``, and the moving statistics updated in place;
    * ``eval_steps(x, y, moving_mean, moving_variance, gamma, beta, layout, epsilon)``;
    * ``grad_steps(x, dy, mean, inv_variance, gamma, gamma_diff, beta_diff, dx, layout)``;
    * ``increment_steps(counter)``: ``counter += 1``.
    """
    def normalization(node, ins, outs):
        """``y[, mean, inv_variance] = normalization(x, moving_mean, moving_variance, gamma,
        beta)``; training writes the moving statistics in place."""
        x, mm, mv, gamma, beta = ins
        a = node.attrs
        layout = norm_layout("normalization", tuple(x.shape), a["axis"])
        if a["training"]:
            y, mean, inv = outs
            return train_steps(x, y, mean, inv, mm, mv, gamma, beta, layout, a["epsilon"],
                               a["momentum"])
        return eval_steps(x, outs[0], mm, mv, gamma, beta, layout, a["epsilon"])

    def normalization_grad(node, ins, outs):
        """``gamma_diff, beta_diff, dx = normalization_grad(x, dy, mean, inv_variance, gamma)``."""
        x = ins[0]
        layout = norm_layout("normalization_grad", tuple(x.shape), node.attrs["axis"])
        return grad_steps(*ins, *outs, layout)

    def increment(node, ins, outs):
        """``counter += 1`` in place."""
        return increment_steps(ins[0])

    return {"normalization": normalization, "normalization_grad": normalization_grad,
            "increment": increment}


def _rows_cols(shape, axis: int) -> tuple:
    """``(rows, cols)``: the products of ``shape[:axis]`` and ``shape[axis:]``."""
    rows = cols = 1
    for d in shape[:axis]:
        rows *= int(d)
    for d in shape[axis:]:
        cols *= int(d)
    return rows, cols


def layer_norm_builders(layer_norm_steps, grad_steps, param_grad_steps) -> dict:
    """Op type -> builder of the layer-norm ops, over a backend's step makers (``x`` viewed as
    ``[rows, cols]``; a missing ``gamma`` / ``beta`` is None):

    * ``layer_norm_steps(x, gamma, beta, y, mean, inv_variance, rows, cols, epsilon)``;
    * ``grad_steps(dy, x, mean, inv_variance, gamma, dx, rows, cols)``;
    * ``param_grad_steps(dy, x, mean, inv_variance, gamma_diff, beta_diff, rows, cols)``.
    """
    def layer_norm(node, ins, outs):
        """``y, mean, inv_variance = layer_norm(x[, gamma, beta])``."""
        x = ins[0]
        gamma, beta = (ins[1], ins[2]) if len(ins) == 3 else (None, None)
        rows, cols = _rows_cols(x.shape, node.attrs["begin_norm_axis"])
        if rows == 0:
            return []
        return layer_norm_steps(x, gamma, beta, *outs, rows, cols, node.attrs["epsilon"])

    def layer_norm_grad(node, ins, outs):
        """``dx = layer_norm_grad(dy, x, mean, inv_variance[, gamma])``."""
        dy, x, mean, inv = ins[:4]
        rows, cols = _rows_cols(x.shape, node.attrs["begin_norm_axis"])
        if rows * cols == 0:
            return []
        return grad_steps(dy, x, mean, inv, ins[4] if len(ins) == 5 else None, outs[0], rows,
                          cols)

    def layer_norm_param_grad(node, ins, outs):
        """``gamma_diff, beta_diff = layer_norm_param_grad(dy, x, mean, inv_variance)``."""
        rows, cols = _rows_cols(ins[1].shape, node.attrs["begin_params_axis"])
        if cols == 0:
            return []
        return param_grad_steps(*ins, *outs, rows, cols)

    return {"layer_norm": layer_norm, "layer_norm_grad": layer_norm_grad,
            "layer_norm_param_grad": layer_norm_param_grad}
