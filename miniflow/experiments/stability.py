"""The training-stability study behind ``miniflow stability``: the digits MLP trained under every
loss-scale policy, with static and dynamic loss scales, four controls, and the static sweep again
on a convolutional network with batch norm (the digits LeNet).

What: each run trains a model with SGD on the bundled digits data and records, per step, the loss,
the loss scale used, whether the step was skipped, the gradient norm, the fraction of zero float16
gradient elements and of non-finite weights; every epoch the test accuracy; and the first step whose
update made a weight NaN or inf. :func:`run_study` runs the experiments of
:func:`experiment_specs` for several seeds and writes ``metrics.json``, ``summary.md``
(``stability_report``) and the figures (``stability_plots``).

Why: OneFlow before PR 9126 built the loss scale in the dtype of the initial gradient
(``ones_like(loss)``, float16 under AMP), so any scale above 65504 became inf; the PR multiplies in
float32 but casts the product back to float16, which still overflows above 65504. What happens next
depends on the scaler, in OneFlow's ``autograd.cpp`` and ``optimizer.cpp``:

* static scale (``loss_scale_factor``): ``CountNotFiniteIfNeeded`` and
  ``SetDynamicLossScaleSkipIf`` return early without a dynamic policy, so nothing counts the
  non-finite gradients and no update is skipped: the inf/NaN update is applied and the weights are
  NaN after step 1. The sweep runs this as ``StaticGradScaler(scale, skip_nonfinite=False)``
  (:data:`ONEFLOW_POLICIES`), next to miniflow's safer default that skips;
* dynamic scale: the count is the update ops' ``skip_if``; the step is skipped and the scale halved,
  so a dynamic scaler never applies a step above 2^15.

bfloat16 retires this class of bug: its exponent range is float32's, so the same "legacy" policy
without skipping (experiment ``"bfloat16"``, :data:`BF16_LABEL`) trains at every static scale of
the sweep.

miniflow's default policy ("fp32") is miniflow's own design: it puts the ``amp_black_identity`` op
that PR 9126 added on the initial gradient, so AMP keeps the loss-gradient path in float32
(OneFlow itself never inserts that op there; docs/architecture.md, "Loss scaling is a pass").

Source: OneFlow PR 9126 "Fix loss scale precision" (``oneflow/core/job_rewriter/autograd.cpp``:
``ScaleInitialDiffByLossScale``, ``CountNotFiniteIfNeeded``; ``optimizer.cpp``:
``SetDynamicLossScaleSkipIf``); Micikevicius et al., "Mixed Precision Training", ICLR 2018 (loss
scaling against fp16 underflow).
"""
from __future__ import annotations

import json
import math
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .. import nn
from ..amp import GradScaler, StaticGradScaler, black_identity, white_identity
from ..models import lenet
from ..data import batches, load_digits
from ..extras import require
from ..logging import ScalarWriter, grad_norm, run_dir, unscaled_gradients
from ..ops.amp_ops import AMP_IDENTITY_OPS
from ..optim import SGD
from ..passes.loss_scale import LossScaleOverflowWarning
from ..random import manual_seed
from ..runtime.backend import get_backend
from ..serialization import write_atomic
from .machine import cpu_description
from .mlp import EvalGraph, TrainGraph, accuracy, mlp
from .stability_grid import (BF16_LABEL, CNN_LOG2_SCALES, CNN_LR, CNN_ROWS, ONEFLOW_POLICIES,
                             POLICIES, SMALL_LOSS_LOG2_WEIGHT, SWEEP_LOG2_SCALES,
                             UNDERFLOW_LOG2_SCALES)
from .stability_plots import FIGURES

__all__ = ["StudyConfig", "QUICK", "RunSpec", "experiment_specs", "train_run", "run_study",
           "check_out_dir", "OUTPUT_FILES", "OutputDirError", "EnergyShareMLP", "TemperatureMLP",
           "DigitsLeNet", "POLICIES", "ONEFLOW_POLICIES", "first_step", "run_name"]

