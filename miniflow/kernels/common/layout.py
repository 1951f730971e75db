"""Layout planning shared by every backend's kernels, done once when a plan is built: how a NumPy
broadcast collapses to few dims with element strides (:func:`broadcast_plan`, for the zip and
gather kernels), how a ``reduce_sum`` views its input as ``[outer, red, inner]``
(:func:`reduce_layout`), how row ops view theirs as ``[rows, cols]`` (:func:`rows_cols`) and
where ``broadcast_like`` puts its size-1 dims (:func:`unsqueezed`). Plain Python on shapes; no
kernel code, no backend imports.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["broadcast_plan", "unsqueezed", "reduce_plan", "reduce_layout", "rows_cols"]


def broadcast_plan(out_shape, *in_shapes):
    """Collapse a NumPy broadcast into ``(shape, [strides per input])`` as int64 arrays.

    ``in_shapes`` broadcast to ``out_shape`` (NumPy rules, aligned on the right). Strides are in
    elements, 0 along broadcast dims. Returns None when out is empty. A single element gives
    shape (1,) with stride 0.
    """
    out_shape = tuple(out_shape)
    nd = len(out_shape)
    if 0 in out_shape:
        return None
    per_input = []
    for s in in_shapes:
        s = (1,) * (nd - len(s)) + tuple(s)
        st, acc = [0] * nd, 1
        for d in range(nd - 1, -1, -1):
            st[d] = acc if s[d] == out_shape[d] and s[d] != 1 else 0
            acc *= s[d]
        per_input.append(st)
    dims = [d for d in range(nd) if out_shape[d] != 1]
    shape, strides = [], [[] for _ in in_shapes]
    for d in dims:
        n = out_shape[d]
        if shape and all(st[-1] == src[d] * n for st, src in zip(strides, per_input)):
            shape[-1] *= n
            for st, src in zip(strides, per_input):
                st[-1] = src[d]
        else:
            shape.append(n)
            for st, src in zip(strides, per_input):
                st.append(src[d])
    if not shape:
        shape, strides = [1], [[0] for _ in in_shapes]
    return np.array(shape, np.int64), [np.array(st, np.int64) for st in strides]


def unsqueezed(shape, axes, ndim: int) -> tuple:
    """``shape`` with a 1 inserted at each of ``axes`` (of the ``ndim``-dim result; negative axes
    count from its end) when it has fewer than ``ndim`` dims: ``broadcast_like``'s input as the
    shape it broadcasts from, e.g. ``((3,), (0,), 2)`` -> ``(1, 3)``."""
    shape = list(shape)
    if len(shape) < ndim:
        for ax in sorted(ax % ndim for ax in axes):
            shape.insert(ax, 1)
    return tuple(shape)


def reduce_plan(shape, axes):
    """Merge ``shape`` into alternating kept/reduced dims.

    Returns ``(sizes, reduced)``: merged sizes and a bool per merged dim (True = reduced); size-1
    dims are dropped, so e.g. ``((4, 1, 5, 6), (1, 2))`` -> ``([4, 5, 6], [False, True, False])``.
    """
    sizes, reduced = [], []
    for d, n in enumerate(shape):
        if n == 1:
            continue
        r = d in axes
        if reduced and reduced[-1] == r:
            sizes[-1] *= n
        else:
            sizes.append(n)
            reduced.append(r)
    return sizes, reduced


def reduce_layout(shape, axes):
    """How a ``reduce_sum`` over ``axes`` of ``shape`` runs, on any backend.

    Returns ``(gather, (outer, red_n, inner))``: the input viewed as ``[outer, red_n, inner]`` is
    summed over its middle dim. ``gather`` is None, or ``(sizes, order)`` when the reduced dims are
    not one block: then x (merged to ``sizes``) is first copied with its dims permuted by ``order``
    (kept dims first, then reduced ones), which makes them one block.
    """
    sizes, reduced = reduce_plan(shape, axes)
    gather = None
    if sum(reduced) > 1:
        order = ([d for d, r in enumerate(reduced) if not r]
                 + [d for d, r in enumerate(reduced) if r])
        gather = (sizes, order)
        kept = len(reduced) - sum(reduced)
        sizes = [math.prod(sizes[d] for d in order[:kept]),
                 math.prod(sizes[d] for d in order[kept:])]
        reduced = [False, True]
    if True not in reduced:
        return gather, (math.prod(sizes), 1, 1)
    j = reduced.index(True)
    return gather, (math.prod(sizes[:j]), sizes[j], math.prod(sizes[j + 1:]))


def rows_cols(shape) -> tuple:
    """``(rows, cols)`` of an array of ``shape`` viewed as 2-D over its last axis (row ops)."""
    shape = tuple(shape)             # the CUDA simulator's shape type has no negative indexing
    return math.prod(shape[:-1]), shape[-1]
