"""``nn.MultiheadAttention`` (PyTorch's arguments, defaults, masks and state-dict keys:
``in_proj_weight``, ``in_proj_bias``, ``out_proj.weight``, ``out_proj.bias``; Vaswani et al.,
"Attention Is All You Need", 2017) over the masks, scores and weighted sums of
``nn/attention.py`` (kept apart so that ``nn.functional``, which ``nn.Linear`` uses, need not
import the layers).
"""
from __future__ import annotations

import math

import numpy as np

from ..checks import positive_integer
from ..random import generator
from ..tensor import Tensor, apply, tensor
from .attention import _apply_mask, _fully_masked, _mask, _merged, _scores, _weighted
from .dropout import dropout, dropout_state
from .layers import Linear
from .factory import param_dtype
from .module import Module, Parameter

__all__ = ["MultiheadAttention"]


def _heads(x: Tensor, n: int, heads: int, length: int) -> Tensor:
    """``[N, L, E]`` -> ``[N, heads, L, E / heads]`` (ops ``reshape``, ``transpose``)."""
    x = x.reshape(n, length, heads, x.shape[-1] // heads)
    return apply("transpose", [x], perm=(0, 2, 1, 3))


def _reshaped(mask: tuple, shape: tuple) -> tuple:
    """A ``_mask`` result reshaped to ``shape``: data stays data (reshaped on the host, where a
    reshape inside ``nn.Graph.build`` would make it a traced value, whose values
    ``_fully_masked`` cannot see), a traced mask is reshaped in the graph (op ``reshape``)."""
    kind, m = mask
    return kind, (m.reshape(shape) if m.is_lazy else tensor(m.numpy().reshape(shape)))


class MultiheadAttention(Module):
    """Multi-head attention (``torch.nn.MultiheadAttention``): ``forward(query, key, value)`` ->
    ``(attn_output, attn_weights)``.

    Args:
        embed_dim: E, the model dimension; num_heads: H, with ``E % H == 0`` (head size E / H).
        dropout: dropout on the attention weights in training mode (0.0).
        bias: learn ``in_proj_bias`` and ``out_proj.bias`` (zeros).
        batch_first: inputs and output ``[N, L, E]`` (True) or ``[L, N, E]`` (PyTorch's default
            False).
        kdim, vdim: the feature sizes of ``key`` and ``value`` (None: ``embed_dim``).
        add_bias_kv, add_zero_attn: PyTorch's, taken at their default False only.
        device, dtype: PyTorch's factory keywords (``nn.factory.param_dtype``).

    The positional order is PyTorch's: ``(embed_dim, num_heads, dropout, bias, add_bias_kv,
    add_zero_attn, kdim, vdim, batch_first, device, dtype)``.

    Parameters (PyTorch's names and initialisation): ``in_proj_weight [3E, E]`` (Xavier uniform;
    rows ``q``, ``k``, ``v``), or where ``kdim`` or ``vdim`` is not E, ``q_proj_weight [E, E]``,
    ``k_proj_weight [E, kdim]`` and ``v_proj_weight [E, vdim]`` (each Xavier uniform;
    ``in_proj_weight`` is None); ``in_proj_bias [3E]``, ``out_proj`` a ``Linear(E, E)``.

    Raises:
        ValueError: ``embed_dim`` not divisible by ``num_heads`` (PyTorch's message, with the
            values), a size that is not a positive integer, ``add_bias_kv`` or
            ``add_zero_attn`` True, a device other than the process's.
        TypeError: a dtype that is not a floating dtype of miniflow.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False, device=None, dtype=None):
        super().__init__()
        dt = param_dtype("MultiheadAttention", device, dtype)
        for name, v in (("embed_dim", embed_dim), ("num_heads", num_heads)):
            positive_integer("MultiheadAttention", name, v)
        for name, v in (("add_bias_kv", add_bias_kv), ("add_zero_attn", add_zero_attn)):
            if v:
                raise ValueError(f"MultiheadAttention: {name}={v!r} is not supported (only "
                                 f"PyTorch's default {name}=False); leave it out (PyTorch's "
                                 f"positional order puts it before kdim, vdim and batch_first: "
                                 f"give those by keyword)")
        kdim, vdim = (embed_dim if d is None else positive_integer("MultiheadAttention", name, d)
                      for name, d in (("kdim", kdim), ("vdim", vdim)))
        if embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim must be divisible by num_heads, got "
                             f"embed_dim={embed_dim} and num_heads={num_heads}")
        if not 0.0 <= float(dropout) <= 1.0:
            raise ValueError(f"MultiheadAttention: dropout must be in [0, 1], got {dropout!r}")
        e = int(embed_dim)
        self.embed_dim, self.num_heads, self.head_dim = e, int(num_heads), e // int(num_heads)
        self.dropout, self.batch_first = float(dropout), bool(batch_first)
        self.kdim, self.vdim = kdim, vdim
        if kdim == e and vdim == e:
            bound = math.sqrt(6.0 / (e + 3 * e))               # xavier_uniform_ of [3E, E]
            self.in_proj_weight = Parameter(generator().uniform(-bound, bound, (3 * e, e))
                                            .astype(dt))
        else:                                                  # PyTorch's order and init
            self.in_proj_weight = None
            for name, d in (("q_proj_weight", e), ("k_proj_weight", kdim),
                            ("v_proj_weight", vdim)):
                bound = math.sqrt(6.0 / (e + d))
                setattr(self, name, Parameter(generator().uniform(-bound, bound, (e, d))
                                              .astype(dt)))
        self.in_proj_bias = Parameter(np.zeros(3 * e, dt)) if bias else None
        self.out_proj = Linear(e, e, bias=bias, dtype=dt)
        if bias:
            self.out_proj.bias = Parameter(np.zeros(e, dt))
        self.register_buffer("rng_state", dropout_state(), persistent=False)

    def _project(self, x: Tensor, k: int) -> Tensor:
        """Input projection ``k`` (0: q, 1: k, 2: v) of ``x [N, L, E or kdim or vdim]`` ->
        ``[N, L, E]``."""
        e = self.embed_dim
        w = (self.in_proj_weight[k * e:(k + 1) * e] if self.in_proj_weight is not None
             else (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)[k])
        b = None if self.in_proj_bias is None else self.in_proj_bias[k * e:(k + 1) * e]
        y = apply("matmul", [x.reshape(-1, x.shape[-1]), w], transpose_b=True)
        if b is not None:
            y = apply("bias_add", [y, b], axis=1)
        return y.reshape(tuple(x.shape[:-1]) + (e,))

    def _check(self, query, key, value, attn_mask, key_padding_mask):
        fn = "MultiheadAttention"
        for name, t, d in (("query", query, self.embed_dim), ("key", key, self.kdim),
                           ("value", value, self.vdim)):
            if t.ndim != 3:
                raise ValueError(f"{fn}: {name} must be 3-D ([N, L, E] with batch_first, else "
                                 f"[L, N, E]), or 2-D [L, E] unbatched, got shape "
                                 f"{list(t.shape)}")
            if t.shape[-1] != d:
                what = "" if name == "query" or self.in_proj_weight is not None else f"{name} "
                raise ValueError(f"{fn}: was expecting {what}embedding dimension of {d}, but got "
                                 f"{t.shape[-1]} ({name})")
        if key.shape[:-1] != value.shape[:-1]:
            raise ValueError(f"{fn}: key shape {list(key.shape)} does not match value shape "
                             f"{list(value.shape)} (but for the last dimension, kdim and vdim)")
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
        causal mask (which it then must be given, as PyTorch). A query that may attend to no key
        (every key masked) has NaN weights with ``need_weights`` (PyTorch's softmax path), and
        without it attention 0, its output ``out_proj.bias`` with a zero gradient (PyTorch's
        ``scaled_dot_product_attention`` path; for masks given as data, as there).

        Unbatched inputs as PyTorch's: ``query [L, E]``, ``key`` / ``value [S, E]``,
        ``key_padding_mask [S]``, ``attn_mask [L, S]`` or ``[H, L, S]`` give ``[L, E]`` and
        weights ``[L, S]`` (``[H, L, S]``): a batch of one (op ``reshape``) and back.

        Raises:
            ValueError: shapes that do not fit (PyTorch's messages), ``is_causal`` without
                ``attn_mask``. TypeError: a mask of another dtype; ``query``, ``key`` or
                ``value`` not a miniflow Tensor (a NumPy array: wrap it with
                ``miniflow.tensor``), or of another dtype than the parameters.
        """
        dt = self.out_proj.weight.dtype
        for name, t in (("query", query), ("key", key), ("value", value)):
            if not isinstance(t, Tensor):
                raise TypeError(f"MultiheadAttention: {name} is a {type(t).__name__}, not a "
                                "miniflow Tensor; wrap data with miniflow.tensor(...) (graph "
                                "inputs are Tensors already)")
            if t.dtype is not dt:
                raise TypeError(f"MultiheadAttention: {name} {t.dtype.name}{list(t.shape)} is "
                                f"not of the module's parameter dtype {dt.name}; cast it with "
                                f".to(miniflow.{dt.name})"
                                + (f", or make the MultiheadAttention with "
                                   f"dtype=miniflow.{t.dtype.name}" if t.dtype.is_float else ""))
        if query.ndim != 2:
            return self._batched(query, key, value, key_padding_mask, need_weights, attn_mask,
                                 average_attn_weights, is_causal)
        if key.ndim != 2 or value.ndim != 2:
            raise ValueError(f"MultiheadAttention: For unbatched (2-D) query, expected key and "
                             f"value to be 2-D, but found {key.ndim}-D and {value.ndim}-D "
                             f"tensors respectively")
        axis = 0 if self.batch_first else 1
        if key_padding_mask is not None:
            key_padding_mask = (key_padding_mask.reshape(1, -1)
                                if isinstance(key_padding_mask, Tensor)
                                else np.asarray(key_padding_mask)[None])
        out, weights = self._batched(*(t.unsqueeze(axis) for t in (query, key, value)),
                                     key_padding_mask, need_weights, attn_mask,
                                     average_attn_weights, is_causal)
        unbatch = (lambda t: None if t is None else t.reshape(tuple(t.shape[1:])))
        return out.reshape(tuple(query.shape)), unbatch(weights)

    def _batched(self, query, key, value, key_padding_mask, need_weights, attn_mask,
                 average_attn_weights, is_causal):
        """:meth:`forward` of batched (3-D) inputs."""
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
            mask = _reshaped(mask, (n, h, length, src))
        pad = _mask("MultiheadAttention", key_padding_mask)
        if pad is not None:
            pad = _reshaped(pad, (n, 1, 1, src))
        rows = None
        if not need_weights:           # PyTorch's scaled_dot_product_attention path
            merged = _merged(mask, pad)
            if merged is not None:
                (mask, rows), pad = _fully_masked(merged), None
        scores = _apply_mask(_apply_mask(scores, mask), pad)
        attn = apply("softmax", [scores])
        if rows is not None:           # PyTorch's 0 for a query that may attend to no key
            attn = apply("masked_fill", [attn, rows], value=0.0)
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
        dims = ("" if self.in_proj_weight is not None
                else f", kdim={self.kdim}, vdim={self.vdim}")
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"dropout={self.dropout}, batch_first={self.batch_first}{dims}")
