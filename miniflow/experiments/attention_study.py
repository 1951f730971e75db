"""``miniflow attention-study``: where OneFlow's AMP rule for attention, ``softmax`` (gray)
between two ``batch_matmul`` (white) running in float16, costs accuracy, and what
``amp_black_identity`` changes.

One attention head, ``out = softmax(q @ k^T) @ v`` with ``q [B, L, d]``, ``k``, ``v`` drawn so
the scores have standard deviation ``scale`` (``q = scale * N(0, 1) / sqrt(d)``, ``k, v ~ N(0,
1)``), is run through ``nn.Graph`` in four ways and compared with NumPy float64:

* ``fp32``: no AMP;
* ``amp``: AMP float16 with OneFlow's lists: the scores, the softmax and its output are float16;
* ``amp+black_scores``: ``amp_black_identity`` on the scores: the softmax runs in float32, but
  the scores were already rounded to float16 by the white ``batch_matmul`` that made them;
* ``amp+black_matmul``: ``batch_matmul`` moved to the black list: the whole block in float32.

For each scale it reports the largest error of ``out`` and of the attention probabilities and
whether anything overflowed (float16's largest value is 65504: scores beyond it become inf, the
softmax NaN). The finding is computed from the numbers (:func:`summary`); :func:`figure` draws
them.
"""
from __future__ import annotations

import os

import numpy as np

from .. import nn
from ..nn import functional as F
from ..tensor import apply, tensor
from .stability_plots import save_png

__all__ = ["VARIANTS", "SCALES", "OUTPUT_FILES", "run_variant", "study", "summary", "figure",
           "ir_text", "reference"]

OUTPUT_FILES = ("results.json", "attention_amp.png")
"""The files ``miniflow attention-study`` writes into its ``--out`` folder: the results, the
figure."""

VARIANTS = ("fp32", "amp", "amp+black_scores", "amp+black_matmul")
SCALES = (1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0)
"""Standard deviations of the scores swept (float16 overflows from 65504)."""


class _Head(nn.Graph):
    """``(softmax(q @ k^T) @ v, softmax(q @ k^T))``, the scores pinned if ``black_scores``."""

    def __init__(self, variant: str):
        super().__init__()
        self.black_scores = variant == "amp+black_scores"
        if variant == "amp+black_matmul":
            self.config.enable_amp(True, white_remove=("batch_matmul",),
                                   black_add=("batch_matmul",))
        elif variant != "fp32":
            self.config.enable_amp(True)

    def build(self, q, k, v):
        scores = apply("batch_matmul", [q, k], transpose_b=True)
        if self.black_scores:
            scores = F.black_identity(scores)
        p = apply("softmax", [scores])
        return apply("batch_matmul", [p, v]), p


def _inputs(scale: float, batch: int, length: int, d: int, seed: int):
    r = np.random.default_rng(seed)
    q = (scale * r.standard_normal((batch, length, d)) / np.sqrt(d)).astype(np.float32)
    k, v = (r.standard_normal((batch, length, d)).astype(np.float32) for _ in range(2))
    return q, k, v


def reference(q, k, v):
    """``(softmax(q @ k^T) @ v, softmax(q @ k^T))`` in NumPy float64 (the max-subtracted
    softmax): the oracle the variants are measured against; ``q [B, L, d]``, ``k``, ``v [B, S,
    d]`` of any float dtype."""
    s = q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return p @ v.astype(np.float64), p


def run_variant(variant: str, scale: float, batch: int = 4, length: int = 32, d: int = 32,
                seed: int = 0) -> dict:
    """One variant at one score scale: ``{"out_error", "prob_error", "nonfinite"}`` (largest
    absolute errors against float64; whether the output holds inf or NaN)."""
    q, k, v = _inputs(scale, batch, length, d, seed)
    out, p = _Head(variant)(tensor(q), tensor(k), tensor(v))
    out, p = out.numpy().astype(np.float64), p.numpy().astype(np.float64)
    want_out, want_p = reference(q, k, v)
    finite = np.isfinite(out).all() and np.isfinite(p).all()
    return {"out_error": float(np.abs(out - want_out).max()) if finite else float("nan"),
            "prob_error": float(np.abs(p - want_p).max()) if finite else float("nan"),
            "nonfinite": not finite}


