"""Data-parallel pass: average the parameter gradients across the ranks, in buckets: PyTorch DDP's
gradient all-reduce, as graph nodes.

Runs after autograd and AMP, before loss scaling and the optimizer (``pipeline.py``), and only when
``ctx.settings.data_parallel`` is set: the compile driver sets it for a graph that trains, in a
process world of more than one rank or when ``config.enable_data_parallel()`` asks for it
(``miniflow.compiler``). Assumes the autograd pass made the gradient results ``grad:<variable>`` of
the trainable variables (``settings.trainable``, in parameter order). Guarantees:

1. The gradients are bucketed in reverse parameter order (the order backward produces them, DDP's
   bucket order) by PyTorch DDP's rule, ``miniflow.distributed.compute_bucket_assignment_by_size``:
   per gradient dtype, a bucket closes once it holds ``bucket_cap_mb`` MiB (25, DDP's default).
2. Every bucket becomes one ``all_reduce`` node ``{reduce='mean'}`` after the backward nodes, and
   each gradient result becomes its mean over the ranks, in the dtype AMP chose for the gradient.
   MPI has no float16 sum, so a float16 (or bfloat16) bucket is summed in float32 anyway; the
   pass makes that explicit in the IR: ``cast`` to float32, ``all_reduce`` in float32, ``cast`` of
   the means back to the half type. That is bit for bit what the collective's own float16 path gives (sum and divide in
   float32, one rounding to float16), and faster: the cast kernels convert in a pass over memory
   where the collective converts with NumPy (``benchmarks/README.md``, "Data parallel").
3. ``ctx.state[DataParallelState].buckets`` lists each bucket's variable names. The loss-scale
   pass then sums the non-finite counts across the ranks (``all_reduce {reduce='sum'}``), so that every rank skips the
   same steps and changes its scale the same way.

Another reader of a gradient (autograd makes none: parameter gradients are sinks) keeps reading
the rank's own gradient; only the results, which the loss-scale and optimizer passes read, change.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..distributed import DEFAULT_BUCKET_CAP_MB, compute_bucket_assignment_by_size
from ..dtype import float32
from ..ir import Graph, grad_name
from ..ops import emitter

__all__ = ["DataParallelConfig", "DataParallelState", "data_parallel", "summed_in_float32"]


@dataclass(frozen=True)
class DataParallelConfig:
    """The data-parallel settings of one graph (``GraphConfig.enable_data_parallel``).

    Attributes:
        bucket_cap_mb: a gradient bucket closes once it holds this many MiB (PyTorch DDP's
            ``bucket_cap_mb``; default 25).

    Raises:
        ValueError: ``bucket_cap_mb`` is not a finite number > 0.
    """

    bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB

    def __post_init__(self):
        cap = self.bucket_cap_mb
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or \
                not (math.isfinite(cap) and cap > 0):
            raise ValueError(f"enable_data_parallel: bucket_cap_mb must be a finite number of MiB "
                             f"> 0, got {cap!r}")


@dataclass
class DataParallelState:
    """What the pass hands on (``ctx.state[DataParallelState]``, read by the loss-scale pass and
    the compile driver): ``buckets``, the variable names of each gradient bucket it all-reduces,
    in all-reduce order. Absent when the pass did not run or the graph has no gradients."""

    buckets: list = field(default_factory=list)


def summed_in_float32(dtype) -> bool:
    """Whether a bucket of ``dtype`` is all-reduced as float32 between two casts: the half types
    (MPI has no 16-bit float sum)."""
    return dtype.is_half


def data_parallel(graph: Graph, ctx) -> Graph:
    """Average the gradient results across the ranks (no-op without ``settings.data_parallel``
    or gradients) and store a :class:`DataParallelState`; see the module docstring."""
    settings = ctx.settings
    if settings.data_parallel is None or not graph.grads:
        return graph
    grads = graph.grads
    names = [n for n in reversed(settings.trainable) if n in grads]
    buckets = compute_bucket_assignment_by_size([(grads[n].shape, grads[n].dtype.np)
                                                 for n in names],
                                                settings.data_parallel.bucket_cap_mb)
    emit = emitter(graph)
    state = ctx.state[DataParallelState] = DataParallelState()
    for bucket in buckets:
        bucket_names = [names[i] for i in bucket]
        values = [grads[n] for n in bucket_names]
        half = values[0].dtype if summed_in_float32(values[0].dtype) else None
        if half is not None:
            values = [emit("cast", v, dtype=float32) for v in values]
        means = emit("all_reduce", *values, reduce="mean")
        means = list(means) if isinstance(means, tuple) else [means]
        if half is not None:
            means = [emit("cast", m, dtype=half) for m in means]
        for name, mean in zip(bucket_names, means):
            graph.results[grad_name(name)] = mean
        state.buckets.append(bucket_names)
    return graph
