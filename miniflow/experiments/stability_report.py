"""``summary.md`` of the stability study: the headline table, then each experiment's model,
hyper-parameters and numbers, all computed from the run records in ``metrics.json``.

A run record (``stability.train_run``) holds its :class:`~miniflow.experiments.stability.RunSpec`
fields, ``seed``, per-run results (``final_test_accuracy``, ``skipped_fraction``,
``max_applied_scale``, ``final_nonfinite_params``, ``first_nonfinite_step``,
``first_nonfinite_loss_step``, ``mean_underflow``, ``amp_nodes``) and the series ``per_step``,
``evaluations`` and ``underflow``. Numbers in tables are means over seeds.

The static sweep runs OneFlow's policies ("legacy", "cast_back") twice: without skipping non-finite
steps, as OneFlow does under a static loss scale (its rows say "as in OneFlow"), and with miniflow's
default ``StaticGradScaler``, which skips them (its rows say "miniflow's skip"). Its last row is
the experiment ``"bfloat16"``: "legacy" without skipping, with AMP in bfloat16.
"""
from __future__ import annotations

import math

import numpy as np

from .stability_grid import BF16_LABEL, CNN_LR, CNN_ROWS, ONEFLOW_POLICIES

__all__ = ["POLICY_NAMES", "STATIC_ROWS", "static_row_name", "runs_of", "group", "mean_of",
           "log2_label", "nan_steps", "headline_table", "summary_markdown"]

POLICY_NAMES = {"none": "fp32 training (no AMP)", "legacy": "legacy (OneFlow before PR 9126)",
                "cast_back": "cast_back (OneFlow PR 9126)", "fp32": "fp32 (miniflow's default)"}
"""Display names of the run policies."""

STATIC_ROWS = (("none", True), ("legacy", False), ("legacy", True), ("cast_back", False),
               ("cast_back", True), ("fp32", True))
"""``(policy, skip_nonfinite)`` of the static-sweep rows, in table order: each OneFlow policy as
OneFlow runs it (no skip), then with miniflow's skip."""


def static_row_name(policy: str, skip: bool) -> str:
    """The name of a static-sweep row: the policy, and for OneFlow's policies whose step-skipping
    it is (OneFlow never skips under a static scale; skipping is miniflow's default)."""
    if policy not in ONEFLOW_POLICIES:
        return POLICY_NAMES[policy]
    if skip:
        return f"{policy} + miniflow's skip (not OneFlow)"
    return f"{POLICY_NAMES[policy]}, as in OneFlow: no skip"


def runs_of(metrics: dict, experiment: str) -> list:
    """The records of one experiment, every seed."""
    return [r for r in metrics["runs"] if r["experiment"] == experiment]


def group(runs: list, *keys) -> dict:
    """``{(r[k] for k in keys): [records over seeds]}`` in first-seen order."""
    out: dict = {}
    for r in runs:
        out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return out


def mean_of(runs: list, field: str):
    """Mean of a per-run field over the runs where it is not None (None if it never is)."""
    values = [r[field] for r in runs if r[field] is not None]
    return float(np.mean(values)) if values else None


def log2_label(scale) -> str:
    """``2^17`` for 131072.0; ``-`` for None."""
    return "-" if scale is None else f"2^{int(round(math.log2(scale)))}"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _table(header: list, rows: list) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def nan_steps(runs: list, field: str = "first_nonfinite_step") -> str:
    """The step (range over seeds) whose update first made a weight NaN or inf (``field``
    ``"first_nonfinite_loss_step"``: whose loss was NaN or inf first), with how many seeds did so
    if not all; ``""`` if none did."""
    steps = [r[field] for r in runs if r[field] is not None]
    if not steps:
        return ""
    lo, hi = min(steps), max(steps)
    text = str(lo) if lo == hi else f"{lo}-{hi}"
    return text if len(steps) == len(runs) else f"{text} ({len(steps)} of {len(runs)} seeds)"


def _static_cell(runs: list) -> str:
    """``97.4%``; ``12.4% (100.0% skipped)``; or ``NaN at step 1: 10.0%`` (test accuracy after
    the weights became NaN or inf)."""
    acc = _pct(mean_of(runs, "final_test_accuracy"))
    nan = nan_steps(runs)
    if nan:
        return f"NaN at step {nan}: {acc}"
    skipped = mean_of(runs, "skipped_fraction")
    return f"{acc} ({_pct(skipped)} skipped)" if skipped else acc


def _max_applied(runs: list) -> str:
    """The largest scale applied on a step, over the seeds (``-`` if every step was skipped)."""
    values = [r["max_applied_scale"] for r in runs if r["max_applied_scale"] is not None]
    return log2_label(max(values) if values else None)


