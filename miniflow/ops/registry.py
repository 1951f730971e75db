"""The op registry: one :class:`OpDef` record per op type.

An op type is defined once: its inputs/outputs, attribute normalisation, shape/dtype inference, its
gradient rule (which *emits* backward nodes made of registered ops, needle/OneFlow style) and sample
inputs used by the kernel tests. Kernels live elsewhere (``miniflow.kernels``) and register per
backend under the same op type name. AMP categories (white/black/gray/clear) are not stored here:
their one source of truth is ``miniflow.amp.lists``, laid out like OneFlow's list file.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

__all__ = ["OpDef", "register", "get_op", "all_ops", "OP_REGISTRY", "inference_calls"]

OP_REGISTRY: dict[str, "OpDef"] = {}

_INFER_CALLS = [0]


def inference_calls() -> int:
    """Total number of shape/dtype inference calls made so far (the hot-path test reads it)."""
    return _INFER_CALLS[0]


@dataclass
class OpDef:
    """Definition of one op type.

    Attributes:
        name: OneFlow op type name (``"matmul"``, ``"bias_add"`` ...).
        infer: ``(inputs: list[Value], attrs) -> list[(shape, DType)]``; raises ValueError/TypeError
            naming the op and the offending shapes/dtypes.
        grad: ``(node, out_grads, emit) -> list[Value | None]`` (one entry per input), or None when the
            op is not differentiable. ``emit`` is ``Graph.emit``.
        normalize: ``(inputs, attrs) -> attrs`` filling defaults and canonicalising attributes.
        side_effect: the op writes some of its inputs (update ops); dead-code elimination keeps it.
        writes: indices of the inputs it writes in place.
        samples: ``() -> list[(list[np.ndarray], attrs)]`` small example inputs for kernel tests.
        elementwise: a scalar function name in ``miniflow.kernels.scalar`` when the op is
            elementwise: ``out[i] = fn(in0[i], in1[i], ...)`` with the inputs broadcast to the
            output (NumPy rules), followed by ``attrs["scalar"]`` when the op has that attribute.
            The fusion pass (``passes/fuse_elementwise``) merges chains of such ops.
        diagnose: ``(node, host input arrays) -> str | None``: when the op's kernel raised, a
            sentence about the offending values (e.g. which label is out of range) that the
            executor appends to the error.
    """

    name: str
    infer_fn: Callable
    grad: Callable | None = None
    normalize: Callable | None = None
    side_effect: bool = False
    writes: tuple = ()
    samples: Callable | None = None
    elementwise: str | None = None
    diagnose: Callable | None = None
    doc: str = field(default="", repr=False)

    def infer(self, inputs, attrs):
        """Shape/dtype inference (counted, so tests can prove the hot path never calls it)."""
        _INFER_CALLS[0] += 1
        return self.infer_fn(inputs, attrs)

    def normalize_attrs(self, inputs, attrs):
        """Canonical attributes for ``inputs`` (defaults filled, axes made non-negative)."""
        return self.normalize(inputs, dict(attrs)) if self.normalize else dict(attrs)


def register(name: str, infer, **kw) -> OpDef:
    """Register an op type; returns its OpDef. Re-registering a name is an error."""
    if name in OP_REGISTRY:
        raise KeyError(f"op type {name!r} is already registered")
    op = OpDef(name, infer, **kw)
    OP_REGISTRY[name] = op
    return op


def get_op(name: str) -> OpDef:
    """The OpDef of op type ``name``.

    Raises:
        KeyError: unknown op type, listing the registered ones.
    """
    try:
        return OP_REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown op type {name!r}; registered: {', '.join(sorted(OP_REGISTRY))}") from None


def all_ops() -> dict:
    """All registered op types, name -> OpDef."""
    return dict(OP_REGISTRY)
