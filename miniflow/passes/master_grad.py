"""The one place a parameter gradient is cast to its parameter's dtype (a float16 gradient of a
float32 master weight, made by a white node under AMP), shared by the gradient-accumulation,
loss-scale and optimizer passes (OneFlow casts fp16 model diffs to fp32 at the start of
``GenerateOptimizerOpConfs``, ``oneflow/core/job_rewriter/optimizer.cpp``)."""
from __future__ import annotations

from ..ir import Graph, Value
from ..ops import emitter

__all__ = ["master_grad"]


def master_grad(graph: Graph, param: Value, grad: Value) -> Value:
    """``grad`` in the parameter's dtype: a float16 gradient of a float32 parameter is cast (one
    ``cast`` node emitted into ``graph``); a gradient already in that dtype is returned as is."""
    return grad if grad.dtype is param.dtype else emitter(graph)("cast", grad, dtype=param.dtype)