# ---------------------------------------------------------------------------------- tables
HEADLINE_LOG2_SCALES = (15, 16, 17, 20)


def _bf16_row(metrics: dict, scales) -> list:
    """The bfloat16 row (:data:`~miniflow.experiments.stability_grid.BF16_LABEL`): its name and static
    cells at ``scales``."""
    g = group(runs_of(metrics, "bfloat16"), "scale")
    return [BF16_LABEL] + [_static_cell(g[(s,)]) for s in scales]


def headline_table(metrics: dict) -> str:
    """Per static-sweep row (:data:`STATIC_ROWS`, then the bfloat16 row): the static cells
    (:func:`_static_cell`) at 2^15 .. 2^20; per policy, under the dynamic scaler (which skips in
    OneFlow and miniflow alike, so the "miniflow's skip" rows say "as above"; not run in
    bfloat16: "-"), the largest scale applied on a step, the skipped steps and the accuracy."""
    static = group(runs_of(metrics, "static_sweep"), "policy", "skip_nonfinite", "scale")
    dynamic = group(runs_of(metrics, "dynamic"), "policy")
    header = (["policy"] + [f"static {'2^%d' % k}" for k in HEADLINE_LOG2_SCALES]
              + ["dynamic: largest applied scale", "dynamic: skipped", "dynamic: accuracy"])
    rows = []
    for policy, skip in STATIC_ROWS:
        cells = [_static_cell(static[(policy, skip, 2.0 ** k)]) for k in HEADLINE_LOG2_SCALES]
        if policy in ONEFLOW_POLICIES and skip:
            dyn = ["as above"] * 3
        else:
            d = dynamic[(policy,)]
            dyn = [_max_applied(d), _pct(mean_of(d, "skipped_fraction")),
                   _pct(mean_of(d, "final_test_accuracy"))]
        rows.append([static_row_name(policy, skip), *cells, *dyn])
    rows.append(_bf16_row(metrics, [2.0 ** k for k in HEADLINE_LOG2_SCALES]) + ["-"] * 3)
    return _table(header, rows)


def _static_table(metrics: dict) -> str:
    runs = runs_of(metrics, "static_sweep")
    scales = sorted({r["scale"] for r in runs})
    g = group(runs, "policy", "skip_nonfinite", "scale")
    rows = [[static_row_name(p, k)] + [_static_cell(g[(p, k, s)]) for s in scales]
            for p, k in STATIC_ROWS] + [_bf16_row(metrics, scales)]
    return _table(["policy \\ static scale"] + [log2_label(s) for s in scales], rows)


def _oneflow_nan_table(metrics: dict) -> str:
    """The static runs without skipping (OneFlow's behaviour) whose weights became non-finite."""
    rows = []
    for (policy, scale), g in group([r for r in runs_of(metrics, "static_sweep")
                                     if not r["skip_nonfinite"]], "policy", "scale").items():
        if not nan_steps(g):
            continue
        rows.append([POLICY_NAMES[policy], log2_label(scale), nan_steps(g),
                     nan_steps(g, "first_nonfinite_loss_step") or "-",
                     _pct(mean_of(g, "final_nonfinite_params")),
                     _pct(mean_of(g, "final_test_accuracy"))])
    return _table(["policy (no skip, as in OneFlow)", "static scale",
                   "weights NaN or inf from step", "loss NaN from step",
                   "non-finite weights at the end", "test accuracy"], rows)


def _cnn_table(metrics: dict) -> str:
    """The LeNet's static sweep: one row per ``CNN_ROWS`` entry, then its AMP node counts."""
    runs = runs_of(metrics, "cnn_static_sweep")
    scales = sorted({r["scale"] for r in runs})
    g = group(runs, "policy", "skip_nonfinite", "scale")
    rows = [[static_row_name(p, k)] + [_static_cell(g[(p, k, s)]) for s in scales]
            + [_nodes(g[(p, k, scales[0])], "fp16"), _nodes(g[(p, k, scales[0])], "fp32")]
            for p, k in CNN_ROWS]
    return _table(["policy \\ static scale"] + [log2_label(s) for s in scales]
                  + ["fp16 nodes", "fp32 nodes"], rows)


def _dynamic_table(metrics: dict) -> str:
    rows = []
    for (policy,), g in group(runs_of(metrics, "dynamic"), "policy").items():
        final = [r["per_step"]["scale"][-1] for r in g]
        rows.append([POLICY_NAMES[policy], _max_applied(g), log2_label(min(final)) + " .. " +
                     log2_label(max(final)), _pct(mean_of(g, "skipped_fraction")),
                     _pct(mean_of(g, "final_test_accuracy"))])
    return _table(["policy", "largest scale on an applied step", "final scale (over seeds)",
                   "skipped steps", "test accuracy"], rows)


