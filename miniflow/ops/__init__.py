"""Op definitions: one registry record per op type (OneFlow's op type names).

Importing this package registers every op type. See ``registry.OpDef`` for what an op declares,
and ``elementwise.elementwise`` for declaring an elementwise op with its scalar function.
"""
from .registry import (OP_REGISTRY, OpDef, all_ops, emitter, get_op, inference_calls, register,
                       scalar_functions, unregister)
from . import (accumulation, amp_ops, clip, collective, conv, dropout, elementwise,  # noqa: F401
               fused,
               indexing, layer_norm, linalg, loss_scale, nn, normalization, pool, reduce_max,
               shape,
               update)  # (registers the op types)

__all__ = ["OP_REGISTRY", "OpDef", "all_ops", "emitter", "get_op", "inference_calls", "register",
           "scalar_functions", "unregister"]
