"""``summary.md`` of the stability study: the headline table, then each experiment's model,
hyper-parameters and numbers, all computed from the run records in ``metrics.json``.

A run record (``stability.train_run``) holds its :class:`~miniflow.experiments.stability.RunSpec`
fields, ``seed``, per-run results (``final_test_accuracy``, ``skipped_fraction``,
``max_applied_scale``, ``final_nonfinite_params``, ``mean_underflow``, ``amp_nodes``) and the
series ``per_step``, ``evaluations`` and ``underflow``. Numbers in tables are means over seeds.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["POLICY_NAMES", "runs_of", "group", "mean_of", "log2_label", "headline_table",
           "summary_markdown"]

POLICY_NAMES = {"none": "fp32 training (no AMP)", "legacy": "legacy (OneFlow before PR 9126)",
                "cast_back": "cast_back (OneFlow PR 9126)", "fp32": "fp32 (miniflow default)"}
"""Display names of the run policies."""


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


def _max_applied(runs: list) -> str:
    """The largest scale applied on a step, over the seeds (``-`` if every step was skipped)."""
    values = [r["max_applied_scale"] for r in runs if r["max_applied_scale"] is not None]
    return log2_label(max(values) if values else None)


# ---------------------------------------------------------------------------------- tables
HEADLINE_LOG2_SCALES = (15, 16, 17, 20)


def headline_table(metrics: dict) -> str:
    """Per policy: test accuracy and skipped steps at static 2^15 .. 2^20, and under the dynamic
    scaler the largest scale applied on a step, the skipped steps and the accuracy."""
    static = group(runs_of(metrics, "static_sweep"), "policy", "scale")
    dynamic = group(runs_of(metrics, "dynamic"), "policy")
    header = (["policy"] + [f"static {'2^%d' % k}: accuracy (skipped)" for k in HEADLINE_LOG2_SCALES]
              + ["dynamic: largest applied scale", "dynamic: skipped", "dynamic: accuracy"])
    rows = []
    for policy, name in POLICY_NAMES.items():
        cells = [f"{_pct(mean_of(g, 'final_test_accuracy'))} ({_pct(mean_of(g, 'skipped_fraction'))})"
                 for g in (static[(policy, 2.0 ** k)] for k in HEADLINE_LOG2_SCALES)]
        d = dynamic[(policy,)]
        rows.append([name, *cells, _max_applied(d), _pct(mean_of(d, "skipped_fraction")),
                     _pct(mean_of(d, "final_test_accuracy"))])
    return _table(header, rows)


def _static_table(metrics: dict) -> str:
    runs = runs_of(metrics, "static_sweep")
    scales = sorted({r["scale"] for r in runs})
    g = group(runs, "policy", "scale")
    rows = [[POLICY_NAMES[p]] + [f"{_pct(mean_of(g[(p, s)], 'final_test_accuracy'))} "
                                 f"({_pct(mean_of(g[(p, s)], 'skipped_fraction'))})" for s in scales]
            for p in POLICY_NAMES]
    return _table(["policy \\ static scale"] + [log2_label(s) for s in scales], rows)


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
def summary_markdown(metrics: dict, figures: list) -> str:
    """The whole ``summary.md``; ``figures``: ``(file name, caption)`` pairs."""
    c = metrics["config"]
    head = (f"# Training stability with and without the loss-scale fix\n\n"
            f"Made by `miniflow stability` ({c['seeds']} seed(s), {c['steps']} steps per run, "
            f"backend `{c['backend']}`, {len(metrics['runs'])} runs in {c['seconds']:.0f} s). "
            f"Numbers are means over the seeds; the figures show min-max bands.\n\n"
            f"## Headline\n\nTest accuracy after {c['steps']} steps (and the fraction of skipped "
            f"steps) of the digits MLP, batch {c['batch_size']}, mean cross-entropy:\n\n"
            f"{headline_table(metrics)}\n")
    sections = [head] + [text.format(table=table(metrics), **c) for text, table in _SECTIONS]
    sections.append("## Figures\n\n" + "\n".join(f"- `{f}`: {cap}" for f, cap in figures) + "\n")
    sections.append(_NOTES.format(seeds_minus_one=c["seeds"] - 1, **c))
    return "\n".join(sections)


_COMMON = ("SGD, learning rate {lr}, momentum {momentum}, batch {batch_size} (last partial batch "
           "of each epoch dropped: 22 steps per epoch), {steps} steps, mean softmax cross-entropy; "
           "test accuracy on the 360 held-out digits in float32 from the float32 master weights")

_SECTIONS = [
    ("## Static scale sweep\n\nModel: the 64-128-10 ReLU MLP. " + _COMMON + ". Scaler: "
     "`StaticGradScaler(scale, max_consecutive_skips=10**9)`. AMP policies: `enable_amp(True, "
     "loss_scale_policy=...)`; \"fp32 training\" is AMP off with the same scaler. Cells: test "
     "accuracy (skipped steps).\n\n{table}\n", _static_table),
    ("## Dynamic scaler\n\nThe same MLP and training; `GradScaler(init_scale=2**16, "
     "growth_interval=25)` (growth 2, backoff 0.5, floor 1). \"legacy\" and \"cast_back\" cannot "
     "apply a step above 2^15: each growth to 2^16 overflows the float16 initial gradient and the "
     "step is skipped; \"fp32\" grows until real gradients overflow.\n\n{table}\n",
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
    ("## Skipping matters\n\nThe MLP; `StaticGradScaler(scale, skip_nonfinite=False)` applies "
     "steps with non-finite gradients, as a framework without the check would; \"skip\" is the "
     "default. legacy at 2^17 overflows on every step; fp32 at 2^20 only on some steps (real "
     "gradient overflow). " + _COMMON + ".\n\n{table}\n",
     lambda m: _label_table(m, "skipping", _columns("skipped steps",
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
  step); every {eval_every} steps `test_accuracy`; and the underflow probes. null stands for NaN or
  inf.
- Seeds 0..{seeds_minus_one} set the initial weights (`miniflow.manual_seed`) and the batch order.
"""
