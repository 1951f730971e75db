"""Functional ops (``torch.nn.functional`` names) built from registered op types; the activation
functions (``relu``, ...) are ``miniflow.nn.activations``' and re-exported here."""
from __future__ import annotations

from ..tensor import Tensor, apply, tensor
from . import activations
from .activations import *  # noqa: F401,F403  (the activation functions: relu ...)

__all__ = ["softmax", "log_softmax", "cross_entropy", "linear", "white_identity",
           "black_identity", *(name for name in activations.__all__ if name.islower())]


def _last_axis(op, x: Tensor, dim: int):
    """Run row op ``op`` over ``dim`` by moving that axis last (ops work on the last axis)."""
    nd = x.ndim
    if not -nd <= dim < nd:
        raise ValueError(f"{op}: dim {dim} out of range for a tensor of rank {nd}")
    dim %= nd
    if dim == nd - 1:
        return apply(op, [x])
    perm = tuple(i for i in range(nd) if i != dim) + (dim,)
    inv = tuple(perm.index(i) for i in range(nd))
    return apply(op, [x.transpose(perm)]).transpose(inv)


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """exp(x) / sum(exp(x)) along ``dim`` (op ``softmax``; max-subtracted)."""
    return _last_axis("softmax", x, dim)


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    """x - logsumexp(x) along ``dim`` (op ``log_softmax``)."""
    return _last_axis("log_softmax", x, dim)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x [..., in] @ weight[out, in].T (+ bias[out]) -> [..., out] (ops ``matmul``, ``bias_add``)."""
    lead = x.shape[:-1]
    x2 = x if x.ndim == 2 else x.reshape(-1, x.shape[-1]) if x.ndim > 0 else x
    y = apply("matmul", [x2, weight], transpose_b=True)
    if bias is not None:
        y = apply("bias_add", [y, bias], axis=1)
    return y if x.ndim == 2 else y.reshape(*lead, weight.shape[0])


def cross_entropy(logits: Tensor, labels, reduction: str = "mean") -> Tensor:
    """Softmax cross-entropy of logits [N, C] against int64 class indices [N].

    Op ``sparse_softmax_cross_entropy`` then ``reduce_sum`` (and ``scalar_mul(1/N)`` for "mean").
    reduction: "mean" | "sum" | "none".

    Raises:
        ValueError: unknown reduction; shape errors from the op name both shapes. Labels outside
            [0, C) raise ValueError when the graph runs.
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    labels = labels if isinstance(labels, Tensor) else tensor(labels)
    _, per_sample = apply("sparse_softmax_cross_entropy", [logits, labels])
    if reduction == "none":
        return per_sample
    return per_sample.mean() if reduction == "mean" else per_sample.sum()


def white_identity(x: Tensor) -> Tensor:
    """x, unchanged (op ``amp_white_identity``, white list): under AMP, the gray ops between it and
    another white op or a graph sink run in float16. Pruned after the AMP pass (no run-time cost)."""
    return apply("amp_white_identity", [x])


def black_identity(x: Tensor) -> Tensor:
    """x, unchanged (op ``amp_black_identity``, black list): under AMP, the gray ops after it (and
    their gradients) run in float32. Pruned after the AMP pass (no run-time cost)."""
    return apply("amp_black_identity", [x])
