"""The boundary ops of gradient accumulation on every backend (semantics in
``miniflow.ops.accumulation``): ``unpack``, ``acc`` and ``pack`` as copies and in-place adds over
the backend's elementwise step makers (``StepMakers.cast`` copies, ``StepMakers.zip`` adds).

The plan builds these nodes once per micro-batch with ``attrs["micro_batch"] = i``, so each
micro-batch gets its own steps (a copy of slice ``i``; the first ``acc`` a copy, the later ones an
add into the output) and the plan stays one flat list of steps (``miniflow.runtime.plan``).
"""
from __future__ import annotations

from ...ops.registry import get_op
from .elementwise import StepMakers

__all__ = ["builders"]


def _rows(a, i: int, m: int):
    """Elements ``[i*m, (i+1)*m)`` of ``a`` read flat (a view: host or device array)."""
    return a.reshape(a.size)[i * m:(i + 1) * m]


def builders(steps: StepMakers) -> dict:
    """Op type -> builder of ``unpack``, ``acc`` and ``pack`` over ``steps``."""
    add = get_op("broadcast_add").scalar

    def unpack(node, ins, outs):
        """``out = in[i*m:(i+1)*m]`` (flat), ``i = attrs["micro_batch"]``, ``m = out.size``."""
        out = outs[0]
        return steps.cast(_rows(ins[0], node.attrs.get("micro_batch", 0), out.size), out)

    def acc(node, ins, outs):
        """``out = in`` at micro-batch 0, ``out += in`` after."""
        x, out = ins[0], outs[0]
        if node.attrs.get("micro_batch", 0) == 0:
            return steps.cast(x, out)
        return steps.zip(add, out, x, out)

    def pack(node, ins, outs):
        """``out[i*m:(i+1)*m] = in`` (flat), ``m = in.size``."""
        x = ins[0]
        return steps.cast(x, _rows(outs[0], node.attrs.get("micro_batch", 0), x.size))

    return {"unpack": unpack, "acc": acc, "pack": pack}
