"""Op definitions: one registry record per op type (OneFlow's op type names).

Importing this package registers every op type. See ``registry.OpDef`` for what an op declares.
"""
from .registry import OP_REGISTRY, OpDef, all_ops, get_op, inference_calls, register
from . import amp_ops, elementwise, fused, linalg, loss_scale, nn, shape, update  # noqa: F401  (registers the op types)

__all__ = ["OP_REGISTRY", "OpDef", "all_ops", "get_op", "inference_calls", "register"]
