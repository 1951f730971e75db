"""The builders of the pools on every backend: ``max_pool_2d``, ``avg_pool_2d``,
``adaptive_avg_pool2d`` and their gradients. Planned the same way everywhere: the window geometry
(``miniflow.ops.geometry``, as the ops' inference computes it), and no step for an empty output.
The backend's step makers run the loops."""
from __future__ import annotations

from ...ops.geometry import pool_geometry

__all__ = ["builders"]


def builders(*, max_steps, max_grad_steps, avg_steps, avg_grad_steps, adaptive_steps,
             adaptive_grad_steps) -> dict:
    """Op type -> builder of the pooling ops, over a backend's step makers (``g``: the
    ``PoolGeometry``; ``attrs``: the node's normalized attributes; ``(oh, ow)``: the adaptive
    output size):

    * ``max_steps(x, y, indice, g)``, ``max_grad_steps(indice, dy, dx, g)``;
    * ``avg_steps(x, y, g, attrs)``, ``avg_grad_steps(dy, dx, g, attrs)``;
    * ``adaptive_steps(x, y, oh, ow)``, ``adaptive_grad_steps(dy, dx, oh, ow)``.
    """
    def geometry(op, node, x, avg):
        return pool_geometry(op, tuple(x.shape), node.attrs, avg=avg)

    def max_pool_2d(node, ins, outs):
        """``y, indice = max_pool_2d(x)`` (indices flat in each ``H*W`` plane, int64)."""
        g = geometry("max_pool_2d", node, ins[0], False)
        return max_steps(ins[0], outs[0], outs[1], g) if outs[0].size else []

    def max_pool_2d_grad(node, ins, outs):
        """``dx = max_pool_2d_grad(x, indice, dy)``: ``dy`` added at the indexed inputs."""
        g = geometry("max_pool_2d_grad", node, ins[0], False)
        return max_grad_steps(ins[1], ins[2], outs[0], g) if outs[0].size else []

    def avg_pool_2d(node, ins, outs):
        """``y = avg_pool_2d(x)``."""
        g = geometry("avg_pool_2d", node, ins[0], True)
        return avg_steps(ins[0], outs[0], g, node.attrs) if outs[0].size else []

    def avg_pool_2d_grad(node, ins, outs):
        """``dx = avg_pool_2d_grad(x, dy)``."""
        g = geometry("avg_pool_2d_grad", node, ins[0], True)
        return avg_grad_steps(ins[1], outs[0], g, node.attrs) if outs[0].size else []

    def adaptive_avg_pool2d(node, ins, outs):
        """``y = adaptive_avg_pool2d(x)``."""
        oh, ow = node.attrs["output_size"]
        return adaptive_steps(ins[0], outs[0], oh, ow) if outs[0].size else []

    def adaptive_avg_pool2d_grad(node, ins, outs):
        """``dx = adaptive_avg_pool2d_grad(x, dy)``."""
        oh, ow = node.attrs["output_size"]
        return adaptive_grad_steps(ins[1], outs[0], oh, ow) if outs[0].size else []

    return {"max_pool_2d": max_pool_2d, "max_pool_2d_grad": max_pool_2d_grad,
            "avg_pool_2d": avg_pool_2d, "avg_pool_2d_grad": avg_pool_2d_grad,
            "adaptive_avg_pool2d": adaptive_avg_pool2d,
            "adaptive_avg_pool2d_grad": adaptive_avg_pool2d_grad}
