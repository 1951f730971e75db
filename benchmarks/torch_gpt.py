"""The GPT of ``miniflow.models.gpt`` in PyTorch, written as nanoGPT's ``model.py`` (Karpathy;
same module names, so the state dict keys are nanoGPT's; the attention on its explicit path, the
causal mask from ``torch.tril``, no ``attn.bias`` buffer), for the GPT benchmark and the tests
that load a PyTorch state dict into ``miniflow.models.gpt``. Imports torch: use only where it is
installed."""
from __future__ import annotations

import math

import torch
from torch import nn as tnn
from torch.nn import functional as F

__all__ = ["TorchGPT"]


class _CausalSelfAttention(tnn.Module):
    def __init__(self, n_embd, n_head, dropout, bias):
        super().__init__()
        self.n_head = n_head
        self.c_attn = tnn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = tnn.Linear(n_embd, n_embd, bias=bias)
        self.attn_dropout, self.resid_dropout = tnn.Dropout(dropout), tnn.Dropout(dropout)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device))
        att = att.masked_fill(~mask, float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class _MLP(tnn.Module):
    def __init__(self, n_embd, dropout, bias):
        super().__init__()
        self.c_fc = tnn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.gelu = tnn.GELU()
        self.c_proj = tnn.Linear(4 * n_embd, n_embd, bias=bias)
        self.dropout = tnn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class _Block(tnn.Module):
    def __init__(self, n_embd, n_head, dropout, bias):
        super().__init__()
        self.ln_1 = tnn.LayerNorm(n_embd, bias=bias)
        self.attn = _CausalSelfAttention(n_embd, n_head, dropout, bias)
        self.ln_2 = tnn.LayerNorm(n_embd, bias=bias)
        self.mlp = _MLP(n_embd, dropout, bias)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TorchGPT(tnn.Module):
    """nanoGPT's ``GPT`` (token and position embeddings, pre-norm blocks, ``ln_f``, a tied
    ``lm_head``): ``forward(idx[, targets]) -> logits[, loss]``."""

    def __init__(self, vocab_size, block_size=256, n_layer=4, n_head=4, n_embd=128,
                 dropout=0.0, bias=True):
        super().__init__()
        self.transformer = tnn.ModuleDict(dict(
            wte=tnn.Embedding(vocab_size, n_embd), wpe=tnn.Embedding(block_size, n_embd),
            drop=tnn.Dropout(dropout),
            h=tnn.ModuleList([_Block(n_embd, n_head, dropout, bias) for _ in range(n_layer)]),
            ln_f=tnn.LayerNorm(n_embd, bias=bias)))
        self.lm_head = tnn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx, targets=None):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
