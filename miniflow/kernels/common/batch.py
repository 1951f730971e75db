"""``batch_matmul`` on any backend: its builder made from the backend's 2-D ``matmul`` builder,
one product per batch index (the leading dimensions flattened), on views of the operands' and
the output's C-contiguous buffers. Each product gets the 2-D builder's own choice of kernel (BLAS,
the register-tiled loops, cuBLAS or the CUDA tile), planned once when the plan is built."""
from __future__ import annotations

__all__ = ["batched"]


def batched(build_2d):
    """The ``batch_matmul`` builder over ``build_2d(node, [a, b], [out])``, a backend's ``matmul``
    builder (it reads ``transpose_a`` / ``transpose_b`` from ``node.attrs``, which
    ``batch_matmul`` shares). ``a`` is ``[..., m, k]`` (``[..., k, m]`` transposed), ``b``
    ``[..., k, n]`` (``[..., n, k]``), out ``[..., m, n]``, the leading dimensions equal."""
    def build_batch_matmul(node, ins, outs):
        """``out[i] = op(a[i]) @ op(b[i])`` for every batch index ``i`` (one 2-D product each)."""
        a, b, out = ins[0], ins[1], outs[0]
        batch = 1
        for d in out.shape[:-2]:
            batch *= int(d)
        a3 = a.reshape((batch,) + tuple(a.shape[-2:]))
        b3 = b.reshape((batch,) + tuple(b.shape[-2:]))
        o3 = out.reshape((batch,) + tuple(out.shape[-2:]))
        steps = []
        for i in range(batch):
            steps += build_2d(node, [a3[i], b3[i]], [o3[i]])
        return steps

    return build_batch_matmul
