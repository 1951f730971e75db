"""Attention: ``nn.functional.scaled_dot_product_attention`` and the masks, scores and weighted
sums it shares with ``nn.MultiheadAttention`` (``nn/multihead_attention.py``); PyTorch's arguments,
defaults and masks (Vaswani et al., "Attention Is All You Need", 2017).

Both are compositions of OneFlow's ops: ``softmax(q @ k^T * scale + mask) @ v`` is two
``batch_matmul`` (white under AMP) around a ``softmax`` (gray): with AMP on, the scores and the
softmax run in float16, OneFlow's rule, unless the scores are pinned with
``nn.functional.black_identity`` (``amp_black_identity``). A causal mask is ``tril`` with fill
``-inf`` (clear: it keeps the scores' dtype), a boolean mask ``masked_fill`` with ``-inf``, a float
mask is added.

Masks come as NumPy arrays (bool, integer or float), or as miniflow Tensors: bool (eager: read
as data, inside ``nn.Graph.build`` too, as a NumPy bool array) or int64 for a boolean mask (an
integer array or tensor is taken as one, nonzero True: a lazy mask, no graph value being bool),
float for an additive one.
"""
from __future__ import annotations

import math

import numpy as np

from ..dtype import bool_, int64
from ..tensor import Tensor, apply, mask_array, tensor
from .dropout import dropout

__all__ = ["scaled_dot_product_attention"]


def _mask(fn: str, mask, invert: bool = False):
    """``(kind, Tensor)`` of a mask: ``("bool", int64 Tensor, nonzero = masked out)`` or
    ``("float", Tensor)``; None for no mask (a bool tensor is data, as a NumPy bool array).
    ``invert``: a boolean mask given as True = attend (scaled_dot_product_attention's
    convention), turned into True = masked out.

    Raises:
        TypeError: another dtype (PyTorch: "only bool and floating types of masks are
            supported"), a Python scalar (``mask_array``), or a lazy int64 mask to invert.
    """
    if mask is None:
        return None
    if not isinstance(mask, Tensor) or mask.dtype is bool_:
        arr = mask_array(fn, mask)
        if arr.dtype == np.bool_:
            return "bool", tensor((~arr if invert else arr).astype(np.int64))
        if arr.dtype.kind not in "fiu":
            raise TypeError(f"{fn}: only bool and floating types of masks are supported, got an "
                            f"array of {arr.dtype}")
        if arr.dtype.kind == "f":
            return "float", tensor(arr.astype(np.float32))
        mask = tensor(arr.astype(np.int64))         # as an int64 tensor: nonzero is True
    if mask.dtype is int64:
        if invert:
            if mask.is_lazy:
                raise TypeError(f"{fn}: a boolean attn_mask (True = attend) must be data here, "
                                f"not a traced tensor: pass a bool tensor or NumPy array")
            return "bool", tensor((mask.numpy() == 0).astype(np.int64))
        return "bool", mask
    if not mask.dtype.is_float:
        raise TypeError(f"{fn}: only bool and floating types of masks are supported, got "
                        f"{mask.dtype.name}")
    return "float", mask


def _broadcasts(shape: tuple, to: tuple) -> bool:
    """Whether ``shape`` broadcasts to ``to`` (NumPy's rules, the result being ``to``)."""
    try:
        return tuple(np.broadcast_shapes(tuple(shape), tuple(to))) == tuple(to)
    except ValueError:
        return False


def _apply_mask(scores: Tensor, mask) -> Tensor:
    """``scores`` with a ``_mask`` result applied: ``-inf`` where a boolean mask is set, a float
    mask added (cast to the scores' dtype)."""
    if mask is None:
        return scores
    kind, m = mask
    if kind == "bool":
        return apply("masked_fill", [scores, m], value=-math.inf)
    return scores + (m if m.dtype is scores.dtype else m.to(scores.dtype))


