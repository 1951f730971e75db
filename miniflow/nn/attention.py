"""Attention: ``nn.MultiheadAttention`` and ``nn.functional.scaled_dot_product_attention``
(PyTorch's arguments, defaults, masks and state-dict keys: ``in_proj_weight``, ``in_proj_bias``,
``out_proj.weight``, ``out_proj.bias``; Vaswani et al., "Attention Is All You Need", 2017).

Both are compositions of OneFlow's ops: ``softmax(q @ k^T * scale + mask) @ v`` is two
``batch_matmul`` (white under AMP) around a ``softmax`` (gray): with AMP on, the scores and the
softmax run in float16, OneFlow's rule, unless the scores are pinned with
``nn.functional.black_identity`` (``amp_black_identity``). A causal mask is ``tril`` with fill
``-inf`` (clear: it keeps the scores' dtype), a boolean mask ``masked_fill`` with ``-inf``, a float
mask is added.

Masks come as NumPy arrays (bool or float), or as miniflow Tensors: int64 for a boolean mask
(miniflow has no bool dtype), float for an additive one.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ..dtype import int64
from ..random import generator
from ..tensor import Tensor, apply, tensor
from .dropout import dropout, dropout_state
from .layers import Linear
from .module import Module, Parameter

__all__ = ["MultiheadAttention", "scaled_dot_product_attention"]


def _mask(fn: str, mask, invert: bool = False):
    """``(kind, Tensor)`` of a mask: ``("bool", int64 Tensor, nonzero = masked out)`` or
    ``("float", Tensor)``; None for no mask. ``invert``: a boolean mask given as True = attend
    (scaled_dot_product_attention's convention), turned into True = masked out.

    Raises:
        TypeError: another dtype (PyTorch: "only bool and floating types of masks are
            supported"), or a lazy int64 mask to invert.
    """
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        arr = np.asarray(mask)
        if arr.dtype == np.bool_:
            return "bool", tensor((~arr if invert else arr).astype(np.int64))
        if arr.dtype.kind != "f":
            raise TypeError(f"{fn}: only bool and floating types of masks are supported, got an "
                            f"array of {arr.dtype}")
        return "float", tensor(arr.astype(np.float32))
    if mask.dtype is int64:
        if invert:
            if mask.is_lazy:
                raise TypeError(f"{fn}: a boolean attn_mask (True = attend) must be data here, "
                                f"not a traced tensor: pass a NumPy bool array")
            return "bool", tensor((mask.numpy() == 0).astype(np.int64))
        return "bool", mask
    if not mask.dtype.is_float:
        raise TypeError(f"{fn}: only bool and floating types of masks are supported, got "
                        f"{mask.dtype.name}")
    return "float", mask


def _apply_mask(scores: Tensor, mask) -> Tensor:
    """``scores`` with a ``_mask`` result applied: ``-inf`` where a boolean mask is set, a float
    mask added (cast to the scores' dtype)."""
    if mask is None:
        return scores
    kind, m = mask
    if kind == "bool":
        return apply("masked_fill", [scores, m], value=-math.inf)
    return scores + (m if m.dtype is scores.dtype else m.to(scores.dtype))


def _scores(q: Tensor, k: Tensor, scale: float) -> Tensor:
    """``q @ k^T * scale`` over the last two dimensions (op ``batch_matmul``, or ``matmul`` for
    2-D operands)."""
    op = "matmul" if q.ndim == 2 else "batch_matmul"
    return apply(op, [q, k], transpose_b=True) * scale


def _weighted(attn: Tensor, v: Tensor) -> Tensor:
    return apply("matmul" if attn.ndim == 2 else "batch_matmul", [attn, v])


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask=None,
                                 dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: float | None = None) -> Tensor:
    """``softmax(query @ key^T * scale + mask) @ value``
    (``torch.nn.functional.scaled_dot_product_attention``): ``query [*, L, E]``, ``key [*, S,
    E]``, ``value [*, S, Ev]`` with equal leading dimensions -> ``[*, L, Ev]``; ``scale``
    defaults to ``1 / sqrt(E)``.

    ``attn_mask``: boolean (True = take part in attention, PyTorch's convention here) or float
    (added to the scores), broadcastable to ``[*, L, S]``. ``is_causal``: the lower-triangular
    mask (``j <= i``, top-left aligned as PyTorch's), op ``tril`` with fill ``-inf``.
    ``dropout_p``: dropout on the attention weights (the process's dropout stream; inside
    ``nn.Graph`` an ``nn.Dropout`` of the model must bind it, see ``nn.functional.dropout``).

    Raises:
        ValueError: shapes that do not fit, or ``attn_mask`` together with ``is_causal``
            (PyTorch refuses both). TypeError: a mask of another dtype.
    """
    fn = "scaled_dot_product_attention"
    if query.ndim < 2 or key.ndim != query.ndim or value.ndim != query.ndim:
        raise ValueError(f"{fn}: query, key and value must have one rank >= 2, got "
                         f"{list(query.shape)}, {list(key.shape)}, {list(value.shape)}")
    if (query.shape[:-2] != key.shape[:-2] or key.shape[:-2] != value.shape[:-2]
            or query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]):
        raise ValueError(f"{fn}: expected query [*, L, E], key [*, S, E], value [*, S, Ev] with "
                         f"equal leading dimensions, got {list(query.shape)}, "
                         f"{list(key.shape)}, {list(value.shape)}")
    if is_causal and attn_mask is not None:
        raise ValueError(f"{fn}: Explicit attn_mask should not be set when is_causal=True")
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    scores = _scores(query, key, scale)
    if is_causal:
        scores = apply("tril", [scores], diagonal=0, fill_value=-math.inf)
    scores = _apply_mask(scores, _mask(fn, attn_mask, invert=True))
    attn = apply("softmax", [scores])
    if dropout_p > 0.0:
        attn = dropout(attn, dropout_p)
    return _weighted(attn, value)


def _heads(x: Tensor, n: int, heads: int, length: int) -> Tensor:
    """``[N, L, E]`` -> ``[N, heads, L, E / heads]`` (ops ``reshape``, ``transpose``)."""
    x = x.reshape(n, length, heads, x.shape[-1] // heads)
    return apply("transpose", [x], perm=(0, 2, 1, 3))


class MultiheadAttention(Module):
    """Multi-head attention (``torch.nn.MultiheadAttention``): ``forward(query, key, value)`` ->
    ``(attn_output, attn_weights)``.

    Args:
        embed_dim: E, the model dimension; num_heads: H, with ``E % H == 0`` (head size E / H).
        dropout: dropout on the attention weights in training mode (0.0).
        bias: learn ``in_proj_bias`` and ``out_proj.bias`` (zeros).
        batch_first: inputs and output ``[N, L, E]`` (True) or ``[L, N, E]`` (PyTorch's default
            False).

    Parameters (PyTorch's names and initialisation): ``in_proj_weight [3E, E]`` (Xavier uniform;
    rows ``q``, ``k``, ``v``), ``in_proj_bias [3E]``, ``out_proj`` a ``Linear(E, E)``.

    Raises:
        ValueError: ``embed_dim`` not divisible by ``num_heads`` (PyTorch's message, with the
            values), or a size that is not a positive integer.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 batch_first: bool = False):
        super().__init__()
        for name, v in (("embed_dim", embed_dim), ("num_heads", num_heads)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0:
                raise ValueError(f"MultiheadAttention: {name} must be a positive integer, got "
                                 f"{v!r}")
        if embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim must be divisible by num_heads, got "
                             f"embed_dim={embed_dim} and num_heads={num_heads}")
        if not 0.0 <= float(dropout) <= 1.0:
            raise ValueError(f"MultiheadAttention: dropout must be in [0, 1], got {dropout!r}")
        e = int(embed_dim)
        self.embed_dim, self.num_heads, self.head_dim = e, int(num_heads), e // int(num_heads)
        self.dropout, self.batch_first = float(dropout), bool(batch_first)
        bound = math.sqrt(6.0 / (e + 3 * e))                   # xavier_uniform_ of [3E, E]
        self.in_proj_weight = Parameter(generator().uniform(-bound, bound, (3 * e, e))
                                        .astype(np.float32))
        self.in_proj_bias = Parameter(np.zeros(3 * e, np.float32)) if bias else None
        self.out_proj = Linear(e, e, bias=bias)
        if bias:
            self.out_proj.bias = Parameter(np.zeros(e, np.float32))
        self.register_buffer("rng_state", dropout_state(), persistent=False)

    def _project(self, x: Tensor, k: int) -> Tensor:
        """Input projection ``k`` (0: q, 1: k, 2: v) of ``x [N, L, E]``."""
        e = self.embed_dim
        w = self.in_proj_weight[k * e:(k + 1) * e]
        b = None if self.in_proj_bias is None else self.in_proj_bias[k * e:(k + 1) * e]
        y = apply("matmul", [x.reshape(-1, e), w], transpose_b=True)
        if b is not None:
            y = apply("bias_add", [y, b], axis=1)
        return y.reshape(x.shape)

    def _check(self, query, key, value, attn_mask, key_padding_mask):
        fn = "MultiheadAttention"
        for name, t in (("query", query), ("key", key), ("value", value)):
            if t.ndim != 3:
                raise ValueError(f"{fn}: {name} must be batched 3-D ([N, L, E] with batch_first, "
                                 f"else [L, N, E]), got shape {list(t.shape)}")
            if t.shape[-1] != self.embed_dim:
                raise ValueError(f"{fn}: was expecting embedding dimension of "
                                 f"{self.embed_dim}, but got {t.shape[-1]} ({name})")
        if key.shape != value.shape:
            raise ValueError(f"{fn}: key shape {list(key.shape)} does not match value shape "
                             f"{list(value.shape)}")
        n = query.shape[0 if self.batch_first else 1]
        length = query.shape[1 if self.batch_first else 0]
        src = key.shape[1 if self.batch_first else 0]
        if key.shape[0 if self.batch_first else 1] != n:
            raise ValueError(f"{fn}: query and key have different batch sizes: "
                             f"{list(query.shape)} and {list(key.shape)}")
        if attn_mask is not None:
            shape = tuple(np.shape(attn_mask) if not isinstance(attn_mask, Tensor)
                          else attn_mask.shape)
            want = {2: (length, src), 3: (n * self.num_heads, length, src)}.get(len(shape))
            if want is None:
                raise ValueError(f"{fn}: attn_mask's dimension {len(shape)} is not supported "
                                 f"(2-D [L, S] or 3-D [N * num_heads, L, S])")
            if shape != want:
                raise ValueError(f"{fn}: The shape of the {len(shape)}D attn_mask is "
                                 f"{list(shape)}, but should be {list(want)}.")
        if key_padding_mask is not None:
            shape = tuple(np.shape(key_padding_mask) if not isinstance(key_padding_mask, Tensor)
                          else key_padding_mask.shape)
            if shape != (n, src):
                raise ValueError(f"{fn}: expected key_padding_mask of shape {[n, src]} "
                                 f"([N, S]), got {list(shape)}")
        return n, length, src

    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = True,
                attn_mask=None, average_attn_weights: bool = True, is_causal: bool = False):
        """``attn_output [N, L, E]`` (``[L, N, E]`` unless ``batch_first``) and ``attn_weights``
        ``[N, L, S]`` (averaged over heads) or ``[N, H, L, S]`` (``average_attn_weights=False``),
        None without ``need_weights``. Masks (PyTorch's conventions): ``attn_mask`` ``[L, S]`` or
        ``[N * H, L, S]``, bool (True = not allowed) or float (added); ``key_padding_mask``
        ``[N, S]`` (True = ignore that key); ``is_causal`` is a hint that ``attn_mask`` is the
        causal mask (which it then must be given, as PyTorch).

        Raises:
            ValueError: shapes that do not fit (PyTorch's messages), ``is_causal`` without
                ``attn_mask``. TypeError: a mask of another dtype.
        """
        n, length, src = self._check(query, key, value, attn_mask, key_padding_mask)
        if is_causal and attn_mask is None:
            raise ValueError("MultiheadAttention: Need attn_mask if specifying the is_causal "
                             "hint (pass the causal mask, e.g. np.triu(np.ones((L, L), bool), 1))")
        if not self.batch_first:
            query, key, value = (apply("transpose", [t], perm=(1, 0, 2))
                                 for t in (query, key, value))
        h, d = self.num_heads, self.head_dim
        q = _heads(self._project(query, 0), n, h, length)
        k = _heads(self._project(key, 1), n, h, src)
        v = _heads(self._project(value, 2), n, h, src)
        scores = _scores(q, k, 1.0 / math.sqrt(d))              # [N, H, L, S]
        mask = _mask("MultiheadAttention", attn_mask)
        if mask is not None and mask[1].ndim == 3:
            mask = (mask[0], mask[1].reshape(n, h, length, src))
        scores = _apply_mask(scores, mask)
        pad = _mask("MultiheadAttention", key_padding_mask)
        if pad is not None:
            scores = _apply_mask(scores, (pad[0], pad[1].reshape(n, 1, 1, src)))
        attn = apply("softmax", [scores])
        if self.training and self.dropout > 0.0:
            attn = dropout(attn, self.dropout)
        out = apply("transpose", [_weighted(attn, v)], perm=(0, 2, 1, 3))
        out = self.out_proj(out.reshape(n, length, self.embed_dim))
        if not self.batch_first:
            out = apply("transpose", [out], perm=(1, 0, 2))
        if not need_weights:
            return out, None
        if average_attn_weights:
            attn = apply("reduce_sum", [attn], axis=(1,), keepdims=False) * (1.0 / h)
        return out, attn

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"dropout={self.dropout}, batch_first={self.batch_first}")
