"""A minGPT / nanoGPT-style decoder-only transformer (Radford et al., "Language Models are
Unsupervised Multitask Learners", 2019; Karpathy's minGPT and nanoGPT ``model.py``), with their
module names, so the state dict of a PyTorch model of the same structure loads:

``transformer.wte`` (token embedding ``[vocab_size, n_embd]``) + ``transformer.wpe`` (position
embedding ``[block_size, n_embd]``) -> ``transformer.drop`` -> ``transformer.h.0 ..
h.{n_layer - 1}`` (pre-norm blocks: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``) ->
``transformer.ln_f`` -> ``lm_head`` (no bias; its weight *is* ``transformer.wte.weight``: weight
tying, Press and Wolf 2017).

A block's ``attn`` is causal self-attention: ``c_attn`` (``Linear(n_embd, 3 n_embd)``, q, k, v),
``n_head`` heads, ``softmax(q k^T / sqrt(head size))`` masked causally (op ``tril`` with ``-inf``)
and ``attn_dropout``, ``c_proj`` and ``resid_dropout``; ``mlp`` is ``c_fc`` (4x), exact GELU,
``c_proj``, ``dropout``. No ``attn.bias`` buffer: nanoGPT registers it only without PyTorch's
flash attention, and the causal mask needs no stored table here.

Initialisation as nanoGPT's: weights N(0, 0.02), the residual projections (``c_proj``)
N(0, 0.02 / sqrt(2 n_layer)), biases zero, LayerNorms ones and zeros.
"""
from __future__ import annotations

import math
import numpy as np

from .. import nn
from ..checks import boolean, positive_integer
from ..nn.sparse import token_ids
from ..random import generator
from ..tensor import apply, as_numpy, tensor
from ..trace import no_grad

__all__ = ["GPT", "CausalSelfAttention", "gpt", "sample"]


