"""Figures of the stability study (matplotlib, Agg backend), one finding per figure, drawn from the
run records of ``metrics.json`` (see ``stability_report``).

Curves over seeds are drawn as the mean with a min-max band; scales are on log2 axes. Each figure
function returns its caption; :func:`plot_all` writes every PNG and returns ``(name, caption)``.
"""
from __future__ import annotations

import io
import math
import os
import textwrap
from pathlib import Path

import numpy as np

from ..serialization import write_atomic
from .stability_grid import BF16_LABEL, ONEFLOW_POLICIES
from .stability_report import (POLICY_NAMES, group, log2_label, nan_steps, runs_of,
                                 static_row_name)

__all__ = ["plot_all", "save_png"]

STYLE = {"none": dict(color="black", marker="s", linestyle="-"),
         "legacy": dict(color="tab:red", marker="x", linestyle="--"),
         "cast_back": dict(color="tab:orange", marker="o", linestyle=":", fillstyle="none"),
         "fp32": dict(color="tab:blue", marker="^", linestyle="-")}
"""Line style per run policy (legacy and cast_back coincide, so they differ in marker and dash)."""
BF16_STYLE = dict(color="tab:green", marker="*", linestyle="-.", markersize=9)
"""Line style of the bfloat16 row of the static sweep."""


def _static_style(policy: str, skip: bool) -> dict:
    """:data:`STYLE` of the policy; for OneFlow's policies a thick line as OneFlow runs them (no
    skip) and a thin dotted one, hollow markers, with miniflow's skip."""
    style = dict(STYLE[policy])
    if policy in ONEFLOW_POLICIES:
        style.update(dict(linewidth=2.6) if not skip else
                     dict(linewidth=1.2, linestyle=(0, (1, 2)), fillstyle="none", markersize=9,
                          marker="s" if policy == "legacy" else "D"))
    return style

RUN_COLORS = ("black", "tab:red", "tab:blue", "tab:green")


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _title(fig, title: str, width_in: float) -> None:
    """The figure's title (its finding), wrapped to the figure's width."""
    fig.suptitle(textwrap.fill(title, width=int(10 * width_in)), fontsize=12)


def _figure(ncols: int, title: str, height: float = 4.4, col_width: float = 6.2):
    width = max(col_width * ncols, 9.0)
    fig, axes = _plt().subplots(1, ncols, figsize=(width, height), squeeze=False)
    _title(fig, title, width)
    return fig, list(axes[0])


def save_png(fig, path, dpi: int, owner: str) -> str:
    """Write matplotlib figure ``fig`` to ``path`` as PNG, atomically (``write_atomic``: the
    old file or the new one, never a part, also when the job is interrupted; a folder there
    is an error naming ``owner`` and the file), and close it. Returns ``path``."""
    data = io.BytesIO()
    fig.savefig(data, format="png", dpi=dpi)
    _plt().close(fig)
    write_atomic(path, data.getvalue(), owner, os.path.basename(path))
    return path


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    save_png(fig, path, 110, "miniflow.experiments.stability_plots")


def _band(ax, x, rows, label, **style):
    """Mean of ``rows`` (one sequence per seed; None = missing) with a min-max band."""
    a = np.array([[np.nan if v is None else v for v in r] for r in rows], dtype=float)
    with np.errstate(all="ignore"):
        mean, lo, hi = np.nanmean(a, 0), np.nanmin(a, 0), np.nanmax(a, 0)
    ax.plot(x, mean, label=label, **style)
    ax.fill_between(x, lo, hi, color=style.get("color"), alpha=0.15, linewidth=0)


def _log2_axis(ax, values, fp16_max: bool = False) -> None:
    """x = log2 of the loss scale, ticked at the scales run; optionally a line at 65504."""
    ax.set_xlabel("loss scale, log2 (k means a scale of 2^k)")
    ax.set_xticks(sorted({int(v) for v in values}))
    if fp16_max:
        x = math.log2(65504)
        ax.axvline(x, color="gray", linewidth=0.8)
        ax.text(x + 0.2, 45, "65504\n(float16 max)", color="gray", ha="left", va="center",
                fontsize=8)


def _percent_axis(ax, label: str) -> None:
    ax.set_ylabel(label)
    ax.set_ylim(-3, 105)
    ax.grid(alpha=0.3)


def _series(runs, part: str, field: str) -> list:
    return [r[part][field] for r in runs]


