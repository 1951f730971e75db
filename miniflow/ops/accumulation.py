"""Ops of gradient accumulation (OneFlow's ``unpack``, ``acc`` and ``pack``, which its lazy
interpreter and job passes insert when ``config.set_gradient_accumulation_steps(n)`` is set).

A graph that holds them runs in ``n`` micro-batches: the nodes that depend on an ``unpack``
output run once per micro-batch, the others once per call, before or after the micro-batches
(``miniflow.ir.Graph.micro_batch_schedule``; OneFlow expresses the same with time shapes).
These three ops are the boundaries, with ``OpDef.micro_batch`` set (kind ``"split"``: its input
is read once per call, its output is one micro-batch's; ``"collect"``: its input is one
micro-batch's, its output is complete after the last micro-batch):

* ``unpack(in) -> out`` {unpack_num}: micro-batch ``i`` of ``in`` along dim 0:
  ``out = in[i*m:(i+1)*m]`` with ``m = in.shape[0] / unpack_num`` (every graph input).
* ``acc(in) -> out`` {max_acc_num}: the sum of ``in`` over the micro-batches (each parameter
  gradient; OneFlow's ``acc``, ``GradAccCollect``).
* ``pack(in) -> out`` {pack_num}: the micro-batches' ``in`` concatenated along dim 0, a scalar
  stacked into ``[pack_num]`` (every graph output; OneFlow's ``pack``).

They run once per micro-batch with the attribute ``micro_batch = i`` added (by the plan and by
``ir.evaluate``; the graph's node has none), and that is also their single-call semantics, the
one their kernels and samples have (a node that has the attribute is that one call, run once):
``unpack`` writes slice ``i``; ``acc`` copies ``in`` at ``i = 0`` and adds it to ``out`` after;
``pack`` writes slice ``i`` of ``out``. The references
of ``acc`` and ``pack`` receive the output so far as an extra last array when ``i > 0``. The
samples cover one call each (``acc`` at ``i = 0``, ``pack`` with ``pack_num = 1``); whole loops
are tested through plans and ``evaluate`` (``tests/test_accumulation.py``).
"""
from __future__ import annotations

import numpy as np

from ..checks import integer, is_integer
from .common import fmt, rand
from .registry import register


def _count(op: str, attr: str):
    def normalize(inputs, attrs):
        n = integer(op, attr, attrs.get(attr), 1)
        out = {attr: n}
        if "micro_batch" in attrs:
            i = attrs["micro_batch"]
            if not is_integer(i) or not 0 <= i < n:
                raise ValueError(f"{op}: micro_batch must be an integer in [0, {n}), got {i!r}")
            out["micro_batch"] = int(i)
        return out
    return normalize


def _one(op: str, inputs):
    if len(inputs) != 1:
        raise ValueError(f"{op}: expects 1 input, got {len(inputs)}")
    return inputs[0]


def _unpack_infer(inputs, attrs):
    x, n = _one("unpack", inputs), attrs["unpack_num"]
    if not x.shape or x.shape[0] % n:
        rows = f"{x.shape[0]} rows" if x.shape else "no dim 0"
        raise ValueError(f"unpack: input {fmt(x)} has {rows}: it must split into unpack_num={n} "
                         f"micro-batches of equal size along dim 0")
    return [((x.shape[0] // n, *x.shape[1:]), x.dtype)]


def _acc_infer(inputs, attrs):
    x = _one("acc", inputs)
    if not x.dtype.is_float:
        raise TypeError(f"acc: input {fmt(x)} must be floating point (a gradient)")
    return [(x.shape, x.dtype)]


def _pack_infer(inputs, attrs):
    x, n = _one("pack", inputs), attrs["pack_num"]
    return [((n,) if not x.shape else (x.shape[0] * n, *x.shape[1:]), x.dtype)]


def _unpack_ref(arrays, attrs):
    x, i = arrays[0], attrs.get("micro_batch", 0)
    m = x.shape[0] // attrs["unpack_num"]
    return [x[i * m:(i + 1) * m].copy()]


def _acc_ref(arrays, attrs):
    x, *so_far = arrays
    return [x.copy() if attrs.get("micro_batch", 0) == 0 else so_far[0] + x]


def _pack_ref(arrays, attrs):
    x, *so_far = arrays
    n, i = attrs["pack_num"], attrs.get("micro_batch", 0)
    rows = x.reshape(1, *x.shape) if not x.shape else x
    out = so_far[0].copy() if so_far else np.zeros((n * rows.shape[0], *rows.shape[1:]))
    m = rows.shape[0]
    out[i * m:(i + 1) * m] = rows
    return [out]


def _samples(op: str, make):
    def samples():
        r = np.random.default_rng(41)
        out = []
        for dt in (np.float32, np.float16):
            out += make(lambda *s: rand(*s, dtype=dt, r=r))
        return out + [case for case in make(lambda *s: r.integers(-5, 5, s)) if op != "acc"]
    return samples


register("unpack", _unpack_infer, normalize=_count("unpack", "unpack_num"), reference=_unpack_ref,
         samples=_samples("unpack", lambda a: [
             ([a(8, 3)], {"unpack_num": 4, "micro_batch": 2}),
             ([a(6)], {"unpack_num": 3, "micro_batch": 0}),
             ([a(2, 2, 2)], {"unpack_num": 1, "micro_batch": 0})]),
         amp="clear", micro_batch=("split", "unpack_num"),
         doc="out = micro-batch `micro_batch` of in along dim 0 (of unpack_num)")
register("acc", _acc_infer, normalize=_count("acc", "max_acc_num"), reference=_acc_ref,
         samples=_samples("acc", lambda a: [([a(3, 4)], {"max_acc_num": 4, "micro_batch": 0}),
                                            ([a()], {"max_acc_num": 2, "micro_batch": 0})]),
         amp="gray", amp_note="runs after AMP, on the float32 master gradients",
         micro_batch=("collect", "max_acc_num"),
         doc="out = sum of in over the max_acc_num micro-batches")
register("pack", _pack_infer, normalize=_count("pack", "pack_num"), reference=_pack_ref,
         samples=_samples("pack", lambda a: [([a(3, 2)], {"pack_num": 1, "micro_batch": 0}),
                                             ([a()], {"pack_num": 1, "micro_batch": 0})]),
         amp="clear", micro_batch=("collect", "pack_num"),
         doc="out = the pack_num micro-batches of in concatenated along dim 0")