def study(scales=SCALES, variants=VARIANTS, **kw) -> dict:
    """Every variant at every scale: ``{variant: [run_variant(...) per scale]}``."""
    return {v: [run_variant(v, s, **kw) for s in scales] for v in variants}


def summary(results: dict, scales=SCALES) -> list:
    """The findings, as sentences computed from ``results``."""
    lines = []
    amp = results["amp"]
    bad = next((s for s, r in zip(scales, amp) if r["nonfinite"] or r["out_error"] > 1e-2),
               None)
    over = next((s for s, r in zip(scales, amp) if r["nonfinite"]), None)
    lines.append("amp (softmax in float16): output error > 1e-2 from score std "
                 f"{bad:g}" if bad is not None else "amp: output error <= 1e-2 at every scale")
    lines.append(f"amp: non-finite output from score std {over:g} (scores beyond float16's "
                 f"65504)" if over is not None else "amp: no overflow in the scales swept")
    pinned = results.get("amp+black_scores")
    if pinned is not None:
        ratios = [p["out_error"] / a["out_error"] for p, a in zip(pinned, amp)
                  if not (p["nonfinite"] or a["nonfinite"]) and a["out_error"] > 0]
        still = next((s for s, r in zip(scales, pinned) if r["nonfinite"]), None)
        lines.append("amp+black_scores: error / amp's error "
                     f"{min(ratios):.2f} .. {max(ratios):.2f}" if ratios else
                     "amp+black_scores: no comparable scale")
        if ratios and min(ratios) == max(ratios) == 1.0:
            lines.append("amp+black_scores: no change at all: miniflow's float16 softmax "
                         "already computes in float32 and rounds once, and the pinned float32 "
                         "softmax is rounded to float16 for the white batch_matmul after it; "
                         "the error comes from the float16 scores (|s| * 2^-11 each)")
        lines.append("amp+black_scores: still non-finite from score std "
                     f"{still:g}: the white batch_matmul rounds (and overflows) the scores "
                     "before the pin" if still is not None else
                     "amp+black_scores: finite at every scale")
    black = results.get("amp+black_matmul")
    if black is not None:
        worst = max(r["out_error"] for r in black if not r["nonfinite"])
        lines.append(f"amp+black_matmul (the block in float32): largest output error {worst:.2e},"
                     f" non-finite: {any(r['nonfinite'] for r in black)}")
    return lines


def ir_text(variant: str = "amp") -> str:
    """The optimized IR of the head under ``variant`` (softmax float16 by OneFlow's rule for
    ``amp``)."""
    g = _Head(variant)
    q, k, v = _inputs(1.0, 2, 4, 8, 0)
    g(tensor(q), tensor(k), tensor(v))
    return str(g.ir)


def figure(results: dict, path: str, scales=SCALES) -> str:
    """Output error against score scale per variant (log-log, errors below 1e-12 drawn at
    1e-12; non-finite runs marked x at the top), saved to ``path`` (PNG, atomically); returns
    ``path``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    styles = ("o-", "s-", "^--", "v--")          # dashed over solid: coinciding curves show
    for (v, rows), style in zip(results.items(), styles):
        err = np.array([r["out_error"] for r in rows])
        ax.loglog(scales, np.where(np.isnan(err), np.nan, np.maximum(err, 1e-12)), style,
                  label=v, alpha=0.8)
        bad = [s for s, r in zip(scales, rows) if r["nonfinite"]]
        if bad:
            ax.scatter(bad, [1.0] * len(bad), marker="x", color=ax.lines[-1].get_color())
    ax.axvline(65504, color="grey", lw=0.8, ls="--")
    ax.text(65504, 1e-11, " float16 max", color="grey", fontsize=8)
    ax.set_xlabel("standard deviation of the attention scores")
    ax.set_ylabel("max |out - float64| (x: inf/NaN)")
    ax.set_title("softmax(q k^T) v under AMP: OneFlow's rule vs amp_black_identity")
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return save_png(fig, path, 120, "miniflow.experiments.attention_study.figure")