def _pct_rows(rows) -> list:
    return [[None if v is None else 100 * v for v in r] for r in rows]


def _against_scale(panels, runs: list, label: str, **style) -> None:
    """Per-run fields in % against log2(scale), a band over seeds in each ``(ax, field)`` panel."""
    by_scale = group(runs, "scale")
    k = [math.log2(s) for (s,) in by_scale]
    for ax, field in panels:
        per_seed = list(zip(*([r[field] for r in rs] for rs in by_scale.values())))
        _band(ax, k, _pct_rows(per_seed), label, **style)


def _accuracy_band(ax, runs, label, **style) -> None:
    """Test accuracy (%) at the evaluation steps, over seeds."""
    _band(ax, runs[0]["evaluations"]["step"],
          _pct_rows(_series(runs, "evaluations", "test_accuracy")), label, marker=".", **style)


# ---------------------------------------------------------------------------------- figures
def static_sweep(metrics: dict, path: Path) -> str:
    runs = runs_of(metrics, "static_sweep")
    oneflow_nan = [r for r in runs if r["policy"] in ONEFLOW_POLICIES and not r["skip_nonfinite"]
                   and r["first_nonfinite_step"] is not None]
    step = nan_steps(oneflow_nan) or "-"
    above = log2_label(min(r["scale"] for r in oneflow_nan)) if oneflow_nan else "-"
    fig, (acc, bad, skip) = _figure(
        3, f"Static loss scale {above} and above (float16 max 65504): OneFlow never skips a step "
        f"under a static scale, so legacy and cast_back apply the inf update and the weights are "
        f"NaN after step {step}. miniflow's skip keeps them finite but untrained; fp32 (miniflow) "
        f"trains, and so does legacy without skipping in bfloat16", height=4.8, col_width=5.4)
    panels = ((acc, "final_test_accuracy"), (bad, "final_nonfinite_params"),
              (skip, "skipped_fraction"))
    for (policy, skip_nonfinite), g in group(runs, "policy", "skip_nonfinite").items():
        _against_scale(panels, g, static_row_name(policy, skip_nonfinite),
                       **_static_style(policy, skip_nonfinite))
    _against_scale(panels, runs_of(metrics, "bfloat16"), BF16_LABEL, **BF16_STYLE)
    for ax in (acc, bad, skip):
        _log2_axis(ax, [math.log2(r["scale"]) for r in runs], fp16_max=True)
    if oneflow_nan:
        bad.text(math.log2(min(r["scale"] for r in oneflow_nan)) - 0.8, 80,
                 f"legacy, cast_back\nas in OneFlow (no skip):\nNaN after step {step}",
                 color=STYLE["legacy"]["color"], ha="right", va="center", fontsize=8)
    _percent_axis(acc, f"test accuracy after {metrics['config']['steps']} steps (%)")
    _percent_axis(bad, "NaN or inf weights at the end (%)")
    _percent_axis(skip, "skipped steps (%)")
    acc.legend(loc="lower left", fontsize=7)
    _save(fig, path)
    return ("test accuracy, non-finite weights and skipped steps against the static loss scale: "
            "OneFlow's policies as OneFlow runs them (no skip) and with miniflow's skip, and "
            "legacy without skipping in bfloat16 (headline)")


def cnn_static_sweep(metrics: dict, path: Path) -> str:
    """The static sweep of the digits LeNet (convolutions, batch norm, max pools)."""
    runs = runs_of(metrics, "cnn_static_sweep")
    oneflow_nan = [r for r in runs if r["policy"] in ONEFLOW_POLICIES
                   and r["first_nonfinite_step"] is not None]
    step = nan_steps(oneflow_nan) or "-"
    above = log2_label(min(r["scale"] for r in oneflow_nan)) if oneflow_nan else "-"
    steps = runs[0]["evaluations"]["step"][-1]
    fig, (acc, bad) = _figure(
        2, f"A CNN with batch norm (LeNet, {steps} steps): from a static scale of {above}, "
        f"legacy and cast_back as in OneFlow make the weights (and batch norm's running "
        f"statistics) NaN after step {step}; fp32 (miniflow) trains like float32", height=4.8,
        col_width=5.8)
    for (policy, skip_nonfinite), g in group(runs, "policy", "skip_nonfinite").items():
        _against_scale(((acc, "final_test_accuracy"), (bad, "final_nonfinite_params")), g,
                       static_row_name(policy, skip_nonfinite),
                       **_static_style(policy, skip_nonfinite))
    for ax in (acc, bad):
        _log2_axis(ax, [math.log2(r["scale"]) for r in runs], fp16_max=True)
    _percent_axis(acc, f"test accuracy after {steps} steps (%)")
    _percent_axis(bad, "NaN or inf weights at the end (%)")
    acc.legend(loc="lower left", fontsize=7)
    _save(fig, path)
    return ("the static sweep on the digits LeNet with batch norm (float16 convolutions, float32 "
            "batch-norm statistics): test accuracy and non-finite weights against the scale")


