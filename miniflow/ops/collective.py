"""The collective op of data-parallel training (``miniflow.passes.data_parallel`` emits it).

* ``all_reduce(x0, x1, ...) {reduce} -> (y0, y1, ...)``: one bucket of values reduced across the
  ranks of the process world (``miniflow.distributed``), every output of its input's shape and
  dtype. ``reduce="mean"``: ``y_k`` is the mean over the ranks of ``x_k`` (floating point, one
  dtype: the parameter gradients, PyTorch DDP's averaged all-reduce); ``reduce="sum"``: the sum
  (int64: the non-finite gradient counts of the loss-scale stage). Every rank gets the same bits.
  The kernels run the MPI collective as a plan step (``miniflow.kernels.common.collective``;
  OneFlow's eager ``eager_ccl_all_reduce`` / NCCL's ``ncclAllReduce``).

The reference (what ``miniflow.ir.evaluate`` computes) is the op in a world of one rank, where the
mean and the sum over the ranks are the input itself; the world a graph runs in is not part of the
IR. The op has no gradient (it runs after the autograd pass) and no AMP list (it runs after the AMP
pass, on the gradients in the dtype AMP chose).
"""
from __future__ import annotations

import numpy as np

from .common import fmt, rand
from .registry import register

__all__ = ["REDUCTIONS"]

REDUCTIONS = {"mean": "floating point (f16, f32, f64)", "sum": "int64"}
"""``all_reduce``'s reductions and the dtype each takes."""


def _norm(inputs, attrs):
    reduce = attrs.get("reduce", "mean")
    if reduce not in REDUCTIONS:
        raise ValueError(f"all_reduce: reduce={reduce!r}; choose one of "
                         f"{', '.join(map(repr, REDUCTIONS))}")
    return {"reduce": reduce}


def _infer(inputs, attrs):
    if not inputs:
        raise ValueError("all_reduce: needs at least one input (a bucket of gradients)")
    dtype, reduce = inputs[0].dtype, attrs["reduce"]
    for v in inputs:
        if v.dtype is not dtype:
            raise TypeError(f"all_reduce: a bucket holds one dtype; {fmt(inputs[0])} and "
                            f"{fmt(v)} differ (bucket the values per dtype)")
    if (reduce == "mean") != dtype.is_float:
        raise TypeError(f"all_reduce: reduce={reduce!r} takes {REDUCTIONS[reduce]} values, got "
                        f"{fmt(inputs[0])}")
    return [(v.shape, v.dtype) for v in inputs]


def _samples():
    cases = []
    for dt in (np.float32, np.float16):
        cases += [([rand(3, 4, dtype=dt), rand(5, dtype=dt), rand(0, dtype=dt)], {}),
                  ([np.array([1.0, np.inf, np.nan, -65504.0], dt)], {"reduce": "mean"})]
    cases.append(([np.array([0, 3, 2 ** 40], np.int64), np.array([7], np.int64)],
                  {"reduce": "sum"}))
    return cases


register("all_reduce", _infer, normalize=_norm, samples=_samples,
         reference=lambda xs, attrs: [np.array(x, copy=True) for x in xs], amp=None,
         amp_note="data-parallel stage: runs after AMP, on the gradients in the dtype AMP chose",
         doc="y_k = mean (or sum) over the ranks of x_k; the identity in a world of one rank")