BATCH_SIZE, LR, MOMENTUM = 64, 0.1, 0.9
STEPS_PER_EPOCH = 22                    # 1,437 training images, batches of 64, last one dropped
DYNAMIC_INIT_SCALE, GROWTH_INTERVAL = 2.0 ** 16, 25
GRAY_PATH_SCALE = 2.0 ** 10
NEVER_RAISE = 10 ** 9
"""``max_consecutive_skips`` of every static scaler here: a run that skips every step runs to the
end (the default, 64, raises ``NonFiniteGradientsError`` after 64 skipped steps)."""


@dataclass(frozen=True)
class StudyConfig:
    """How much to run: ``seeds`` seeds (0 .. seeds-1) of ``steps`` training steps per run (any
    number, also less than an epoch; the LeNet runs at most ``cnn_steps``: two epochs take it to
    about 90% test accuracy and keep the study within half again of its MLP-only wall time), test
    accuracy every ``eval_every`` steps and after the last, the fp32 underflow reference every
    ``probe_every`` steps.

    Raises:
        ValueError: a field that is not an integer >= 1 (named, with its value).
    """

    seeds: int = 3
    steps: int = 30 * STEPS_PER_EPOCH
    cnn_steps: int = 2 * STEPS_PER_EPOCH
    eval_every: int = STEPS_PER_EPOCH
    probe_every: int = 11

    def __post_init__(self):
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"StudyConfig.{name} must be an integer >= 1, got {value!r}")


QUICK = StudyConfig(seeds=1, steps=10 * STEPS_PER_EPOCH, cnn_steps=STEPS_PER_EPOCH)
"""``miniflow stability --quick`` (CI)."""


@dataclass(frozen=True)
class RunSpec:
    """One training run of an experiment (the seed aside).

    Attributes:
        experiment, label: where the run belongs and its name in tables and legends.
        policy: a :data:`POLICIES` key. model: a :data:`MODELS` key.
        scale: the static scale, or the initial scale when ``dynamic``.
        dynamic: ``GradScaler(scale, growth_interval=25)`` instead of ``StaticGradScaler(scale)``.
        skip_nonfinite: the static scaler's flag (False: non-finite steps are applied, as OneFlow
            does under any static scale; True: miniflow's default).
        loss_log2_weight: the loss is multiplied by 2^w and the learning rate by 2^-w (in float32
            the same training, bit for bit: only powers of two change).
        probe_underflow: measure the fp16 gradient underflow against a float32 reference.
        cnn: a LeNet run, of at most the study's ``cnn_steps`` steps.
        lr: SGD's learning rate (:data:`LR`; the LeNet's :data:`CNN_LR`).
        amp_dtype: AMP's half type, ``"float16"`` or ``"bfloat16"`` (``enable_amp(dtype=...)``).
    """

    experiment: str
    label: str
    policy: str = "fp32"
    model: str = "mlp"
    scale: float = 1.0
    dynamic: bool = False
    skip_nonfinite: bool = True
    loss_log2_weight: int = 0
    probe_underflow: bool = False
    amp_dtype: str = "float16"
    cnn: bool = False
    lr: float = LR

    def steps(self, cfg: StudyConfig) -> int:
        """The steps of this run in a study of ``cfg``."""
        return min(cfg.steps, cfg.cnn_steps) if self.cnn else cfg.steps


# ---------------------------------------------------------------------------------- control models
class EnergyShareMLP(nn.Module):
    """``Linear(64, 128) -> ReLU -> energy share -> Linear(128, 10)`` on raw pixel intensities.

    The energy share of hidden unit j is ``128 * h_j^2 / sum_k h_k^2`` (f32[64,128] -> same): a
    scale-invariant normalisation, so in float32 it does not matter how large h is. The model sees
    the digits' raw intensities 0..16 (the loader's [0, 1] pixels times 16); the first steps grow
    its activations, and within a few steps a sample's activation energy ``sum_k h_k^2`` passes
    65504. Under AMP the chain (broadcast_mul, reduce_sum, broadcast_div, scalar_mul: gray ops
    between two white matmuls) runs in float16: the sum overflows to inf and the features
    ``h^2 / inf`` become 0 (only the output bias still learns); once an activation passes 256 its
    square is inf too, inf / inf = NaN, and the step is skipped. ``pin_fp32`` puts
    ``amp.black_identity`` on h: the chain and its gradient stay float32.
    """

    INPUT_GAIN = 16.0

    def __init__(self, pin_fp32: bool = False, hidden: int = 128):
        super().__init__()
        self.pin_fp32 = pin_fp32
        self.hidden = nn.Linear(64, hidden)
        self.out = nn.Linear(hidden, 10)

    def forward(self, x):
        h = nn.functional.relu(self.hidden(x * self.INPUT_GAIN))
        if self.pin_fp32:
            h = black_identity(h)
        sq = h * h
        return self.out(sq / sq.sum(axis=1, keepdims=True) * float(self.out.in_features))