def dynamic_scale(metrics: dict, path: Path) -> str:
    from matplotlib.ticker import MaxNLocator

    g = group([r for r in runs_of(metrics, "dynamic") if r["seed"] == 0 and r["policy"] != "none"],
              "policy")
    fig, axes = _plt().subplots(len(g), 1, figsize=(10, 2.2 * len(g) + 1.2), sharex=True,
                                sharey=True, squeeze=False)
    _title(fig, "Dynamic scaler from 2^16 (it skips non-finite steps in OneFlow too): legacy and "
           "cast_back never apply a step above 2^15; fp32 grows until real gradients overflow", 10)
    for ax, ((policy,), (run,)) in zip(axes[:, 0], g.items()):
        s = np.log2(run["per_step"]["scale"])
        skipped = np.flatnonzero(run["per_step"]["skipped"])
        ax.step(np.arange(len(s)), s, where="post", color=STYLE[policy]["color"],
                label=POLICY_NAMES[policy])
        ax.plot(skipped, s[skipped], "x", color="tab:red", markersize=5,
                label=f"skipped step ({len(skipped)})")
        ax.axhline(15, color="gray", linewidth=0.8, linestyle=":")
        ax.set_ylabel("loss scale, log2")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(loc="upper left", fontsize=8, ncol=2)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("training step (seed 0)")
    _save(fig, path)
    return ("log2 of the dynamic loss scale over the steps under AMP, skipped steps marked "
            "(seed 0; without AMP the scale grows every 25 steps without bound, see the table)")


def _epoch_means(losses: list, per_epoch: int) -> list:
    n = len(losses) // per_epoch * per_epoch
    a = np.array([np.nan if v is None else v for v in losses[:n]]).reshape(-1, per_epoch)
    return list(np.nanmean(a, 1)) if n else []


def dynamic_loss(metrics: dict, path: Path) -> str:
    per_epoch = min(metrics["config"]["eval_every"], metrics["config"]["steps"])
    fig, (ax,) = _figure(1, "With a dynamic scaler every policy trains: the loss curves overlap "
                         "(legacy and cast_back lose one step per growth attempt)")
    for (policy,), runs in group(runs_of(metrics, "dynamic"), "policy").items():
        rows = [_epoch_means(r["per_step"]["loss"], per_epoch) for r in runs]
        x = [(i + 1) * per_epoch for i in range(len(rows[0]))]
        _band(ax, x, rows, POLICY_NAMES[policy], **STYLE[policy])
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel(f"training loss, mean over {per_epoch} steps")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    _save(fig, path)
    return "training loss (mean per epoch) under the dynamic scaler, per policy"


def _labelled(metrics: dict, experiment: str) -> list:
    """``(label, runs over seeds, style)`` of one experiment; earlier labels get wider lines, so
    curves that coincide stay visible."""
    items = group(runs_of(metrics, experiment), "label").items()
    return [(label, runs, dict(color=RUN_COLORS[i % len(RUN_COLORS)], linewidth=max(3.6 - i, 1.2)))
            for i, ((label,), runs) in enumerate(items)]


def _accuracy_curves(ax, metrics: dict, experiment: str) -> None:
    for label, runs, style in _labelled(metrics, experiment):
        _accuracy_band(ax, runs, label, **style)
    ax.set_xlabel("training step")
    _percent_axis(ax, "test accuracy (%)")
    ax.legend(fontsize=8, loc="center right")


def _skipped_so_far(skipped: list) -> np.ndarray:
    """Per step, the % of the steps so far that were skipped."""
    return 100 * np.cumsum(skipped) / np.arange(1, len(skipped) + 1)


