"""The pass pipeline: the order passes run in, and the context they share.

Order (docs/architecture.md): autograd -> auto_mixed_precision -> prune_amp_identity ->
gradient_accumulation -> data_parallel -> loss_scale -> optimizer -> fuse_model_update_cast ->
fuse_elementwise -> dead_code_elimination. The three AMP passes run only when AMP is enabled
(``ctx.amp`` is set; ``fuse_model_update_cast`` also needs ``ctx.fuse_model_update_cast``),
data_parallel only when data-parallel training is (``ctx.data_parallel``; it averages the
accumulated gradients, once per call). The IR is verified after every pass; with
``print_ir=True`` it is printed after every pass too.

What passes tell each other goes through the :class:`CompileContext` (OneFlow's ``JobPassCtx``),
not the IR: the initial gradient, ``skip_if``, the AMP decisions ... The IR carries only what the
plan needs: nodes and named results.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import Graph
from .auto_mixed_precision import AmpConfig, AmpResult, auto_mixed_precision
from .autograd import autograd
from .data_parallel import DataParallelConfig, data_parallel
from .dead_code_elimination import dead_code_elimination
from .fuse_elementwise import fuse_elementwise
from .fuse_model_update_cast import fuse_model_update_cast
from .gradient_accumulation import gradient_accumulation
from .loss_scale import POLICIES, loss_scale
from .optimizer import optimizer
from .prune_amp_identity import prune_amp_identity

__all__ = ["CompileContext", "PASSES", "AMP_PASSES", "DATA_PARALLEL_PASSES", "STAGE_ALIASES",
           "passes_for", "run_passes"]


@dataclass
class CompileContext:
    """What the passes need besides the graph, and what they hand each other.

    Settings (from the compile driver, ``miniflow.graph``):
        trainable: names of variables to differentiate (parameters of the graph's optimizers).
        optimizers: the graph's optimizers (they emit their update ops).
        param_names: ``id(parameter) -> variable name``.
        initial_grad_identity: op type put on ``ones_like(loss)`` by autograd, or None.
        amp: the AMP settings (:class:`~miniflow.passes.auto_mixed_precision.AmpConfig`), or None
            when AMP is off.
        grad_scaler: a loss scaler (``miniflow.amp.GradScaler`` / ``StaticGradScaler``: the
            loss-scale pass reads its ``dynamic``, ``scale``, ``skip_nonfinite``,
            ``schedule_attrs()`` and state arrays), or None.
        loss_scale_policy: ``"fp32"`` (default), ``"cast_back"`` or ``"legacy"``.
        data_parallel: the data-parallel settings
            (:class:`~miniflow.passes.data_parallel.DataParallelConfig`) when the gradients are
            averaged across the ranks, else None.
        accumulation_steps: micro-batches per call (``set_gradient_accumulation_steps``; the
            driver already split the inputs and packed the outputs).
        fuse_model_update_cast: under AMP, fuse the weight casts, unscaling and updates
            (``config.enable_fused_model_update_cast``, on by default).
        print_ir: print the IR after every pass.

    Set by the passes:
        initial_grad: the ``ones_like(loss)`` Value autograd seeds the backward pass with.
        scaled_initial_grad: the loss-scale pass's product of it and the scale.
        skip_if: an i64[1] Value that update ops take as ``skip_if`` (set by loss scaling).
        inv_scale: the f32[1] Value ``1 / loss_scale`` of a dynamic scaler (set by loss scaling).
        half_copies: ``(parameter, copy variable)`` names of the half weight copies the
            ``fuse_model_update_cast`` pass declared (without data: the driver binds them).
        nonfinite_names: the variable names the ``"nonfinite_counts"`` result counts, in order
            (under data parallel: summed over the ranks).
        all_reduce_buckets: the variable names of each gradient bucket the data-parallel pass
            all-reduces (empty when it did not run).
        amp_result: filled by the AMP pass: per node color and reason, inserted casts.
    """

    trainable: list = field(default_factory=list)
    optimizers: list = field(default_factory=list)
    param_names: dict = field(default_factory=dict)
    initial_grad_identity: str | None = None
    amp: AmpConfig | None = None
    grad_scaler: object = None
    loss_scale_policy: str = POLICIES[0]
    data_parallel: DataParallelConfig | None = None
    accumulation_steps: int = 1
    fuse_model_update_cast: bool = True
    print_ir: bool = False
    initial_grad: object = None
    scaled_initial_grad: object = None
    skip_if: object = None
    inv_scale: object = None
    half_copies: list = field(default_factory=list)
    nonfinite_names: list = field(default_factory=list)
    all_reduce_buckets: list = field(default_factory=list)
    amp_result: AmpResult | None = None


PASSES = [
    ("autograd", autograd),
    ("auto_mixed_precision", auto_mixed_precision),
    ("prune_amp_identity", prune_amp_identity),
    ("gradient_accumulation", gradient_accumulation),
    ("data_parallel", data_parallel),
    ("loss_scale", loss_scale),
    ("optimizer", optimizer),
    ("fuse_model_update_cast", fuse_model_update_cast),
    ("fuse_elementwise", fuse_elementwise),
    ("dead_code_elimination", dead_code_elimination),
]

AMP_PASSES = ("auto_mixed_precision", "prune_amp_identity", "fuse_model_update_cast")
"""Passes that run only with AMP enabled."""

DATA_PARALLEL_PASSES = ("data_parallel",)
"""Passes that run only with data-parallel training enabled."""


STAGE_ALIASES = {"amp": "auto_mixed_precision"}
"""Short names of stages (``nn.Graph.lower(after="amp")``, ``miniflow ir --after amp``)."""


def passes_for(ctx: CompileContext) -> list:
    """The ``(name, pass)`` list that ``ctx`` asks for: :data:`PASSES`, minus the AMP passes when
    AMP is off and the data-parallel pass when data parallel is off."""
    return [(name, fn) for name, fn in PASSES
            if (ctx.amp is not None or name not in AMP_PASSES)
            and (ctx.data_parallel is not None or name not in DATA_PARALLEL_PASSES)]


def run_passes(graph: Graph, ctx: CompileContext, passes=None) -> Graph:
    """Run ``passes`` (default :func:`passes_for` ``(ctx)``) in order, verifying the IR after each."""
    graph.verify()
    if ctx.print_ir:
        print(f"# IR after trace\n{graph}\n")
    for name, fn in (passes_for(ctx) if passes is None else passes):
        graph = fn(graph, ctx)
        graph.verify()
        if ctx.print_ir:
            print(f"# IR after {name}\n{graph}\n")
    return graph
