# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 13: attention under AMP
#
# What this lesson teaches:
#
# 1. **One attention block's IR under AMP.** `nn.functional.scaled_dot_product_attention` is
#    `softmax(q @ k^T * scale) @ v`: two `batch_matmul` (white: float16) around a `softmax`
#    (gray). In OneFlow's rule a gray op follows its neighbours: it turns white when it lies
#    between a white op and another white op (or a graph output), because running it in float32
#    would cost a cast to float32 before it and one back to float16 after it, for a precision
#    the next white op throws away. So the softmax between two white ops runs in float16
#    (`oneflow/core/job_rewriter/auto_mixed_precision.cpp`; `amp_report()` says why per node).
# 2. **What that costs as the scores grow**: the study behind `miniflow attention-study`
#    (`miniflow.experiments.attention_study`) run at growing score standard deviations, a table
#    and its figure: float16 rounds each score to 11 bits (an error of `|s| * 2^-11`, which the
#    softmax turns into an error of the weights), and overflows at 65504 (inf, then NaN).
# 3. **`amp_black_identity` on the scores** (`nn.functional.black_identity`) pins the softmax
#    to float32 in the IR.
# 4. **The honest outcome**: the pin changes nothing, bit for bit, because the white
#    `batch_matmul` already rounded (or overflowed) the scores to float16 before it; what does
#    help: `batch_matmul` on the black list (`enable_amp(black_add=["batch_matmul"])`, the block
#    in float32), and scaling `q` before the product (moves the overflow by `sqrt(d)`, not the
#    rounding).
#
# Assumes: nn.Graph and its IR (lesson 1), the AMP pass, its lists and `amp_report()` (lesson 4),
# `amp.black_identity` / `amp.white_identity` (lesson 6).
#
# Run: `python tutorials/13_attention_under_amp.py [--quick] [--out DIR]` (--quick: 5 score
# scales instead of 10). Writes a figure.

# %%
import argparse
import math
from pathlib import Path

import numpy as np

import miniflow as mf
from miniflow import nn
from miniflow.experiments.attention_study import (SCALES, VARIANTS, figure, ir_text, reference,
                                                  study, summary)
from miniflow.nn import functional as F
from miniflow.notebook import out_folder, script_args, script_dir

LESSON = script_dir(globals()) / "13_attention_under_amp.py"
DEFAULT_OUT = LESSON.parent.parent / "tutorial-output" / "13_attention_under_amp"
QUICK_SCALES = SCALES[::2]
"""Every other score scale: 1, 16, 256, 4096, 65536 (still both thresholds)."""


def indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


class Attention(nn.Graph):
    """``scaled_dot_product_attention(q, k, v)`` in a graph: ``q [B, L, d]``, ``k``, ``v [B, S,
    d]`` float32 -> ``[B, L, d]``. ``amp``: None (float32) or ``enable_amp``'s keyword arguments;
    ``prescale``: multiply ``q`` by ``1/sqrt(d)`` before the product (``scale=1``) instead of the
    scores after it."""

    def __init__(self, amp=None, causal: bool = False, prescale: bool = False):
        super().__init__()
        self.causal, self.prescale = causal, prescale
        if amp is not None:
            self.config.enable_amp(True, **amp)

    def build(self, q, k, v):
        if self.prescale:
            return F.scaled_dot_product_attention(q * (1.0 / math.sqrt(q.shape[-1])), k, v,
                                                  is_causal=self.causal, scale=1.0)
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


def softmax_dtype(ir: str) -> str:
    """The dtype of the softmax's output in an IR's text (``f16`` or ``f32``)."""
    return next(line.split(":")[1].split("[")[0].strip() for line in ir.splitlines()
                if "= softmax(" in line)


# %% [markdown]
# ## 1. One attention block's IR under AMP

# %%
def part1_ir() -> None:
    print("== 1. scaled_dot_product_attention(q, k, v, is_causal=True) under AMP ==")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 4, 8)).astype(np.float32) for _ in range(3))
    g = Attention(amp={}, causal=True)
    out = g(q, k, v)
    print(f"IR with OneFlow's AMP lists, q, k, v f32[2, 4, 8] (output {out.dtype!r}):")
    print(indent(str(g.ir)))
    rep = g.amp_report()
    print("amp_report() per node:")
    for r in rep.rows:
        print(f"  {r.op:<13} {r.outputs:<7} color {r.color:<6} dtype {r.dtype:<4} {r.reason}")
    print(f"softmax dtype under AMP (OneFlow's rule): {softmax_dtype(str(g.ir))}")
    print("  why: softmax is gray, and a gray op follows its neighbours: its input comes from "
          "the white batch_matmul in float16 (through the gray scalar_mul and the clear tril), "
          "its consumer is the white batch_matmul that wants float16 again, so running it in "
          "float16 costs no cast at all (float32 would cost two)")


# %% [markdown]
# ## 2. What the float16 softmax costs as the scores grow