def _label_table(metrics: dict, experiment: str, columns: dict) -> str:
    """One row per label; ``columns``: header -> function(records over seeds) -> cell."""
    rows = [[label] + [fn(g) for fn in columns.values()]
            for (label,), g in group(runs_of(metrics, experiment), "label").items()]
    return _table(["run"] + list(columns), rows)


def _nodes(g: list, dtype: str):
    nodes = g[0]["amp_nodes"]
    return "-" if nodes is None else nodes[dtype]


_COLUMNS = {
    "fp16 nodes": lambda g: _nodes(g, "fp16"), "fp32 nodes": lambda g: _nodes(g, "fp32"),
    "skipped steps": lambda g: _pct(mean_of(g, "skipped_fraction")),
    "weights NaN or inf from step": lambda g: nan_steps(g) or "-",
    "non-finite weights at the end": lambda g: _pct(mean_of(g, "final_nonfinite_params")),
    "test accuracy": lambda g: _pct(mean_of(g, "final_test_accuracy")),
}


def _columns(*names) -> dict:
    return {n: _COLUMNS[n] for n in names}


def _underflow_section(metrics: dict) -> str:
    """The underflow table and, measured, what no scaling costs in each regime."""
    g = group(runs_of(metrics, "underflow"), "label", "scale")
    lines = [f"Without scaling (scale 1), \"{label}\" loses "
             f"{_pct(mean_of(g[(label, 1.0)], 'mean_underflow'))} of its non-zero gradient "
             f"elements and reaches {_pct(mean_of(g[(label, 1.0)], 'final_test_accuracy'))} test "
             f"accuracy (best over the scales: "
             f"{_pct(max(mean_of(g[k], 'final_test_accuracy') for k in g if k[0] == label))})."
             for label in dict.fromkeys(k[0] for k in g)]
    return _underflow_table(metrics) + "\n\n" + " ".join(lines)


def _underflow_table(metrics: dict) -> str:
    runs = runs_of(metrics, "underflow")
    labels = list(group(runs, "label"))
    scales = sorted({r["scale"] for r in runs})
    g = group(runs, "label", "scale")
    rows = [[log2_label(s)] + [f"{_pct(mean_of(g[(label, s)], 'mean_underflow'))} / "
                               f"{_pct(mean_of(g[(label, s)], 'final_test_accuracy'))}"
                               for (label,) in labels] for s in scales]
    return _table(["static scale"] + [f"{label}: underflow / accuracy" for (label,) in labels],
                  rows)


# ---------------------------------------------------------------------------------- document
_CPU = ("The numbers depend on the CPU: its vector width and fused multiply-adds decide the "
        "roundings of every kernel (as does `NUMBA_CPU_NAME`), so on another CPU some cells move by "
        "a tenth of a point or more (the float16 and bfloat16 rows most); which policies give NaN, "
        "skip every step or train does not change.")
"""What the summary says about the CPU it was made on (``config["cpu"]``)."""


def summary_markdown(metrics: dict, figures: list) -> str:
    """The whole ``summary.md``; ``figures``: ``(file name, caption)`` pairs."""
    c = metrics["config"]
    head = (f"# Training stability with and without the loss-scale fix\n\n"
            f"Made by `miniflow stability` ({c['seeds']} seed(s), {c['steps']} steps per run, "
            f"backend `{c['backend']}`, {len(metrics['runs'])} runs in {c['seconds']:.0f} s) on "
            f"{c.get('cpu', 'a CPU it did not record')}. Numbers are means over the seeds; the "
            f"figures show min-max bands. " + _CPU + "\n\n"
            f"## Headline\n\nTest accuracy of the digits MLP after {c['steps']} steps, batch "
            f"{c['batch_size']}, mean cross-entropy. " + _CELLS + "\n\n"
            f"{headline_table(metrics)}\n\n" + _READING)
    sections = [head] + [text.format(table=table(metrics), **c) for text, table in _SECTIONS]
    sections.append("## Figures\n\n" + "\n".join(f"- `{f}`: {cap}" for f, cap in figures) + "\n")
    sections.append(_NOTES.format(seeds_minus_one=c["seeds"] - 1, **c))
    return "\n".join(sections)


_CELLS = ("Static cells: the test accuracy, with the fraction of skipped steps where steps were "
          "skipped; \"NaN at step n\" where the update of step n made the weights NaN or inf "
          "(they stay so, and the NaN model's arg-max is class 0 for every test image).")