class TemperatureMLP(nn.Module):
    """The digits MLP with temperature-scaled logits ``z / T`` (T = 2), a harmless gray chain.

    AMP leaves the output ``bias_add`` and the scaling in float32 (they lead to the loss, not to a
    white op). ``white``: put ``amp.white_identity`` on the scaled logits, so that chain and its
    gradient (two gray ops each way) run in float16.
    """

    TEMPERATURE = 2.0

    def __init__(self, white: bool = False):
        super().__init__()
        self.white = white
        self.mlp = mlp((64, 128, 10))

    def forward(self, x):
        z = self.mlp(x) * (1.0 / self.TEMPERATURE)
        return white_identity(z) if self.white else z


class DigitsLeNet(nn.Module):
    """``miniflow.models.lenet`` (two convolutions with batch norm, max pools, two linear layers)
    on the flat digits: ``[N, 64]`` seen as ``[N, 1, 8, 8]``. Under AMP its convolutions and their
    gradients are white, batch norm (gray between them) runs in float16 with float32 statistics,
    gamma and beta (OneFlow's no-cast inputs), relu and max pool follow (clear)."""

    def __init__(self):
        super().__init__()
        self.net = lenet()

    def forward(self, x):
        return self.net(x.reshape(-1, 1, 8, 8))


MODELS = {
    "mlp": lambda: mlp((64, 128, 10)),
    "lenet": DigitsLeNet,
    "energy_share": EnergyShareMLP,
    "energy_share_pinned": lambda: EnergyShareMLP(pin_fp32=True),
    "temperature": TemperatureMLP,
    "temperature_white": lambda: TemperatureMLP(white=True),
}
"""Model factories by key (parameters drawn from miniflow's generator: seed it first)."""


class WeightedTrainGraph(TrainGraph):
    """:class:`~miniflow.experiments.mlp.TrainGraph` whose loss is ``weight`` x mean cross-entropy."""

    def __init__(self, model, optimizer, weight: float = 1.0):
        super().__init__(model, optimizer)
        self.weight = weight

    def build(self, x, y):
        loss = nn.functional.cross_entropy(self.model(x), y)
        if self.weight != 1.0:
            loss = loss * self.weight
        loss.backward()
        return loss


def make_graph(model, policy: str, scaler, log2_weight: int = 0,
               lr: float = LR, amp_dtype: str = "float16") -> WeightedTrainGraph:
    """An SGD(lr x 2^-w, momentum 0.9) training graph of ``model`` under ``policy`` (AMP in
    ``amp_dtype``, the model-update cast not fused, so that the unscaled gradients are read)."""
    graph = WeightedTrainGraph(model, SGD(model.parameters(), lr=lr * 2.0 ** -log2_weight,
                                          momentum=MOMENTUM), weight=2.0 ** log2_weight)
    if policy != "none":
        graph.config.enable_amp(True, dtype=amp_dtype, loss_scale_policy=policy)
        graph.config.enable_fused_model_update_cast(False)   # keeps the unscaled gradients
    if scaler is not None:
        graph.set_grad_scaler(scaler)
    return graph


def make_scaler(spec: RunSpec):
    """The spec's loss scaler (see :data:`NEVER_RAISE` for the static ones)."""
    if spec.dynamic:
        return GradScaler(init_scale=spec.scale, growth_interval=GROWTH_INTERVAL)
    return StaticGradScaler(spec.scale, skip_nonfinite=spec.skip_nonfinite,
                            max_consecutive_skips=NEVER_RAISE)


# ---------------------------------------------------------------------------------- measurements
_LOSS_SCALE_STAGE = ("cast", "scalar_mul", "scalar_mul_by_tensor", "fused_elementwise")