# %%
def part2_cost(scales, out: Path) -> dict:
    print("\n== 2. The cost as the scores grow: one head, softmax(q k^T) v, vs NumPy float64 ==")
    print("(miniflow.experiments.attention_study: q, k, v [4, 32, 32], scores of standard "
          "deviation s)")
    results = study(scales=scales)
    print(f"{'score std':>10} " + " ".join(f"{v:>17}" for v in VARIANTS))
    for i, s in enumerate(scales):
        cells = ["inf/NaN" if results[v][i]["nonfinite"] else f"{results[v][i]['out_error']:.2e}"
                 for v in VARIANTS]
        print(f"{s:>10g} " + " ".join(f"{c:>17}" for c in cells))
    print("(max |out - float64| per variant; fp32: no AMP; amp: OneFlow's lists; "
          "amp+black_scores: amp_black_identity on the scores; amp+black_matmul: batch_matmul "
          "on the black list)")
    print("(from a std of a few thousand the weights are one-hot, only the largest score "
          "counts, so the errors fall, until float16 overflows)")
    print("findings, computed from the table:")
    for line in summary(results, scales=scales):
        print(f"  {line}")
    path = figure(results, str(out / "13_attention_amp_error.png"), scales=scales)
    print(f"figure (output error against score std, per variant) written to: {path}")
    return results


# %% [markdown]
# ## 3. amp_black_identity on the scores pins the softmax to float32

# %%
def part3_pin() -> None:
    print("\n== 3. amp_black_identity on the scores (nn.functional.black_identity) ==")
    pinned = ir_text("amp+black_scores")
    print("IR of the study's head with scores = F.black_identity(batch_matmul(q, k^T)):")
    print(indent(pinned))
    print(f"softmax dtype without the identity: {softmax_dtype(ir_text('amp'))}")
    print(f"softmax dtype with amp_black_identity on the scores: {softmax_dtype(pinned)}")
    print("  the black identity leaves a cast to float32 after the scores' batch_matmul; the "
          "gray softmax follows its float32 input, and its output is cast to float16 for the "
          "white batch_matmul after it")


# %% [markdown]
# ## 4. The honest outcome: what the pin fixes, what it does not, and what does

# %%
def part4_outcome(results: dict, scales) -> None:
    print("\n== 4. What the pin fixes and what it does not ==")
    amp, pinned = results["amp"], results["amp+black_scores"]
    same = all(a["out_error"] == p["out_error"] or (a["nonfinite"] and p["nonfinite"])
               for a, p in zip(amp, pinned))
    print(f"amp+black_scores output error equal to amp's at every scale: {same}")
    print("  the scores the pin receives are already float16: the white batch_matmul rounded "
          "each to 11 bits (and past 65504 to inf); a float32 softmax of rounded scores gives "
          "the same weights, which are rounded to float16 again for the second batch_matmul")
    black = results["amp+black_matmul"]
    print(f"enable_amp(black_add=['batch_matmul']) (the study's amp+black_matmul): largest "
          f"error {max(r['out_error'] for r in black):.2e}, equal to fp32's at every scale: "
          f"{all(b == f for b, f in zip(black, results['fp32']))}")

    # Scaling q before the product: scaled_dot_product_attention computes (q @ k^T) * scale, so
    # the float16 product is sqrt(d) times larger than the scores the softmax sees.
    d, std = 64, 16384.0
    rng = np.random.default_rng(0)
    q = (std * rng.standard_normal((2, 16, d))).astype(np.float32)   # q k^T / sqrt(d): std 16384
    k, v = (rng.standard_normal((2, 16, d)).astype(np.float32) for _ in range(2))
    want = reference(q / np.sqrt(d), k, v)[0]
    print(f"scaling q before the product, scaled_dot_product_attention with d = {d}, scaled "
          f"scores of std {std:g} (below 65504; the product before * 1/sqrt(d): std "
          f"{std * math.sqrt(d):g}, above):")
    for label, kw in (("AMP, scale after the product (the default)", {}),
                      ("AMP, q * 1/sqrt(d) before the product", {"prescale": True}),
                      ("enable_amp(black_add=['batch_matmul'])",
                       {"amp_kw": {"black_add": ["batch_matmul"]}})):
        graph = Attention(amp=kw.get("amp_kw", {}), prescale=kw.get("prescale", False))
        got = graph(q, k, v).numpy().astype(np.float64)
        err = ("inf/NaN" if not np.isfinite(got).all()
               else f"max |out - float64| {np.abs(got - want).max():.2e}")
        print(f"  {label:<45} softmax {softmax_dtype(str(graph.ir))}: {err}")
    print("  pre-scaling moves the overflow by sqrt(d) (finite here), not the rounding: the "
          "scores are still float16, so the error stays that of float16 scores; only float32 "
          "scores (batch_matmul on the black list) bring it to float32's")


# %%
def main() -> None:
    p = argparse.ArgumentParser(description="Lesson 13: attention under AMP")
    p.add_argument("--quick", action="store_true",
                   help=f"{len(QUICK_SCALES)} score scales instead of {len(SCALES)}")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the figure")
    args = p.parse_args(script_args())    # a notebook kernel passes its own arguments
    out_folder(p, args.out)
    mf.set_backend("cpu")
    scales = QUICK_SCALES if args.quick else SCALES
    part1_ir()
    results = part2_cost(scales, args.out)
    part3_pin()
    part4_outcome(results, scales)


if __name__ == "__main__":
    main()