def gray_path(metrics: dict, path: Path) -> str:
    fig, (acc, skip) = _figure(2, "A float16 sum of squares overflows: without black_identity "
                               "most steps are skipped; pinned to float32 the model trains")
    _accuracy_curves(acc, metrics, "gray_path")
    for label, runs, style in _labelled(metrics, "gray_path"):
        rows = [_skipped_so_far(r["per_step"]["skipped"]) for r in runs]
        _band(skip, np.arange(1, len(rows[0]) + 1), rows, label, **style)
    skip.set_xlabel("training step")
    _percent_axis(skip, "skipped steps so far (%)")
    skip.legend(fontsize=8)
    _save(fig, path)
    return ("energy-share model: test accuracy and skipped steps with and without "
            "amp.black_identity (and without AMP)")


def white_identity(metrics: dict, path: Path) -> str:
    fig, (bars, acc) = _figure(2, "white_identity moves a harmless gray chain to float16: more "
                               "float16 nodes, the same accuracy")
    items = _labelled(metrics, "white_identity")
    x = np.arange(len(items))
    for off, dtype, color in ((-0.2, "fp16", "tab:blue"), (0.2, "fp32", "tab:gray")):
        counts = [runs[0]["amp_nodes"][dtype] for _, runs, _ in items]
        b = bars.bar(x + off, counts, width=0.4, color=color, label=f"{dtype} nodes")
        bars.bar_label(b)
    bars.set_xticks(x)
    bars.set_xticklabels([label for label, _, _ in items])
    bars.set_ylabel("nodes the AMP pass colored (count)")
    bars.legend(fontsize=8)
    _accuracy_curves(acc, metrics, "white_identity")
    _save(fig, path)
    return "temperature-scaled MLP: AMP node counts and test accuracy with and without white_identity"


def underflow(metrics: dict, path: Path) -> str:
    fig, (lost, acc) = _figure(2, "Without loss scaling, small gradients underflow in float16; a "
                               "large enough scale recovers them, too large a one overflows. "
                               "Plain digits barely needs scaling")
    for i, ((label,), runs) in enumerate(group(runs_of(metrics, "underflow"), "label").items()):
        _against_scale(((lost, "mean_underflow"), (acc, "final_test_accuracy")), runs, label,
                       color=RUN_COLORS[(i + 2) % len(RUN_COLORS)], marker="o")
    for ax in (lost, acc):
        _log2_axis(ax, [math.log2(r["scale"]) for r in runs_of(metrics, "underflow")])
        ax.legend(fontsize=8)
    _percent_axis(lost, "non-zero gradient elements lost to underflow (%)")
    _percent_axis(acc, "test accuracy (%)")
    _save(fig, path)
    return "float16 gradient underflow and test accuracy against the static loss scale"


def skipping(metrics: dict, path: Path) -> str:
    fig, (bad, acc) = _figure(2, "Without skipping (OneFlow under a static scale), the first "
                              "overflowing step turns the weights to NaN for good; with miniflow's "
                              "skip they stay finite")
    for label, runs, widths in _labelled(metrics, "skipping"):
        style = dict(widths, color=STYLE[runs[0]["policy"]]["color"],
                     linestyle="-" if runs[0]["skip_nonfinite"] else "--")
        rows = _pct_rows(_series(runs, "per_step", "nonfinite_params"))
        _band(bad, np.arange(1, len(rows[0]) + 1), rows, label, **style)
        _accuracy_band(acc, runs, label, **style)
    bad.set_xscale("log")
    bad.set_xlabel("training step (log scale)")
    _percent_axis(bad, "non-finite weights after the step (%)")
    acc.set_xlabel("training step")
    _percent_axis(acc, "test accuracy (%)")
    for ax in (bad, acc):
        ax.legend(fontsize=8, loc="center right")
    _save(fig, path)
    return "non-finite weights and test accuracy with and without step skipping"


FIGURES = {"static_sweep.png": static_sweep, "dynamic_scale.png": dynamic_scale,
           "dynamic_loss.png": dynamic_loss, "gray_path.png": gray_path,
           "white_identity.png": white_identity, "underflow.png": underflow,
           "skipping.png": skipping, "cnn_static_sweep.png": cnn_static_sweep}


def plot_all(metrics: dict, out: Path) -> list:
    """Write every figure into ``out``; returns ``(file name, caption)`` pairs."""
    return [(name, fn(metrics, out / name)) for name, fn in FIGURES.items()]