def _backward_grad(value, shape):
    """The gradient Value the backward pass made for a parameter of ``shape``.

    ``graph.grads[name]`` after the loss-scale pass is the unscaled float32 gradient that the
    update reads: ``scalar_mul(cast(g), 1/scale)`` (one ``fused_elementwise`` node once elementwise
    fusion has run). Walking back through those ops, always to the input of the parameter's
    shape, reaches ``g``, the output of the backward's matmul or reduce_sum: float16 where AMP ran
    that op in float16, and multiplied by the loss scale.
    """
    while value.producer is not None and value.producer.op.name in _LOSS_SCALE_STAGE:
        same = [v for v in value.producer.inputs if v.shape == shape]
        if not same:
            break
        value = same[0]
    return value


class GradientReader:
    """Host copies of a training graph's gradients after a call, read from the buffers of the plan
    that ran (the study's graphs have one plan: every batch has 64 rows)."""

    def __init__(self, graph):
        self.graph = graph
        self._plan = None

    def read(self) -> tuple:
        """``(unscaled, fp16)``: dicts name -> array of the float32 unscaled gradients
        (``logging.unscaled_gradients``: :func:`make_graph`'s AMP graphs do not fuse the
        model-update cast, whose gradients stay scaled), and of the scaled half (float16 or
        bfloat16) gradients the backward made (parameters whose gradient is float32 under AMP,
        or every parameter without AMP, are absent)."""
        plan = next(reversed(self.graph.plans.values()))
        if plan is not self._plan:
            self._plan = plan
            variables = plan.graph.variables
            self._fp16 = {}
            for n, v in plan.graph.grads.items():
                g = _backward_grad(v, variables[n].shape)
                if g.dtype.is_half:
                    self._fp16[n] = plan.buffers[g]
        to_numpy = get_backend().to_numpy
        return (unscaled_gradients(self.graph),
                {n: to_numpy(b) for n, b in self._fp16.items()})


def zero_fraction(fp16: dict):
    """Fraction of half (float16 or bfloat16) gradient elements that are exactly zero (None
    without half gradients).

    This counts structural zeros too (weights of always-black pixels, dead ReLUs), so it is for
    comparing runs, not an underflow count: :func:`underflow_fraction` is that.
    """
    total = sum(g.size for g in fp16.values())
    return sum(int(np.count_nonzero(g == 0)) for g in fp16.values()) / total if total else None


def underflow_fraction(fp16: dict, reference: dict) -> float:
    """Of the gradient elements that are non-zero in a float32 reference step (same weights, same
    batch, AMP off), the fraction that are zero in the float16 gradient: lost to underflow."""
    live = sum(int(np.count_nonzero(reference[n])) for n in fp16)
    lost = sum(int(np.count_nonzero((g == 0) & (reference[n] != 0))) for n, g in fp16.items())
    return lost / live


def first_step(flags) -> int | None:
    """The 1-based number of the first step whose flag is true (None if none is): with
    ``nonfinite_params > 0`` the step whose update first made a weight NaN or inf, with a
    non-finite loss the first step whose loss was NaN or inf."""
    return next((i + 1 for i, flag in enumerate(flags) if flag), None)


def nonfinite_fraction(model) -> float:
    """Fraction of the model's parameter elements that are NaN or inf."""
    arrays = [p.numpy() for p in model.parameters()]
    return sum(int(np.count_nonzero(~np.isfinite(a))) for a in arrays) / sum(a.size for a in arrays)


class UnderflowProbe:
    """The float32 reference of :func:`underflow_fraction`: a copy of the model trained by a graph
    without AMP or scaler, reloaded with the run's weights before each probe."""

    def __init__(self, spec: RunSpec):
        self.model = MODELS[spec.model]()
        self.reader = GradientReader(make_graph(self.model, "none", None, spec.loss_log2_weight))

    def reference(self, model, x, y) -> dict:
        self.model.load_state_dict(model.state_dict())
        self.reader.graph(x, y)
        return self.reader.read()[0]


def _stream(data, steps: int, rng):
    """``steps`` batches of 64, epoch after epoch, each epoch shuffled by ``rng``."""
    n = 0
    while True:
        for batch in batches(data.x_train, data.y_train, BATCH_SIZE, rng=rng, drop_last=True):
            if n == steps:
                return
            n += 1
            yield batch


def _rounded(values, digits: int) -> list:
    """Values as JSON-safe floats (``digits`` significant digits; NaN and inf become None)."""
    return [float(f"{v:.{digits}g}") if v is not None and np.isfinite(v) else None
            for v in values]


