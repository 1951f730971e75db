"""The builders of the indexing ops on every backend (``gather``, ``unsorted_segment_sum_like``,
``dim_gather``, ``dim_scatter_add_like``, ``dim_scatter_add``, ``dim_scatter_update``,
``dim_scatter_update_scalar``, ``slice``, ``slice_grad``, ``slice_update``, ``cat``, ``tril``,
``masked_fill``, and the one-axis reductions ``reduce_max``, ``argmax``, ``reduce_max_grad``,
``top_k``), and the scans ``cumsum`` / ``cumsum_grad`` and ``cumprod`` / ``cumprod_grad``, over
the backend's step makers: the layouts are planned here once (``[outer, n, inner]`` around the
gather axis, the C strides around ``dim`` of ``dim_gather`` (:func:`dim_layout`), the slice's
element offset and strides, the mask's broadcast strides), the loops are the backend's."""
from __future__ import annotations

from ...ops.indexing import cat_slices, slice_index
from .layout import broadcast_plan

__all__ = ["builders", "around", "dim_layout", "slice_layout", "top_k_before", "top_k_sort",
           "TOP_K_INSERTION_MAX"]

TOP_K_INSERTION_MAX = 16
"""The largest ``k`` for which ``top_k`` inserts each element into the row's sorted k best
(``O(n k)`` comparisons at worst, about one an element on random values); a larger ``k`` sorts
the whole row (:func:`top_k_sort`, ``O(n log n)``). A [64, 4096] float32 ``top_k`` on one core of
an AMD EPYC (CPU kernels, median of 11; insertion / sort): k 16 0.45 / 46 ms on random values,
4.9 / 6.1 ms on rows in ascending order (the insertion's worst case, each element shifted
through all k: k 32 9.7 / 6.1 ms, k 64 21 / 6.1 ms); the sort of the whole row 50 ms where the
insertion took 437 ms (random) to 553 ms (ties)."""
_RUN = 16
"""The length of the runs :func:`top_k_sort` sorts by insertion before it merges."""


def _prod(dims) -> int:
    out = 1
    for d in dims:
        out *= int(d)
    return out


def around(shape, axis: int) -> tuple:
    """``(outer, n, inner)`` of ``shape`` around ``axis``."""
    return _prod(shape[:axis]), int(shape[axis]), _prod(shape[axis + 1:])


def top_k_before(v, w, largest):
    """Whether element ``v`` goes before ``w`` in ``top_k``'s order: larger (``largest`` False:
    smaller), NaN above every number, so that equal elements keep their order. The scalar body
    both backends' ``top_k`` kernels compile (NumPy's ``top_k_reference`` sorts the same)."""
    if largest:
        return v > w or (v != v and w == w)
    return v < w or (w != w and v == v)


def top_k_sort(v, a, b, out, base, first, n, k, largest):
    """``out[first:first + k]`` = the positions of the ``k`` best of the row ``v[base:base + n]``
    in ``top_k``'s order (:func:`top_k_before`; equal elements in index order): a stable merge
    sort of the positions, runs of :data:`_RUN` sorted by insertion, then merged pairwise between
    ``a`` and ``b`` (int64 scratch, their elements ``[base, base + n)`` used), ``O(n log n)``
    comparisons. Any stable sort under this strict weak order gives the same positions, so the
    result is ``top_k_reference``'s. The body both backends' ``top_k`` kernels compile for a
    large ``k`` (``v`` the row's values in the compute type)."""
    for s in range(0, n, _RUN):
        for j in range(s, min(s + _RUN, n)):
            p = j
            while p > s and top_k_before(v[base + j], v[base + a[base + p - 1]], largest):
                a[base + p] = a[base + p - 1]
                p -= 1
            a[base + p] = j
    width, flip = _RUN, False
    while width < n:
        src, dst = (b, a) if flip else (a, b)
        for lo in range(0, n, 2 * width):
            mid, hi = min(lo + width, n), min(lo + 2 * width, n)
            i, j = lo, mid
            for t in range(lo, hi):
                if j < hi and (i == mid or top_k_before(v[base + src[base + j]],
                                                       v[base + src[base + i]], largest)):
                    dst[base + t] = src[base + j]
                    j += 1
                else:
                    dst[base + t] = src[base + i]
                    i += 1
        width, flip = 2 * width, not flip
    src = b if flip else a
    for t in range(k):
        out[first + t] = src[base + t]


def dim_layout(shape, dim: int) -> tuple:
    """``(shape, strides, dim_stride)`` of a C-contiguous array of ``shape`` around axis ``dim``:
    the shape as ints (a 0-d one as ``(1,)``), its element strides with ``dim``'s set to 0, and
    ``dim``'s own stride: element ``c`` (a multi-index) sits at ``c . strides + c[dim] *
    dim_stride``, so a kernel of ``dim_gather`` swaps ``c[dim]`` for an index value."""
    shape = tuple(int(d) for d in shape) or (1,)
    strides, acc = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        strides[d] = acc
        acc *= shape[d]
    dim_stride = strides[dim]
    strides[dim] = 0
    return shape, tuple(strides), dim_stride