def _merged(a, b):
    """One ``_mask`` result of ``_mask`` results ``a`` and ``b`` (either may be None) that
    broadcast together, for :func:`_fully_masked` to see both: boolean where both are (set
    where either is), else float (a boolean mask's set entries ``-inf``, added: PyTorch's merge
    of ``attn_mask`` and ``key_padding_mask``). ``a`` or ``b`` itself where the other is None;
    None where one is traced (its values are not known at build time)."""
    if a is None or b is None:
        return a if b is None else b
    if a[1].is_lazy or b[1].is_lazy:
        return None
    x, y = a[1].numpy(), b[1].numpy()
    if a[0] == b[0] == "bool":
        return "bool", tensor(((x != 0) | (y != 0)).astype(np.int64))
    x, y = (np.where(m != 0, -np.inf, 0.0) if kind == "bool" else m
            for kind, m in ((a[0], x), (b[0], y)))
    return "float", tensor((x + y).astype(np.result_type(x.dtype, y.dtype, np.float32)))


def _fully_masked(mask) -> tuple:
    """``(mask, rows)``: the query rows a mask with values (NumPy data, an eager tensor) takes
    every key from, as an int64 Tensor ``[..., L, 1]`` (``scaled_dot_product_attention`` gives
    them 0, PyTorch's "safe softmax" since 2.5, where a plain softmax of ``-inf`` everywhere is
    NaN, and NaN gradients with it), and the mask with those rows let through (so that their
    softmax is finite before it is zeroed); ``(mask, None)`` where no row is, or for a traced
    mask (its values are not known at build time)."""
    if mask is None or mask[1].is_lazy or 0 in mask[1].shape[-1:]:
        return mask, None
    kind, m = mask
    data = m.numpy()
    out = data != 0 if kind == "bool" else np.isneginf(data)
    rows = out.all(axis=-1, keepdims=True) if out.ndim else out.reshape(1, 1)
    if not rows.any():
        return mask, None
    let_through = (out & ~rows) if kind == "bool" else np.where(rows, 0, data)
    return (kind, tensor(let_through.astype(data.dtype))), tensor(rows.astype(np.int64))


def _scores(q: Tensor, k: Tensor, scale: float) -> Tensor:
    """``q @ k^T * scale`` over the last two dimensions (op ``batch_matmul``, or ``matmul`` for
    2-D operands)."""
    op = "matmul" if q.ndim == 2 else "batch_matmul"
    return apply(op, [q, k], transpose_b=True) * scale


def _weighted(attn: Tensor, v: Tensor) -> Tensor:
    return apply("matmul" if attn.ndim == 2 else "batch_matmul", [attn, v])


def _grouped(x: Tensor, lead: tuple) -> Tensor:
    """``x [*, Hq, L, D]`` as ``[*, H, (Hq / H) * L, D]`` for a key or value of leading
    dimensions ``lead = (*, H)`` (grouped-query attention: the ``Hq / H`` query heads that share
    a key / value head, consecutive, as one operand; op ``reshape``), and back (``lead = (*,
    Hq)``); ``x`` itself where ``lead`` is ``x``'s."""
    if tuple(lead) == tuple(x.shape[:-2]):
        return x
    return x.reshape(tuple(lead) + (-1, x.shape[-1]))


