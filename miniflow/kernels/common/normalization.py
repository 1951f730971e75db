"""The builders of batch norm on every backend: ``normalization`` (training and eval),
``normalization_grad`` and ``increment``. Planned the same way everywhere: ``x`` viewed as
``[outer, C, inner]`` around ``axis`` (``miniflow.ops.geometry.norm_layout``), the training or
eval variant from the node's ``training`` attribute (the op's ``written`` inputs follow it too).
The backend's step makers run the loops (one channel per iteration or block, two passes for the
variance)."""
from __future__ import annotations

from ...ops.geometry import norm_layout

__all__ = ["builders"]


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