def slice_layout(shape, attrs) -> tuple:
    """``(offset, strides)``: the element offset of the slice's first element in a C-contiguous
    array of ``shape``, and the element strides of the slice's axes (C strides times the steps)."""
    strides, acc = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        strides[d] = acc
        acc *= int(shape[d])
    offset = sum(a * s for a, s in zip(attrs["start"], strides))
    return offset, tuple(s * k for s, k in zip(strides, attrs["step"]))


def builders(*, gather_steps, segment_sum_steps, dim_gather_steps, dim_scatter_steps,
             slice_steps, slice_grad_steps, scatter_steps, copy_steps,
             tril_steps, masked_fill_steps, max_steps, max_grad_steps, top_k_steps,
             cumsum_steps, cumprod_steps, cumprod_grad_steps) -> dict:
    """Op type -> builder of the indexing ops, over a backend's step makers:

    * ``gather_steps(x, indices, out, outer, n, inner)``: ``out[o, j, i] = x[o, indices[j], i]``;
    * ``segment_sum_steps(data, ids, out, outer, n, inner)``: ``out[o, s, i] = sum over j with
      ids[j] == s of data[o, j, i]``;
    * ``dim_gather_steps(x, index, out, dim)``: ``out[c] = x[c with c[dim] = index[c]]`` for
      every multi-index ``c`` of index's shape (out's); ``dim_scatter_steps(x, src, index, out,
      dim, add)``: ``out = x`` (``x`` None: ``out = 0``, and indices out of range are dropped,
      not an error), then for every ``c`` in C order ``out[c with c[dim] = index[c]] += src[c]``
      (``add``) or ``= src[c]`` (the last write wins); ``src`` an array of index's shape or a
      float for every place (:func:`dim_layout` gives the strides); neither is called for an
      empty out;
    * ``slice_steps(x, out, index, offset, strides)`` and ``slice_grad_steps(dy, dx, index,
      offset, strides)``: ``index`` the tuple of Python slices, ``offset`` / ``strides`` in
      elements of ``x`` / ``dx`` (:func:`slice_layout`), whichever the backend uses;
      ``scatter_steps(src, dst, index, offset, strides)``: ``dst[index] = src``, nothing else
      written (``cat``: one per input; ``slice_update``: after ``copy_steps``, the movement
      family's flat copy ``out = ref``);
    * ``tril_steps(x, out, rows, cols, diagonal, fill_value)``;
    * ``masked_fill_steps(x, mask, out, shape, mask_strides, value)``: the broadcast collapsed
      (``layout.broadcast_plan``);
    * ``max_steps(x, out, outer, n, inner, arg)``: ``out[o, i]`` = the maximum (``arg``: its
      index) of ``x[o, :, i]``; ``max_grad_steps(x, y, dy, dx, outer, n, inner)``;
    * ``top_k_steps(x, out, rows, n, k, largest)``: ``out[r, :]`` = the indices of the ``k``
      best of ``x[r, :]`` (rows of ``n``), best first (not called for an empty out);
    * ``cumsum_steps(x, out, outer, n, inner, reverse)``: ``out[o, j, i]`` = the sum of
      ``x[o, :j+1, i]`` (``reverse``, ``cumsum_grad``: of ``x[o, j:, i]``);
      ``cumprod_steps(x, out, outer, n, inner)``: the product of ``x[o, :j+1, i]``;
      ``cumprod_grad_steps(dy, x, dx, outer, n, inner)``: its gradient (``ops.reduce_max``
      says how); none is called for an empty out.
    """
    def gather(node, ins, outs):
        """``out = x`` indexed by ``indices`` along ``axis``."""
        x, idx = ins
        return gather_steps(x, idx, outs[0], *around(x.shape, node.attrs["axis"]))

    def unsorted_segment_sum_like(node, ins, outs):
        """``out = 0``, then ``data`` summed at ``segment_ids`` along ``axis``."""
        data, ids, _ = ins
        return segment_sum_steps(data, ids, outs[0], *around(outs[0].shape, node.attrs["axis"]))

    def dim_gather(node, ins, outs):
        """``out = input`` indexed along ``dim`` by ``index`` (``torch.gather``)."""
        if outs[0].size == 0:
            return []
        return dim_gather_steps(ins[0], ins[1], outs[0], node.attrs["dim"])

    def dim_scatter(like: bool, add: bool):
        def build(node, ins, outs):
            """``out = input`` (0 for ``dim_scatter_add_like``), then ``src`` (or
            ``src_scalar``) added or written at ``index`` along ``dim``."""
            if outs[0].size == 0:
                return []
            src = ins[2] if len(ins) == 3 else node.attrs["src_scalar"]
            return dim_scatter_steps(None if like else ins[0], src, ins[1], outs[0],
                                     node.attrs["dim"], add)
        return build

    def slice_(node, ins, outs):
        """``out = x[start:stop:step, ...]``."""
        return slice_steps(ins[0], outs[0], slice_index(node.attrs),
                           *slice_layout(ins[0].shape, node.attrs))

    def slice_grad(node, ins, outs):
        """``dx = 0``, then ``dx[start:stop:step, ...] = dy``."""
        return slice_grad_steps(ins[0], outs[0], slice_index(node.attrs),
                                *slice_layout(outs[0].shape, node.attrs))

    def slice_update(node, ins, outs):
        """``out = ref``, then ``out[start:stop:step, ...] = value``."""
        if outs[0].size == 0:
            return []
        return (copy_steps(ins[:1], outs, (), node.attrs)
                + scatter_steps(ins[1], outs[0], slice_index(node.attrs),
                                *slice_layout(outs[0].shape, node.attrs)))

    def cat(node, ins, outs):
        """``out[..., a_i:b_i, ...] = x_i`` along ``axis``, for every input."""
        steps = []
        for x, attrs in zip(ins, cat_slices([x.shape for x in ins], node.attrs["axis"])):
            steps += scatter_steps(x, outs[0], slice_index(attrs),
                                   *slice_layout(outs[0].shape, attrs))
        return steps

    def tril(node, ins, outs):
        """``out = x`` where ``col - row <= diagonal``, else ``fill_value``."""
        rows, cols = (int(d) for d in ins[0].shape[-2:])
        return tril_steps(ins[0], outs[0], rows, cols, node.attrs["diagonal"],
                          node.attrs["fill_value"])

    def masked_fill(node, ins, outs):
        """``out = value`` where ``mask`` (broadcast) is nonzero, else ``x``."""
        plan = broadcast_plan(outs[0].shape, ins[1].shape)
        if plan is None:
            return []
        shape, (mst,) = plan
        return masked_fill_steps(ins[0], ins[1], outs[0], tuple(int(s) for s in shape),
                                 tuple(int(s) for s in mst), node.attrs["value"])

    def reduce_max(node, ins, outs):
        """``out`` = the maximum of ``x`` along ``axis``."""
        if outs[0].size == 0:
            return []
        return max_steps(ins[0], outs[0], *around(ins[0].shape, node.attrs["axis"]), False)

    def argmax(node, ins, outs):
        """``out`` = the index of the first maximum of ``x`` along ``axis``."""
        if outs[0].size == 0:
            return []
        return max_steps(ins[0], outs[0], *around(ins[0].shape, node.attrs["axis"]), True)

    def reduce_max_grad(node, ins, outs):
        """``dx`` = ``dy`` shared by the maxima of ``x`` along ``axis``."""
        if outs[0].size == 0:
            return []
        return max_grad_steps(*ins, outs[0], *around(ins[0].shape, node.attrs["axis"]))

    def cumsum(node, ins, outs):
        """``out`` = the running sum of ``x`` along ``dim``."""
        if outs[0].size == 0:
            return []
        return cumsum_steps(ins[0], outs[0], *around(ins[0].shape, node.attrs["dim"]),
                            node.op.name == "cumsum_grad")

    def cumprod(node, ins, outs):
        """``out`` = the running product of ``x`` along ``dim``."""
        if outs[0].size == 0:
            return []
        return cumprod_steps(ins[0], outs[0], *around(ins[0].shape, node.attrs["dim"]))

    def cumprod_grad(node, ins, outs):
        """``dx`` of ``cumprod`` from ``dy`` and ``x``."""
        if outs[0].size == 0:
            return []
        return cumprod_grad_steps(*ins, outs[0], *around(ins[0].shape, node.attrs["dim"]))

    def top_k(node, ins, outs):
        """``out`` = the indices of the ``k`` best of ``x`` along its last axis."""
        if outs[0].size == 0:
            return []
        n = int(node.inputs[0].shape[-1])       # (a device array's shape takes no -1)
        return top_k_steps(ins[0], outs[0], ins[0].size // n, n, node.attrs["k"],
                           node.attrs["largest"])

    return {"gather": gather, "unsorted_segment_sum_like": unsorted_segment_sum_like,
            "dim_gather": dim_gather, "dim_scatter_add_like": dim_scatter(True, True),
            "dim_scatter_add": dim_scatter(False, True),
            "dim_scatter_update": dim_scatter(False, False),
            "dim_scatter_update_scalar": dim_scatter(False, False),
            "slice": slice_, "slice_grad": slice_grad, "slice_update": slice_update, "cat": cat,
            "tril": tril, "masked_fill": masked_fill,
            "reduce_max": reduce_max, "argmax": argmax, "reduce_max_grad": reduce_max_grad,
            "top_k": top_k, "cumsum": cumsum, "cumsum_grad": cumsum, "cumprod": cumprod,
            "cumprod_grad": cumprod_grad}
