"""The GPT of ``miniflow.models.gpt`` in JAX, for the GPT benchmark (``gpt_step.py``): nanoGPT's
structure (Karpathy's ``model.py``; the same as ``torch_gpt.TorchGPT``) written as functions of a
parameter dict keyed by the PyTorch / miniflow state dict names, and PyTorch's ``AdamW`` update
written out (no flax or optax needed). Imports JAX: use only where it is installed.

Structure: token + position embeddings (``transformer.wte`` / ``wpe``), pre-norm blocks (``x +
attn(ln_1(x))``, ``x + mlp(ln_2(x))``; causal self-attention with ``n_head`` heads, scores
scaled by ``1 / sqrt(head size)`` and masked with ``-inf`` above the diagonal; MLP 4x wide with
exact GELU), ``ln_f``, the tied ``lm_head`` (``wte``'s transpose), mean cross-entropy. LayerNorm's
epsilon is PyTorch's 1e-5. No dropout (the benchmark's model has none).

Mixed precision (``act`` float16 or bfloat16): every matmul's two inputs are cast to ``act`` and
its product is ``act`` (as under miniflow's and PyTorch's AMP, where matmuls are on the white
list); what follows is JAX's type promotion (a float16 block output added to the float32
residual stream is float32); the logits are widened to float32 for the loss.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["params_from_state_dict", "loss", "adamw"]

LN_EPS = 1e-5
"""``torch.nn.LayerNorm``'s and miniflow's default epsilon."""


def params_from_state_dict(state: dict) -> dict:
    """``{name: jnp.ndarray float32}``, copies of a miniflow or PyTorch GPT state dict's arrays;
    the tied ``lm_head.weight`` is dropped (``transformer.wte.weight`` is the one tensor)."""
    return {k: jnp.array(v, jnp.float32) for k, v in state.items() if k != "lm_head.weight"}


def _linear(x, w, b, act):
    """``x @ w.T + b`` (``torch.nn.functional.linear``), its inputs cast to ``act``."""
    y = x.astype(act) @ w.astype(act).T
    return y if b is None else y + b.astype(act)


def _layer_norm(x, w, b):
    """LayerNorm over the last axis (biased variance, epsilon :data:`LN_EPS`)."""
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + LN_EPS) * w + b


def _attention(p, pre, x, n_head, act):
    """nanoGPT's ``CausalSelfAttention`` (explicit path) on ``x [B, T, C]``."""
    b, t, c = x.shape
    d = c // n_head
    qkv = _linear(x, p[pre + "c_attn.weight"], p[pre + "c_attn.bias"], act)
    q, k, v = (z.reshape(b, t, n_head, d).transpose(0, 2, 1, 3)
               for z in jnp.split(qkv, 3, axis=-1))                     # [B, h, T, d]
    att = (q.astype(act) @ k.astype(act).transpose(0, 1, 3, 2)) * (1.0 / d ** 0.5)
    mask = jnp.tril(jnp.ones((t, t), bool))
    att = jax.nn.softmax(jnp.where(mask, att, -jnp.inf), axis=-1)
    y = (att.astype(act) @ v.astype(act)).transpose(0, 2, 1, 3).reshape(b, t, c)
    return _linear(y, p[pre + "c_proj.weight"], p[pre + "c_proj.bias"], act)


def _mlp(p, pre, x, act):
    h = jax.nn.gelu(_linear(x, p[pre + "c_fc.weight"], p[pre + "c_fc.bias"], act),
                    approximate=False)
    return _linear(h, p[pre + "c_proj.weight"], p[pre + "c_proj.bias"], act)


def loss(p: dict, idx, targets, n_layer: int, n_head: int, act=jnp.float32):
    """Mean cross-entropy (float32 scalar) of the GPT with parameters ``p`` on token ids ``idx``
    ``[B, T]`` int32 and their next tokens ``targets`` ``[B, T]`` int32; matmuls in ``act``."""
    t = idx.shape[1]
    x = p["transformer.wte.weight"][idx] + p["transformer.wpe.weight"][:t]
    for i in range(n_layer):
        pre = f"transformer.h.{i}."
        x = x + _attention(p, pre + "attn.", _layer_norm(
            x, p[pre + "ln_1.weight"], p[pre + "ln_1.bias"]), n_head, act)
        x = x + _mlp(p, pre + "mlp.", _layer_norm(
            x, p[pre + "ln_2.weight"], p[pre + "ln_2.bias"]), act)
    x = _layer_norm(x, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"])
    logits = _linear(x, p["transformer.wte.weight"], None, act).astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def adamw(p, g, m, v, step, lr: float, betas=(0.9, 0.999), eps: float = 1e-8,
          weight_decay: float = 1e-2):
    """One ``torch.optim.AdamW`` update (its documented algorithm, ``amsgrad=False``) of every
    tensor of the dicts ``p`` (parameters), ``g`` (gradients), ``m`` / ``v`` (first and second
    moments) at update number ``step`` (1 for the first, a float32 scalar): ``p *= 1 - lr wd``;
    moments updated; ``p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)``. Returns the
    new ``(p, m, v)``."""
    b1, b2 = betas
    c1, c2 = 1 - b1 ** step, jnp.sqrt(1 - b2 ** step)
    new_p, new_m, new_v = {}, {}, {}
    for k in p:
        new_m[k] = b1 * m[k] + (1 - b1) * g[k]
        new_v[k] = b2 * v[k] + (1 - b2) * jnp.square(g[k])
        new_p[k] = p[k] * (1 - lr * weight_decay) - (lr / c1) * new_m[k] / (
            jnp.sqrt(new_v[k]) / c2 + eps)
    return new_p, new_m, new_v