_READING = (
    "**What OneFlow does.** With a static loss scale OneFlow never skips a step: its autograd "
    "pass counts non-finite gradients (`CountNotFiniteIfNeeded`) and its optimizer passes make "
    "the update ops skip on that count (`SetDynamicLossScaleSkipIf`) only when a dynamic "
    "loss-scale policy is configured. Above 65504 the scaled float16 initial gradient is inf under "
    "\"legacy\" and \"cast_back\", and OneFlow applies the inf/NaN update: the rows \"as in "
    "OneFlow: no skip\" have NaN weights after step 1. The rows \"+ miniflow's skip (not "
    "OneFlow)\" are the same policies with miniflow's default `StaticGradScaler`, which skips "
    "non-finite steps: the weights stay finite but never change, so the model stays at its "
    "random start. With a dynamic scaler OneFlow does skip and halve the scale, as miniflow does: "
    "\"legacy\" and \"cast_back\" never apply a step above 2^15. \"fp32\" is miniflow's own "
    "design: the autograd pass puts `amp_black_identity` (an op PR 9126 added) on the initial "
    "gradient, so the scale multiplies in float32; OneFlow itself never inserts that op "
    "there. The last row is \"legacy\" as in OneFlow (no skip) with AMP in bfloat16 "
    "(`enable_amp(True, dtype=miniflow.bfloat16)`): its initial gradient is bfloat16, which has "
    "float32's exponent range, so no scale of the sweep overflows it and every static scale "
    "trains: bfloat16 retired this class of bug.\n")

_COMMON = ("SGD, learning rate {lr}, momentum {momentum}, batch {batch_size} (last partial batch "
           "of each epoch dropped: 22 steps per epoch), {steps} steps, mean softmax cross-entropy; "
           "test accuracy on the 360 held-out digits in float32 from the float32 master weights")

