"""The collective step of ``all_reduce`` (semantics in ``miniflow.ops.collective``), the same on
every backend: the MPI collective of ``miniflow.distributed`` on host (NumPy) buffers. The CPU
backend passes its buffers as they are; the CUDA backend stages device buffers through host
buffers around it (``kernels.cuda.collective``)."""
from __future__ import annotations

from ... import distributed

__all__ = ["all_reduce_step"]


def all_reduce_step(node, ins, outs):
    """The step ``(fn, ())`` that reduces host arrays ``ins`` across the ranks into ``outs`` (the
    same arrays: in place) as ``node.attrs["reduce"]`` says: ``"mean"`` through
    :func:`miniflow.distributed.allreduce_mean_step`, ``"sum"`` through
    :func:`~miniflow.distributed.allreduce_sum_int64_step`.

    The process world is set up here if nobody did yet (``distributed.init()``: a one-rank world,
    where the step copies, when no MPI launcher started the process).
    """
    distributed.init()
    out = None if all(o is i for o, i in zip(outs, ins)) else outs
    if node.attrs["reduce"] == "mean":
        return distributed.allreduce_mean_step(ins, out=out)
    return distributed.allreduce_sum_int64_step(ins, out=out)