def _normal(module, std: float) -> None:
    """``module.weight`` (Linear or Embedding) drawn N(0, std), its bias zero."""
    module.weight = nn.Parameter(generator().normal(0.0, std, module.weight.shape)
                                 .astype(np.float32))
    if getattr(module, "bias", None) is not None:
        module.bias = nn.Parameter(np.zeros(module.bias.shape, np.float32))


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention over ``x [B, T, n_embd]`` (nanoGPT's
    ``CausalSelfAttention``, the explicit path: two ``batch_matmul`` around a ``softmax``)."""

    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool):
        super().__init__()
        self.n_embd, self.n_head = n_embd, n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.attn_dropout, self.resid_dropout = nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, x):
        b, t, c = x.shape
        h = self.n_head
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (apply("transpose", [z.view(b, t, h, c // h)], perm=(0, 2, 1, 3))
                   for z in (q, k, v))                                      # [B, h, T, d]
        att = apply("batch_matmul", [q, k], transpose_b=True) * (1.0 / math.sqrt(c // h))
        att = apply("tril", [att], diagonal=0, fill_value=-math.inf)
        att = self.attn_dropout(att.softmax(-1))
        y = apply("transpose", [apply("batch_matmul", [att, v])], perm=(0, 2, 1, 3))
        return self.resid_dropout(self.c_proj(y.reshape(b, t, c)))


class _MLP(nn.Module):
    def __init__(self, n_embd: int, dropout: float, bias: bool):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class _Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = _MLP(n_embd, dropout, bias)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class _Transformer(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, dropout, bias):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.Sequential(*(_Block(n_embd, n_head, dropout, bias) for _ in range(n_layer)))
        self.ln_f = nn.LayerNorm(n_embd, bias=bias)


class GPT(nn.Module):
    """See the module docstring. ``forward(idx [B, T] int64[, targets [B, T] int64])`` ->
    ``logits [B, T, vocab_size]``, and with ``targets`` also the mean cross-entropy loss.

    ``state_dict()`` lists ``lm_head.weight`` as PyTorch's does (``Module`` lists the tied
    tensor under both names); ``load_state_dict`` accepts it when it equals
    ``transformer.wte.weight``.

    ``idx`` / ``targets``: int64 Tensors, or integer arrays or lists (converted; eager ones
    checked against ``[0, vocab_size)``, lazy ones when the graph runs).

    Raises:
        ValueError: a size that is not a positive integer, ``n_embd`` not divisible by
            ``n_head``; at build time a sequence longer than ``block_size`` (nanoGPT's message),
            ``idx`` not 2-D, ``targets`` of another shape than ``idx``.
        TypeError: ``bias`` not True or False; ids that are not integers. IndexError: an
            eager id out of range, naming it and where.
    """

    TIED = ("lm_head.weight", "transformer.wte.weight")

    def __init__(self, vocab_size: int, block_size: int = 256, n_layer: int = 4,
                 n_head: int = 4, n_embd: int = 128, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        for name, v in (("vocab_size", vocab_size), ("block_size", block_size),
                        ("n_layer", n_layer), ("n_head", n_head), ("n_embd", n_embd)):
            positive_integer("gpt", name, v)
        bias = boolean("gpt", "bias", bias, numpy=True)
        if n_embd % n_head:
            raise ValueError(f"gpt: n_embd must be divisible by n_head, got n_embd={n_embd} and "
                             f"n_head={n_head}")
        self.vocab_size, self.block_size = int(vocab_size), int(block_size)
        self.transformer = _Transformer(vocab_size, block_size, n_layer, n_head, n_embd,
                                        dropout, bias)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        for _, m in self.named_modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                _normal(m, 0.02)
        for name, m in self.named_modules():
            if name.endswith("c_proj"):
                _normal(m, 0.02 / math.sqrt(2 * n_layer))
        self.transformer.wte.weight = self.lm_head.weight          # weight tying

    def forward(self, idx, targets=None):
        ids = token_ids("gpt", idx, self.vocab_size, "idx", "vocab_size")
        if ids.ndim != 2:
            raise ValueError(f"gpt: idx must be [batch, time] token ids, got shape "
                             f"{list(ids.shape)}")
        b, t = ids.shape
        if t > self.block_size:
            raise ValueError(f"gpt: Cannot forward sequence of length {t}, block size is only "
                             f"{self.block_size}")
        if targets is not None:
            targets = token_ids("gpt", targets, self.vocab_size, "targets", "vocab_size")
            if targets.shape != ids.shape:
                raise ValueError(f"gpt: targets must have idx's shape {list(ids.shape)} "
                                 f"([batch, time]: the next token of each), got "
                                 f"{list(targets.shape)}")
        tr = self.transformer
        x = tr.drop(tr.wte(ids) + tr.wpe(tensor(np.arange(t, dtype=np.int64))))
        logits = self.lm_head(tr.ln_f(tr.h(x)))
        if targets is None:
            return logits
        loss = nn.functional.cross_entropy(logits.reshape(b * t, self.vocab_size),
                                           targets.reshape(b * t))
        return logits, loss

    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None):
        """nanoGPT's ``model.generate(idx, max_new_tokens, temperature=1.0, top_k=None)``:
        ``idx [B, T]`` (an int64 Tensor, or an integer array) continued by ``max_new_tokens``
        tokens, each drawn from the softmax of the last position's logits divided by
        ``temperature`` and restricted to the ``top_k`` largest, from miniflow's generator
        (reproducible after ``miniflow.manual_seed``); the context is cropped to the last
        ``block_size`` tokens, as nanoGPT's. Returns an int64 Tensor ``[B, T + max_new_tokens]``.

        The forward runs eagerly under ``no_grad`` (``torch.no_grad``, nanoGPT's decorator) in
        the module's current mode: call ``model.eval()`` first, as nanoGPT says, so that dropout
        is off. See :func:`sample` (shared with ``experiments.train_gpt.generate``).

        Raises:
            ValueError: ``max_new_tokens`` not an int >= 0, ``temperature`` not a finite number
                > 0, ``top_k`` not an int >= 1; ``idx`` not ``[B, T]`` with T >= 1.
            TypeError / IndexError: ids that are not integers / out of range (``forward``'s).
            FloatingPointError: logits that are not finite (nothing to sample from)."""
        ids = as_numpy(idx) if hasattr(idx, "numpy") else np.asarray(idx)
        if ids.ndim != 2 or ids.shape[1] == 0 or ids.dtype.kind not in "iu":
            raise ValueError(f"generate: idx must be [batch, time] integer token ids with "
                             f"time >= 1, got {ids.dtype} of shape {list(ids.shape)}")
        return tensor(sample(self, ids.astype(np.int64), max_new_tokens, temperature, top_k,
                             generator(), "max_new_tokens"))

    def prepare_load_state_dict(self, state_dict, strict: bool = True):
        """As ``Module``'s (which lists and loads the one tied tensor under both of its names),
        with the tied ``lm_head.weight`` checked against ``transformer.wte.weight`` first: where
        both have one shape and their values differ, the state dict is not of a tied model and
        is refused (PyTorch's ``load_state_dict`` would keep ``lm_head.weight`` and drop the
        embedding without a word). The same bits are the same values (a NaN in a diverged
        model's tied weight too); a shape that differs from the model's is ``Module``'s error.

        nanoGPT's causal-mask buffers (``transformer.h.N.attn.bias``: ``tril(ones(T, T))`` as
        ``[1, 1, T, T]``, in its checkpoints where PyTorch had no flash attention) are dropped,
        as nanoGPT's ``from_pretrained`` drops them: this model masks with op ``tril``.

        Raises:
            ValueError: the two tied entries differ (the state dict is not of a tied model);
                otherwise as ``Module.load_state_dict``."""
        if isinstance(state_dict, dict):
            state_dict = {k: v for k, v in state_dict.items() if not _causal_mask(k, v)}
        if isinstance(state_dict, dict) and all(k in state_dict for k in self.TIED):
            head, emb = (as_numpy(state_dict[k]) for k in self.TIED)
            if emb.shape == head.shape and not (np.array_equal(emb, head) or (
                    emb.dtype == head.dtype and emb.tobytes() == head.tobytes())):
                raise ValueError(f"gpt: {self.TIED[0]} and {self.TIED[1]} differ: this model "
                                 f"ties them (one tensor); load a state dict of a tied model")
        return super().prepare_load_state_dict(state_dict, strict)


def sample(model, ids: np.ndarray, count: int, temperature: float, top_k, rng,
           what: str = "length") -> np.ndarray:
    """``ids [B, T]`` (int64) continued by ``count`` tokens sampled from ``model`` (nanoGPT's
    ``generate``): each step an eager forward of the last ``model.block_size`` tokens under
    ``no_grad``, the last position's logits in float64 divided by ``temperature``, those below
    the ``top_k``-th largest set to ``-inf``, softmax, one draw per row from ``rng`` (a
    ``numpy.random.Generator``). ``what``: the name of ``count`` in its error.

    Raises:
        ValueError: ``count`` not an int >= 0 (named ``what``), ``temperature`` not a finite
            number > 0, ``top_k`` not an int >= 1.
        FloatingPointError: the model's logits are not finite (its weights hold NaN or inf, as
            after a run that diverged): there is no distribution to sample from."""
    if not isinstance(count, (int, np.integer)) or isinstance(count, bool) or count < 0:
        raise ValueError(f"generate: {what} must be an int >= 0 (the tokens to add), got "
                         f"{count!r}")
    if not (isinstance(temperature, (int, float, np.floating)) and not isinstance(temperature, bool)
            and 0 < temperature < math.inf):
        raise ValueError(f"generate: temperature must be a finite number > 0, got "
                         f"{temperature!r}")
    if top_k is not None and (not isinstance(top_k, (int, np.integer)) or isinstance(top_k, bool)
                              or top_k < 1):
        raise ValueError(f"generate: top_k must be an int >= 1 (or None: every token), got "
                         f"{top_k!r}")
    with no_grad():
        for _ in range(count):
            logits = model(tensor(ids[:, -model.block_size:])).numpy()[:, -1]
            logits = logits.astype(np.float64)
            if not np.isfinite(logits).all():       # NumPy: "Probabilities contain NaN"
                raise FloatingPointError(
                    f"generate: the model's logits are not finite ({np.isnan(logits).sum()} "
                    f"NaN, {np.isinf(logits).sum()} inf of {logits.size}): its weights are not "
                    "finite, as after a run that diverged; there is nothing to sample from")
            with np.errstate(over="ignore"):    # <= 0; a tiny temperature: -inf but the max
                logits = (logits - logits.max(-1, keepdims=True)) / temperature
            if top_k is not None and top_k < logits.shape[-1]:
                cut = np.sort(logits, -1)[:, -top_k:-top_k + 1 or None]
                logits = np.where(logits < cut, -np.inf, logits)
            p = np.exp(logits)
            drawn = [rng.choice(row.size, p=row / row.sum()) for row in p]
            ids = np.concatenate([ids, np.array(drawn, np.int64)[:, None]], 1)
    return ids


def _causal_mask(key: str, value) -> bool:
    """Whether ``key``, ``value`` is nanoGPT's ``attn.bias`` buffer: ``[1, 1, T, T]`` ones on and
    below the diagonal, zeros above."""
    if not key.endswith(".attn.bias"):
        return False
    arr = as_numpy(value)
    return (arr.ndim == 4 and arr.shape[:2] == (1, 1) and arr.shape[2] == arr.shape[3]
            and np.array_equal(arr[0, 0], np.tril(np.ones(arr.shape[2:], arr.dtype))))


def gpt(vocab_size: int, block_size: int = 256, n_layer: int = 4, n_head: int = 4,
        n_embd: int = 128, dropout: float = 0.0, bias: bool = True) -> GPT:
    """A :class:`GPT` (character-level defaults: 4 layers, 4 heads, 128 wide, context 256)."""
    return GPT(vocab_size, block_size, n_layer, n_head, n_embd, dropout, bias)