def _broadcast_leading(tensors: tuple, heads: int) -> tuple | None:
    """The tensors expanded to one broadcast shape of their dimensions before the last ``heads``
    (PyTorch's batch broadcasting: a key and value of batch 1 serve every query; op ``expand``
    through :meth:`Tensor.expand`, its gradient summing over the batch), or
    None where those dimensions do not broadcast."""
    try:
        lead = tuple(np.broadcast_shapes(*(t.shape[:-heads] for t in tensors)))
    except ValueError:
        return None
    return tuple(t if t.shape[:-heads] == lead else t.expand(lead + t.shape[-heads:])
                 for t in tensors)


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask=None,
                                 dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: float | None = None, enable_gqa: bool = False) -> Tensor:
    """``softmax(query @ key^T * scale + mask) @ value``
    (``torch.nn.functional.scaled_dot_product_attention``): ``query [*, L, E]``, ``key [*, S,
    E]``, ``value [*, S, Ev]`` -> ``[*, L, Ev]``, the leading dimensions ``*`` broadcast
    together (NumPy's rules, PyTorch's); ``scale`` defaults to ``1 / sqrt(E)``.

    ``attn_mask``: boolean (True = take part in attention, PyTorch's convention here; an
    integer array or int64 tensor is one, nonzero True) or float (added to the scores),
    broadcastable to ``[*, L, S]``. A query row the mask (NumPy data or
    an eager tensor) takes every key from gives 0, with a zero gradient (PyTorch >= 2.5); with a
    mask traced in ``build`` (values unknown there) it gives NaN, as a plain softmax.
    ``is_causal``: the lower-triangular
    mask (``j <= i``, top-left aligned as PyTorch's), op ``tril`` with fill ``-inf``.
    ``dropout_p``: dropout on the attention weights (the process's dropout stream, see
    ``nn.functional.dropout``).
    ``enable_gqa``: grouped-query attention (PyTorch's): ``query [*, Hq, L, E]``, ``key [*, Hk,
    S, E]``, ``value [*, Hv, S, Ev]`` with ``Hk`` and ``Hv`` dividing ``Hq``, query head ``i``
    attending with key head ``i // (Hq / Hk)`` and value head ``i // (Hq / Hv)`` (PyTorch's
    ``repeat_interleave``; here the query heads of a key head are reshaped into one ``[G * L,
    E]`` operand, op ``reshape``, so nothing is repeated) -> ``[*, Hq, L, Ev]``.

    Raises:
        ValueError: shapes that do not fit (an ``attn_mask`` that does not broadcast to ``[*, L,
            S]`` included; with ``enable_gqa``, inputs of rank < 3 or key / value heads that do
            not divide the query's), or ``attn_mask`` together with ``is_causal`` (PyTorch
            refuses both). TypeError: a mask of another dtype.
    """
    fn = "scaled_dot_product_attention"
    got = f"{list(query.shape)}, {list(key.shape)}, {list(value.shape)}"
    if min(query.ndim, key.ndim, value.ndim) < 2:
        raise ValueError(f"{fn}: query, key and value must have rank >= 2, got {got}")
    heads = 3 if enable_gqa else 2     # the trailing dimensions that may differ
    if enable_gqa and min(query.ndim, key.ndim, value.ndim) < 3:
        raise ValueError(f"{fn}: enable_gqa needs query, key and value of rank >= 3 ([*, H, L, "
                         f"E]), got {got}")
    joined = _broadcast_leading((query, key, value), heads)
    if joined is None or query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        hint = ("; for grouped-query attention (fewer key / value heads, dimension -3) pass "
                "enable_gqa=True" if not enable_gqa and query.ndim >= 3
                and query.shape[:-3] == key.shape[:-3] == value.shape[:-3] else "")
        raise ValueError(f"{fn}: expected query [*, L, E], key [*, S, E], value [*, S, Ev] with "
                         f"leading dimensions that broadcast together, got {got}{hint}")
    query, key, value = joined
    if enable_gqa and (query.shape[-3] % key.shape[-3] or query.shape[-3] % value.shape[-3]):
        raise ValueError(f"{fn}: enable_gqa: the number of heads of key ({key.shape[-3]}) and "
                         f"value ({value.shape[-3]}) must divide the number of heads of query "
                         f"({query.shape[-3]}) (PyTorch's rule); got {got}")
    if is_causal and attn_mask is not None:
        raise ValueError(f"{fn}: Explicit attn_mask should not be set when is_causal=True")
    mask = _mask(fn, attn_mask, invert=True)
    scores_shape = tuple(query.shape[:-1]) + (key.shape[-2],)
    if mask is not None and not _broadcasts(mask[1].shape, scores_shape):
        raise ValueError(f"{fn}: attn_mask of shape {list(mask[1].shape)} does not broadcast to "
                         f"the attention scores [*, L, S] = {list(scores_shape)}; give it the "
                         f"shape [L, S] = {list(scores_shape[-2:])} or [*, L, S]")
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    scores = _grouped(_scores(_grouped(query, key.shape[:-2]), key, scale), scores_shape[:-2])
    if is_causal:
        scores = apply("tril", [scores], diagonal=0, fill_value=-math.inf)
    mask, rows = _fully_masked(mask)
    scores = _apply_mask(scores, mask)
    attn = apply("softmax", [scores])
    if rows is not None:                # PyTorch's 0 for a query that may attend to no key
        attn = apply("masked_fill", [attn, rows], value=0.0)
    if dropout_p > 0.0:
        attn = dropout(attn, dropout_p)
    return _grouped(_weighted(_grouped(attn, value.shape[:-2]), value), query.shape[:-2])