_SECTIONS = [
    ("## Static scale sweep\n\nModel: the 64-128-10 ReLU MLP. " + _COMMON + ". Scaler: "
     "`StaticGradScaler(scale, skip_nonfinite=False, max_consecutive_skips=10**9)` in the rows "
     "\"as in OneFlow: no skip\" (OneFlow applies non-finite steps under a static scale), "
     "`StaticGradScaler(scale, max_consecutive_skips=10**9)` (miniflow's default: skip) in the "
     "others. AMP policies: `enable_amp(True, loss_scale_policy=...)` (float16), and in the last "
     "row `enable_amp(True, dtype=miniflow.bfloat16, loss_scale_policy=\"legacy\")`; \"fp32 "
     "training\" is AMP off with the same scaler. " + _CELLS + "\n\n{table}\n",
     lambda m: _static_table(m) + "\n\nThe runs without skipping whose weights became NaN or "
     "inf (the loss is NaN from the next step on):\n\n" + _oneflow_nan_table(m)),
    ("## Dynamic scaler\n\nThe same MLP and training; `GradScaler(init_scale=2**16, "
     "growth_interval=25)` (growth 2, backoff 0.5, floor 1). A dynamic scaler skips non-finite "
     "steps in OneFlow too (the count is the update ops' `skip_if`), so these are OneFlow's "
     "results for \"legacy\" and \"cast_back\": they cannot apply a step above 2^15, since each "
     "growth to 2^16 overflows the float16 initial gradient and the step is skipped and the scale "
     "halved; \"fp32\" grows until real gradients overflow.\n\n{table}\n",
     _dynamic_table),
    ("## Gray-path control: black_identity\n\nModel: `EnergyShareMLP`: Linear(64, 128) -> ReLU -> "
     "energy share `128 * h^2 / sum(h^2)` (scale-invariant) -> Linear(128, 10), on raw pixel "
     "intensities 0..16. The energy share is gray ops between two matmuls, so AMP runs it in "
     "float16. Within a few steps a sample's sum of squares passes 65504: in float16 it is inf, the "
     "features h^2 / inf become 0, and once an activation passes 256, inf / inf = NaN and the "
     "step is skipped. \"AMP + black_identity\" puts "
     "`amp.black_identity` on h, pinning the chain and its gradient to float32. " + _COMMON +
     "; `StaticGradScaler(2**10, max_consecutive_skips=10**9)`, policy fp32.\n\n{table}\n",
     lambda m: _label_table(m, "gray_path", _columns("fp16 nodes", "fp32 nodes", "skipped steps",
                                                      "test accuracy"))),
    ("## Harmless gray chain: white_identity\n\nModel: `TemperatureMLP`: the MLP with logits / 2. "
     "AMP leaves the output bias_add and the scaling in float32; `amp.white_identity` after them "
     "moves them (and their gradients) to float16. Node counts are the AMP pass's decisions (amp "
     "identities excluded), before later passes fuse or prune nodes. " + _COMMON +
     "; `StaticGradScaler(2**10)`, policy fp32.\n\n{table}\n",
     lambda m: _label_table(m, "white_identity", _columns("fp16 nodes", "fp32 nodes",
                                                          "test accuracy"))),
    ("## Why loss scaling: float16 gradient underflow\n\nThe MLP under AMP (policy fp32, "
     "`StaticGradScaler(scale)`). Underflow: every 11 steps, the same step (same weights and "
     "batch) is run in float32 without AMP; of the gradient elements that are non-zero there, the "
     "fraction that are zero in the float16 gradients (before the cast to float32) is lost to "
     "underflow (mean over the run). \"plain digits\" is the setup of the other experiments. "
     "\"small gradients\" multiplies the loss by 2^-20 and the learning rate by 2^20: in float32 "
     "the same training bit for bit (only powers of two change), but every gradient is 2^20 times "
     "smaller, as in a model whose loss is a mean over many more terms or is weighted down. " +
     _COMMON +
     ". Cells: underflow / test accuracy.\n\n{table}\n", _underflow_section),
    ("## A convolutional network with batch norm\n\nModel: `DigitsLeNet`, "
     "`miniflow.models.lenet` on the 8x8 digits as 1x8x8 images: conv 3x3 (1 -> 16) -> batch "
     "norm -> ReLU -> 2x2 max pool -> conv 3x3 (16 -> 32) -> batch norm -> ReLU -> 2x2 max pool "
     "-> Linear(128, 64) -> ReLU -> Linear(64, 10). Under AMP (OneFlow's lists) the convolutions "
     "and their gradients are white (float16), batch norm is gray between them and runs in "
     "float16 too, with its moving statistics, gamma and beta left float32 (OneFlow's no-cast "
     "inputs) and its batch statistics computed in float32; relu and max pool are clear. The "
     "running statistics are updated in the graph in training mode, and the test accuracy is "
     "measured in eval mode (running statistics). The scalers are the static sweep's: OneFlow's "
     "policies as OneFlow runs them (no skip), the others with miniflow's skip. SGD, learning "
     "rate " + str(CNN_LR) + ", momentum {momentum}, batch {batch_size}, {cnn_steps} steps "
     "(at most; fewer if the study runs fewer). The bug is the MLP's: the float16 initial gradient is inf above 65504 under "
     "\"legacy\" and \"cast_back\", the update makes the weights NaN, and so does batch norm's "
     "next update of its running statistics.\n\n{table}\n", _cnn_table),
    ("## Skipping matters\n\nThe MLP; `StaticGradScaler(scale, skip_nonfinite=False)` applies "
     "steps with non-finite gradients, as OneFlow does under any static loss scale; \"skip\" is "
     "miniflow's default. legacy at 2^17 overflows on every step; fp32 at 2^20 only on some steps "
     "(real gradient overflow). " + _COMMON + ".\n\n{table}\n",
     lambda m: _label_table(m, "skipping", _columns("skipped steps", "weights NaN or inf from step",
                                                    "non-finite weights at the end",
                                                    "test accuracy"))),
]

_NOTES = """## Notes

- Every `StaticGradScaler` here has `max_consecutive_skips=10**9`: a static scaler counts every
  skipped step as a skip at the floor, so with the default (64) a run that skips every step would
  stop with `NonFiniteGradientsError` after 64 steps instead of showing 100% skipped.
- "legacy" and "cast_back" with a scale above 65504 emit a `LossScaleOverflowWarning` when the
  graph compiles; that is expected here and filtered, as are NumPy's warnings about NaN and inf.
- `metrics.json` holds every run: its settings, per-step `loss` (mean cross-entropy), `scale`
  (the scale the step used), `skipped` (1 = not applied), `grad_norm` (L2 norm of all unscaled
  float32 gradients), `fp16_zero_fraction` (exact zeros among the float16 gradient elements,
  structural zeros included; null without AMP), `nonfinite_params` (NaN or inf weights after the
  step); every {eval_every} steps `test_accuracy`; the underflow probes; and per run
  `first_nonfinite_step` (the step whose update first made a weight NaN or inf) and
  `first_nonfinite_loss_step` (the first step whose loss was NaN or inf), null if none. In the
  series null stands for NaN or inf.
- Seeds 0..{seeds_minus_one} set the initial weights (`miniflow.manual_seed`) and the batch order.
"""
