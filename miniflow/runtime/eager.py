"""Eager execution: run one op now, on the same kernels a plan would use (forward only)."""
from __future__ import annotations

from ..dtype import as_dtype
from ..ir import Node, Value
from ..ops import get_op
from .backend import get_backend
from .plan import build_steps, check_owned

__all__ = ["run_op"]


def run_op(op: str, arrays: list, attrs: dict) -> list:
    """Run op type ``op`` on backend ``arrays`` with ``attrs``; returns the output arrays.

    Shapes and dtypes are inferred and checked exactly as while tracing, so eager and lazy code
    raise the same errors.
    """
    backend = get_backend()
    for i, a in enumerate(arrays):
        check_owned(backend, a, f"{op}: input {i}")
    opdef = get_op(op)
    ins = [Value(f"in{i}", a.shape, as_dtype(a.dtype), kind="input") for i, a in enumerate(arrays)]
    attrs = opdef.normalize_attrs(ins, attrs)
    metas = opdef.infer(ins, attrs)
    node = Node(opdef, ins, [], attrs)
    node.outputs = [Value(f"out{i}", s, d, producer=node) for i, (s, d) in enumerate(metas)]
    buffers = dict(zip(ins, arrays))
    steps, _ = build_steps([node], buffers, backend)
    try:
        for fn, args in steps:
            fn(*args)
    except (ValueError, IndexError) as e:     # a kernel refusing bad data: say which, as a plan
        detail = opdef.diagnose(node, [backend.to_numpy(a) for a in arrays]) \
            if opdef.diagnose is not None else None
        if detail is None:
            raise
        raise type(e)(f"{e}; {detail}") from e
    return [buffers[v] for v in node.outputs]