# ---------------------------------------------------------------------------------- one run
def run_name(spec: RunSpec, seed: int) -> str:
    """The TensorBoard run of ``spec`` and ``seed``: ``<experiment>/<label>/<scale>/seed<seed>``
    (``dynamic/cast_back/2^16/seed0``), a nested folder per part."""
    k = math.log2(spec.scale)
    scale = f"2^{k:g}" if k == int(k) else f"{spec.scale:g}"
    parts = [spec.experiment, spec.label, ("dynamic from " if spec.dynamic else "") + scale,
             f"seed{seed}"]
    return "/".join(p.replace("/", "-").replace(":", "-") for p in parts)


def train_run(spec: RunSpec, seed: int, cfg: StudyConfig, data, log=None) -> dict:
    """Train one run; returns its record for ``metrics.json`` (see ``stability_report``).

    ``log``: a ``miniflow.logging.ScalarWriter`` that gets, per step, ``train/loss``,
    ``train/lr``, ``train/grad_norm``, ``amp/loss_scale`` (the scale the step used),
    ``amp/skipped`` (1 for a skipped step) and ``amp/skipped_steps`` (so far), and
    ``eval/test_accuracy`` at every evaluation (x axis: the step), or None."""
    manual_seed(seed)
    model = MODELS[spec.model]()
    scaler = make_scaler(spec)
    graph = make_graph(model, spec.policy, scaler, spec.loss_log2_weight, spec.lr, spec.amp_dtype)
    reader, evaluator = GradientReader(graph), EvalGraph(model)
    probe = UnderflowProbe(spec) if spec.probe_underflow else None
    weight = 2.0 ** spec.loss_log2_weight
    s = {k: [] for k in ("loss", "scale", "skipped", "grad_norm", "fp16_zero_fraction",
                         "nonfinite_params")}
    evals = {"step": [], "test_accuracy": []}
    underflow = {"step": [], "fraction": []}

    def evaluate(step):
        model.eval()                          # batch norm: the running statistics
        evals["step"].append(step)
        evals["test_accuracy"].append(accuracy(evaluator, data.x_test, data.y_test))
        model.train()
        if log is not None:
            log.add(step, {"eval/test_accuracy": evals["test_accuracy"][-1]})

    # NaN and inf are what the study is about: no LossScaleOverflowWarning (legacy and cast_back
    # above 65504 warn at compile time) and no NumPy warnings from kernels that meet them
    with warnings.catch_warnings(), np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        warnings.simplefilter("ignore", LossScaleOverflowWarning)
        steps = spec.steps(cfg)
        for step, (x, y) in enumerate(_stream(data, steps, np.random.default_rng(seed))):
            if step % cfg.eval_every == 0:
                evaluate(step)
            probing = probe is not None and step % cfg.probe_every == 0
            reference = probe.reference(model, x, y) if probing else None
            s["scale"].append(scaler.scale)                  # the scale this step uses
            s["loss"].append(float(graph(x, y)) / weight)    # mean cross-entropy
            s["skipped"].append(int(scaler.found_inf and scaler.skip_nonfinite))
            unscaled, fp16 = reader.read()
            s["grad_norm"].append(grad_norm(unscaled))
            s["fp16_zero_fraction"].append(zero_fraction(fp16))
            s["nonfinite_params"].append(nonfinite_fraction(model))   # after the update
            if log is not None:
                log.add(step + 1, {"train/loss": s["loss"][-1], "train/lr": graph.optimizers[
                    0].param_groups[0]["lr"], "train/grad_norm": s["grad_norm"][-1],
                    "amp/loss_scale": s["scale"][-1], "amp/skipped": s["skipped"][-1],
                    "amp/skipped_steps": sum(s["skipped"])})
            if probing:
                underflow["step"].append(step)
                underflow["fraction"].append(underflow_fraction(fp16, reference))
        evaluate(steps)
    return _record(spec, seed, graph, s, evals, underflow)


def _amp_nodes(graph, policy: str):
    """How many nodes the AMP pass colored float16 / float32 (None without AMP): its decisions,
    counted before later passes prune the amp identities or fuse nodes."""
    if policy == "none":
        return None
    rows = [r for r in graph.amp_report().rows if r.op not in AMP_IDENTITY_OPS]
    fp16 = sum(r.color == "white" for r in rows)
    return {"fp16": fp16, "fp32": len(rows) - fp16}


