"""The pass pipeline: the order passes run in, the settings they read and the states they hand
each other.

Order (docs/architecture.md): autograd -> auto_mixed_precision -> prune_amp_identity ->
gradient_accumulation -> data_parallel -> loss_scale -> optimizer -> fuse_model_update_cast ->
fuse_elementwise -> dead_code_elimination (why each comes where it does: the comments on
:data:`PASSES`). The three AMP passes run only when AMP is enabled (``settings.amp`` is set;
``fuse_model_update_cast`` also needs ``settings.fuse_model_update_cast``), data_parallel only
when data-parallel training is (``settings.data_parallel``; it averages the accumulated
gradients, once per call). The IR is verified after every pass; with ``print_ir=True`` it is
printed after every pass too.

A pass reads the driver's :class:`CompileSettings` (``ctx.settings``, frozen) and hands later
passes what they need through its own state type, a small dataclass defined in the pass's module
and stored as ``ctx.state[ThatType]`` (OneFlow's ``JobPassState`` read with
``JobPassCtx::GetState<T>``, ``oneflow/core/job_rewriter/job_pass.h``). A reader imports the
type it reads, so who depends on whom is visible in the imports:

==================  ==========================  =====================================
state               written by                  read by
==================  ==========================  =====================================
AutogradState       autograd                    loss_scale
AmpState            auto_mixed_precision        ``nn.Graph.amp_report``
DataParallelState   data_parallel               loss_scale, the compile driver
LossScaleState      loss_scale                  optimizer, fuse_model_update_cast,
                                                the compile driver
FusedUpdateState    fuse_model_update_cast      the compile driver (``HalfCopies``)
==================  ==========================  =====================================

The IR carries only what the plan needs: nodes and named results.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType

from ..ir import Graph
from .auto_mixed_precision import AmpConfig, auto_mixed_precision
from .autograd import autograd
from .data_parallel import DataParallelConfig, data_parallel
from .dead_code_elimination import dead_code_elimination
from .fuse_elementwise import fuse_elementwise
from .fuse_model_update_cast import fuse_model_update_cast
from .gradient_accumulation import gradient_accumulation
from .loss_scale import POLICIES, loss_scale
from .optimizer import optimizer
from .prune_amp_identity import prune_amp_identity

__all__ = ["CompileSettings", "PassStates", "CompileContext", "PASSES", "AMP_PASSES",
           "DATA_PARALLEL_PASSES", "TRAINING_PASSES", "STAGE_ALIASES", "passes_for",
           "run_passes"]


@dataclass(frozen=True)
class CompileSettings:
    """What the compile driver (``miniflow.compiler``) tells the passes; frozen, so no pass can
    change what a later pass reads (a setting flipped on ``nn.Graph.config`` after a compile
    reaches the next compile only).

    Fields:
        trainable: names of variables to differentiate (parameters of the graph's optimizers),
            a tuple (a list is converted).
        optimizers: the graph's optimizers (they emit their update ops), a tuple.
        param_names: ``id(parameter) -> variable name`` (read-only view).
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
    """

    trainable: tuple = ()
    optimizers: tuple = ()
    param_names: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    initial_grad_identity: str | None = None
    amp: AmpConfig | None = None
    grad_scaler: object = None
    loss_scale_policy: str = POLICIES[0]
    data_parallel: DataParallelConfig | None = None
    accumulation_steps: int = 1
    fuse_model_update_cast: bool = True
    print_ir: bool = False

    def __post_init__(self):
        object.__setattr__(self, "trainable", tuple(self.trainable))
        object.__setattr__(self, "optimizers", tuple(self.optimizers))
        object.__setattr__(self, "param_names", MappingProxyType(dict(self.param_names)))


class PassStates(dict):
    """``state type -> state``: what the passes of one compile handed each other (OneFlow's
    ``JobPassCtx`` states). ``states[T]`` is the ``T`` a pass stored, ``states.get(T)`` None when
    that pass did not run (or had nothing to do).

    Raises:
        KeyError: ``states[T]`` before the pass that owns ``T`` stored one, naming ``T``'s module.
        TypeError: storing a value under a key that is not its own type.
    """

    def __getitem__(self, kind: type):
        try:
            return super().__getitem__(kind)
        except KeyError:
            raise KeyError(f"ctx.state has no {kind.__name__}: its pass ({kind.__module__}) has "
                           f"not run before this one; run it first or read ctx.state.get("
                           f"{kind.__name__}) where it is optional") from None

    def __setitem__(self, kind: type, value) -> None:
        if type(value) is not kind:
            raise TypeError(f"ctx.state[{getattr(kind, '__name__', kind)!r}] = a "
                            f"{type(value).__name__}: store a state under its own type")
        super().__setitem__(kind, value)


@dataclass(slots=True)
class CompileContext:
    """What the passes get besides the graph (OneFlow's ``JobPassCtx``): the driver's
    ``settings`` (:class:`CompileSettings`) and the passes' ``state``
    (:class:`PassStates`, one dataclass per pass that hands something on). It has no other
    fields and takes no new attributes (``__slots__``), so passes cannot share a loose field."""

    settings: CompileSettings = field(default_factory=CompileSettings)
    state: PassStates = field(default_factory=PassStates)


PASSES = [
    # First: every later pass rewrites the forward AND backward nodes autograd emits, and
    # reads the gradients it names (graph.grads) and the initial gradient (AutogradState).
    ("autograd", autograd),
    # After autograd, so the backward nodes are colored too; before any pass that reads the
    # gradients, so their consumers (accumulation, all-reduce, unscaling, updates) see the
    # dtypes AMP gave them.
    ("auto_mixed_precision", auto_mixed_precision),
    # Right after AMP: the identities only steered the coloring; the casts AMP inserted
    # replace them.
    ("prune_amp_identity", prune_amp_identity),
    # Before data_parallel and the updates: the gradients are summed over the micro-batches
    # first, so they are all-reduced and applied once per call.
    ("gradient_accumulation", gradient_accumulation),
    # Before loss_scale: the non-finite counts must see the averaged gradients, and loss_scale
    # sums the counts over the ranks when DataParallelState says the gradients were reduced.
    ("data_parallel", data_parallel),
    # Before the optimizer: its LossScaleState.skip_if is what every update op takes.
    ("loss_scale", loss_scale),
    ("optimizer", optimizer),
    # After the optimizer and loss scaling: it fuses their update ops, the unscaling
    # (LossScaleState.inv_scale) and AMP's weight casts into one node per parameter.
    ("fuse_model_update_cast", fuse_model_update_cast),
    # After every pass that emits elementwise nodes, so their chains are all there to fuse.
    ("fuse_elementwise", fuse_elementwise),
    # Last: drops whatever the rewrites above left without readers.
    ("dead_code_elimination", dead_code_elimination),
]

AMP_PASSES = ("auto_mixed_precision", "prune_amp_identity", "fuse_model_update_cast")
"""Passes that run only with AMP enabled."""

DATA_PARALLEL_PASSES = ("data_parallel",)
"""Passes that run only with data-parallel training enabled."""

TRAINING_PASSES = ("autograd", "gradient_accumulation", "data_parallel", "loss_scale",
                   "optimizer", "fuse_model_update_cast")
"""Passes that rewrite only a training step's gradients and updates: a graph without
``backward`` and optimizers (an evaluation graph) comes out of them unchanged."""


STAGE_ALIASES = {"amp": "auto_mixed_precision"}
"""Short names of stages (``nn.Graph.lower(after="amp")``, ``miniflow ir --after amp``)."""


def passes_for(ctx: CompileContext) -> list:
    """The ``(name, pass)`` list that ``ctx`` asks for: :data:`PASSES`, minus the AMP passes when
    AMP is off and the data-parallel pass when data parallel is off."""
    s = ctx.settings
    return [(name, fn) for name, fn in PASSES
            if (s.amp is not None or name not in AMP_PASSES)
            and (s.data_parallel is not None or name not in DATA_PARALLEL_PASSES)]


def run_passes(graph: Graph, ctx: CompileContext, passes=None) -> Graph:
    """Run ``passes`` (default :func:`passes_for` ``(ctx)``) in order, verifying the IR after each."""
    graph.verify()
    if ctx.settings.print_ir:
        print(f"# IR after trace\n{graph}\n")
    for name, fn in (passes_for(ctx) if passes is None else passes):
        graph = fn(graph, ctx)
        graph.verify()
        if ctx.settings.print_ir:
            print(f"# IR after {name}\n{graph}\n")
    return graph
