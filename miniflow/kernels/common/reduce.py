"""The builders of the reductions and row ops of every backend: ``reduce_sum``, ``softmax``,
``log_softmax`` (+ grads), ``sparse_softmax_cross_entropy`` (+ grad). What is planned the same way
everywhere is planned here: ``reduce_sum``'s ``[outer, red, inner]`` layout and the gather that
makes its reduced dims one block (``layout.reduce_layout``), the row ops' ``[rows, cols]`` view
over the last axis (``layout.rows_cols``). The backend's step makers run the loops."""
from __future__ import annotations

from .layout import reduce_layout, rows_cols

__all__ = ["builders", "reduce_sum_builder"]


def reduce_sum_builder(transpose_steps, scratch, sum_steps):
    """The ``reduce_sum`` builder over a backend's step makers (see :func:`builders`)."""
    def reduce_sum(node, ins, outs):
        """``out = x.sum(axis=attrs["axis"], keepdims=attrs["keepdims"])``; when the reduced dims
        are not one block (axis (0, 2) of a 3-D x), x is first copied, kept dims first, into a
        scratch buffer."""
        x, out = ins[0], outs[0]
        if out.size == 0:
            return []
        gather, (outer, red_n, inner) = reduce_layout(x.shape, tuple(node.attrs["axis"]))
        steps, src = [], x
        if gather is not None:
            sizes, order = gather
            src = scratch(x, (x.size,), x.dtype)
            steps = transpose_steps(x, sizes, order, src)
        return steps + sum_steps(src, out, outer, red_n, inner)
    return reduce_sum


def builders(*, transpose_steps, scratch, sum_steps, softmax_steps, softmax_grad_steps,
             xent_steps, xent_grad_steps) -> dict:
    """Op type -> builder of the reductions and row ops, over a backend's step makers:

    * ``transpose_steps(x, shape, perm, out)``: ``out = x.reshape(shape).transpose(perm)`` (flat
      ``out``); ``scratch(like, shape, dtype)``: a buffer in ``like``'s memory;
    * ``sum_steps(x, out, outer, red, inner)``: ``out[o, k] = sum_r x[o, r, k]``, x viewed as
      ``[outer, red, inner]``, summed in the compute type;
    * ``softmax_steps(log, x, out, rows, cols)``: per row ``out = softmax(x)``, or
      ``log_softmax(x)`` for ``log``;
    * ``softmax_grad_steps(log, y, dy, dx, rows, cols)``: per row ``dx = y * (dy - sum(dy * y))``,
      or for ``log`` (y = log_softmax) ``dx = dy - exp(y) * sum(dy)``;
    * ``xent_steps(x, label, prob, out, rows, cols)``: per row ``prob = softmax(x)``,
      ``out[r] = logsumexp(x[r]) - x[r, label[r]]``;
    * ``xent_grad_steps(dy, label, prob, dx, rows, cols)``:
      ``dx[r, c] = dy[r] * (prob[r, c] - (c == label[r]))``.
    """
    reduce_sum = reduce_sum_builder(transpose_steps, scratch, sum_steps)

    def softmax(log: bool):
        def build(node, ins, outs):
            return softmax_steps(log, ins[0], outs[0], *rows_cols(ins[0].shape))
        build.__doc__ = f"``out = {'log_' if log else ''}softmax(x)`` over the last axis."
        return build

    def softmax_grad(log: bool):
        def build(node, ins, outs):
            return softmax_grad_steps(log, ins[0], ins[1], outs[0], *rows_cols(ins[0].shape))
        build.__doc__ = f"``dx = {'log_' if log else ''}softmax_grad(y, dy)`` over the last axis."
        return build

    def sparse_xent(node, ins, outs):
        """``prob, out = sparse_softmax_cross_entropy(prediction [N, C], label [N] int64)``."""
        return xent_steps(*ins, *outs, *rows_cols(ins[0].shape))

    def sparse_xent_grad(node, ins, outs):
        """``dx = sparse_softmax_cross_entropy_grad(dy [N], label [N] int64, prob [N, C])``."""
        return xent_grad_steps(*ins, outs[0], *rows_cols(ins[2].shape))

    return {"reduce_sum": reduce_sum, "softmax": softmax(False), "log_softmax": softmax(True),
            "softmax_grad": softmax_grad(False), "log_softmax_grad": softmax_grad(True),
            "sparse_softmax_cross_entropy": sparse_xent,
            "sparse_softmax_cross_entropy_grad": sparse_xent_grad}