def _record(spec: RunSpec, seed: int, graph, s: dict, evals: dict, underflow: dict) -> dict:
    applied = [sc for sc, k in zip(s["scale"], s["skipped"]) if not k]
    return {
        **asdict(spec), "seed": seed, "amp_nodes": _amp_nodes(graph, spec.policy),
        "final_test_accuracy": evals["test_accuracy"][-1],
        "skipped_fraction": float(np.mean(s["skipped"])),
        "max_applied_scale": max(applied) if applied else None,
        "final_nonfinite_params": s["nonfinite_params"][-1],
        "first_nonfinite_step": first_step(f > 0 for f in s["nonfinite_params"]),
        "first_nonfinite_loss_step": first_step(not np.isfinite(v) for v in s["loss"]),
        "mean_underflow": float(np.mean(underflow["fraction"])) if underflow["step"] else None,
        "per_step": {"loss": _rounded(s["loss"], 5), "scale": s["scale"],
                     "skipped": s["skipped"], "grad_norm": _rounded(s["grad_norm"], 4),
                     "fp16_zero_fraction": _rounded(s["fp16_zero_fraction"], 4),
                     "nonfinite_params": _rounded(s["nonfinite_params"], 4)},
        "evaluations": {**evals, "test_accuracy": _rounded(evals["test_accuracy"], 4)},
        "underflow": {**underflow, "fraction": _rounded(underflow["fraction"], 4)}
        if underflow["step"] else None,
    }


# ---------------------------------------------------------------------------------- experiments
def _skip_label(policy: str, skip: bool) -> str:
    """How a static run treats non-finite steps, and whose behaviour that is."""
    if skip:
        return "skip (miniflow's default)"
    return "no skip (OneFlow)" if policy in ONEFLOW_POLICIES else "no skip"


def _static_variants(policy: str) -> list:
    """``(label, skip_nonfinite)`` of the static-sweep runs of ``policy``: the OneFlow policies as
    OneFlow runs them (no skip) and with miniflow's skip; the others with the default (skip)."""
    if policy not in ONEFLOW_POLICIES:
        return [(policy, True)]
    return [(f"{policy}, {_skip_label(policy, skip)}", skip) for skip in (False, True)]


def experiment_specs() -> list:
    """Every run of the study, per seed (issue 6 lists the experiments; issue 11 adds the static
    runs without skipping, as OneFlow runs them; issue 13 the static sweep on the LeNet; issue 16
    the static sweep in bfloat16)."""
    specs = [RunSpec("static_sweep", label, policy=p, scale=2.0 ** k, skip_nonfinite=skip)
             for k in SWEEP_LOG2_SCALES for p in POLICIES for label, skip in _static_variants(p)]
    specs += [RunSpec("bfloat16", BF16_LABEL, policy="legacy", scale=2.0 ** k,
                      skip_nonfinite=False, amp_dtype="bfloat16") for k in SWEEP_LOG2_SCALES]
    specs += [RunSpec("dynamic", p, policy=p, scale=DYNAMIC_INIT_SCALE, dynamic=True)
              for p in POLICIES]
    gray = {"no AMP": ("none", "energy_share"), "AMP": ("fp32", "energy_share"),
            "AMP + black_identity": ("fp32", "energy_share_pinned")}
    specs += [RunSpec("gray_path", label, policy=p, model=m, scale=GRAY_PATH_SCALE)
              for label, (p, m) in gray.items()]
    specs += [RunSpec("white_identity", label, model=m, scale=GRAY_PATH_SCALE)
              for label, m in (("AMP", "temperature"), ("AMP + white_identity", "temperature_white"))]
    regimes = {"plain digits (loss x 1)": 0,
               f"small gradients (loss x 2^{SMALL_LOSS_LOG2_WEIGHT})": SMALL_LOSS_LOG2_WEIGHT}
    specs += [RunSpec("underflow", label, scale=2.0 ** k, loss_log2_weight=w, probe_underflow=True)
              for label, w in regimes.items() for k in UNDERFLOW_LOG2_SCALES]
    for policy, k in (("legacy", 17), ("fp32", 20)):
        specs += [RunSpec("skipping", f"{policy}, 2^{k}, {_skip_label(policy, skip)}",
                          policy=policy, scale=2.0 ** k, skip_nonfinite=skip)
                  for skip in (True, False)]
    specs += [RunSpec("cnn_static_sweep", f"{policy}, {_skip_label(policy, skip)}",
                      policy=policy, model="lenet", scale=2.0 ** k, skip_nonfinite=skip,
                      cnn=True, lr=CNN_LR)
              for k in CNN_LOG2_SCALES for policy, skip in CNN_ROWS]
    return specs


OUTPUT_FILES = ("metrics.json", "summary.md", *FIGURES)
"""The files :func:`run_study` writes into its folder."""


class OutputDirError(OSError):
    """The study's output folder cannot be created or written."""


def check_out_dir(out: Path, what: str = "the study's results", option: str = "--out",
                  files=()) -> None:
    """Create ``out`` (and its parents) and write and delete a probe file in it, so that a study
    that cannot save its results fails before its first run, not after minutes of training.
    ``what`` and ``option`` name the folder's contents and its command-line option in the
    message (``"TensorBoard's logs"``, ``"--logdir"``); ``files``: the names of the files the
    job writes there, each a regular file or a new one.

    Raises:
        OutputDirError: ``out`` is a file, lies under a file, or is not writable, or one of
            ``files`` there is a folder (or a FIFO, a device); the message names the folder,
            the file and the reason.
    """
    try:
        if out.exists() and not out.is_dir():
            raise NotADirectoryError(0, "it exists and is not a folder")
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
        for name in files:
            if (out / name).exists() and not (out / name).is_file():
                raise IsADirectoryError(0, f"{name} in it is not a file but a folder (or a "
                                           "device, a FIFO)")
    except OSError as e:
        raise OutputDirError(f"cannot write {what} to {str(out)!r}: {e.strerror or e}; pass a "
                             f"writable folder with {option} DIR") from None


def run_study(cfg: StudyConfig, out: Path, progress: bool = True, logdir=None) -> dict:
    """Run every experiment for every seed; write ``metrics.json``, ``summary.md`` and the
    figures into ``out``; returns the metrics. With ``logdir``, each run's TensorBoard scalars
    go to ``<logdir>/<run_name(spec, seed)>`` (see :func:`train_run`).

    Raises:
        OutputDirError: ``out`` cannot be written, or one of :data:`OUTPUT_FILES` there is a
            folder (checked before the first run).
        miniflow.extras.MissingExtraError: ``logdir`` without the tensorboard extra (before
            the first run).
    """
    from tqdm import tqdm

    from . import stability_plots, stability_report

    if logdir is not None:
        require("tensorboardX", "tensorboard", "miniflow.experiments.stability.run_study")
    check_out_dir(out, files=OUTPUT_FILES)
    data = load_digits()
    specs = experiment_specs()
    runs = []
    t0 = time.perf_counter()
    with tqdm(total=len(specs) * cfg.seeds, desc="stability", unit="run",
              disable=not progress) as bar:
        for seed in range(cfg.seeds):
            for spec in specs:
                bar.set_postfix_str(f"seed {seed}: {spec.experiment}, {spec.label}")
                if logdir is None:
                    runs.append(train_run(spec, seed, cfg, data))
                else:
                    with ScalarWriter(run_dir(logdir, run_name(spec, seed))) as log:
                        runs.append(train_run(spec, seed, cfg, data, log))
                bar.update()
    metrics = {"config": {**asdict(cfg), "batch_size": BATCH_SIZE, "lr": LR,
                          "momentum": MOMENTUM, "backend": get_backend().name,
                          "cpu": cpu_description(),
                          "seconds": round(time.perf_counter() - t0, 1)},
               "runs": runs}
    # Atomically: Ctrl-C or a full disk leaves the old file or the new one, never a part.
    owner = "miniflow.experiments.stability.run_study"
    write_atomic(out / "metrics.json", json.dumps(metrics, separators=(",", ":")).encode(),
                 owner, "metrics.json")
    figures = stability_plots.plot_all(metrics, out)
    write_atomic(out / "summary.md",
                 stability_report.summary_markdown(metrics, figures).encode(), owner,
                 "summary.md")
    return metrics
