"""Loss-scale pass: scale the initial gradient, unscale and check the parameter gradients, make the
update ops skip non-finite steps, and schedule a dynamic scale — all inside the graph.

Runs after AMP and data_parallel, before the optimizer pass (OneFlow: inside
``GenerateOptimizerOpConfs``, whose order this follows: cast fp16 model diffs to fp32 -> scale the
initial diff -> unscale model diffs (x 1/scale) -> count not-finite -> updates take the count as
``skip_if``; and ``DynamicLossScaleSchedulePass``). Steps, in order (docs/architecture.md, "Loss
scaling is a pass"):

1. The initial gradient is the Value the autograd pass recorded (``AutogradState.initial_grad``:
   ``ones_like(loss)``, possibly float16 after AMP). The scaling nodes go right after it
   (``graph.inserting_after``) and its readers read the scaled value
   (``LossScaleState.scaled_initial_grad``).
2. Scale it by ``settings.loss_scale_policy``:

   * ``"legacy"`` (OneFlow before PR 9126): the scale is made in the diff's dtype first (a static
     scale as a ``constant`` shaped like the diff; a dynamic float32 scale ``cast`` down), then
     multiplied. With a float16 diff any scale >= 65520 is inf.
   * ``"cast_back"`` (PR 9126): a float16 diff is cast to float32, multiplied by the float32 scale,
     and the product cast back to float16: exact scale, but a product above 65504 still overflows.
   * ``"fp32"`` (miniflow's default, and miniflow's own design): the autograd pass already put
     ``amp_black_identity`` (the op PR 9126 added) on the initial gradient, so AMP kept the
     loss-gradient path float32; the multiply is float32 and no cast is needed here (the same code
     path as ``"cast_back"`` with a float32 diff). OneFlow itself never inserts
     ``amp_black_identity`` on the initial gradient: there the diff is float16 whenever AMP colors
     the loss-gradient ops float16.

3. Cast each float16 parameter gradient to its float32 master dtype (``passes.master_grad``, the
   one place this cast is made) and multiply by 1/scale in float32 (in float64 for the gradients of
   a float64 model: the float32 1/scale cast up, exactly): the gradient results become these
   unscaled gradients.
4. ``multi_count_not_finite`` over all unscaled gradients (one fused kernel): the result
   ``"nonfinite_counts"`` (one count per name in ``LossScaleState.nonfinite_names``), which the
   grad scaler reads after every step. Under data parallel (a ``DataParallelState``: the
   gradients are means over the ranks) the counts and their total are summed across the ranks
   (``all_reduce {reduce='sum'}``), so every rank takes the same decision below; a non-finite
   element of a mean is non-finite on every rank, so it counts once per rank.
5. ``LossScaleState.skip_if`` = the total count: every update op skips a non-finite step (unless
   a static scaler was made with ``skip_nonfinite=False``). OneFlow differs under a static scale:
   it counts and skips only with a dynamic policy (``CountNotFiniteIfNeeded`` in ``autograd.cpp`` and
   ``SetDynamicLossScaleSkipIf`` in ``optimizer.cpp`` return early otherwise), so it applies an
   inf/NaN update; ``StaticGradScaler(scale, skip_nonfinite=False)`` reproduces that, and skipping
   is miniflow's safer default.
6. ``dynamic_loss_scale_schedule`` updates scale and tracker; it is appended after every node that
   reads the scale (the initial-gradient multiply and the reciprocal used to unscale, which is
   ``LossScaleState.inv_scale``).

What it hands on is a :class:`LossScaleState` (``ctx.state[LossScaleState]``), stored only when
the stage was inserted.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

from ..dtype import FP16_MAX, float16, float32
from ..ir import Graph, Value, grad_name
from ..ops import emitter
from .autograd import AutogradState
from .data_parallel import DataParallelState
from .master_grad import master_grad

__all__ = ["loss_scale", "LossScaleState", "POLICIES", "LossScaleOverflowWarning"]

POLICIES = ("fp32", "cast_back", "legacy")
"""The loss-scale policies, the default first."""


class LossScaleOverflowWarning(UserWarning):
    """The policy cannot represent the scaled initial gradient (it will be inf)."""


@dataclass(frozen=True)
class LossScaleState:
    """What the loss-scale pass hands on (``ctx.state[LossScaleState]``).

    Fields:
        scaled_initial_grad: the product of the initial gradient and the scale (what the backward
            pass reads instead of ``AutogradState.initial_grad``).
        nonfinite_names: the variable names the ``"nonfinite_counts"`` result counts, in order
            (under data parallel: summed over the ranks); read by the compile driver.
        skip_if: the i64[1] total count that every update op takes as ``skip_if`` (read by the
            optimizer pass), or None when the scaler does not skip (``skip_nonfinite=False``).
        inv_scale: the f32[1] Value ``1 / loss_scale`` of a dynamic scaler (read by
            ``fuse_model_update_cast``), or None for a static scale.
    """

    scaled_initial_grad: Value
    nonfinite_names: tuple
    skip_if: Value | None
    inv_scale: Value | None


def loss_scale(graph: Graph, ctx) -> Graph:
    """Insert the loss-scale stage for ``settings.grad_scaler`` (no-op without a scaler or
    gradients) and store a :class:`LossScaleState`."""
    scaler = ctx.settings.grad_scaler
    if scaler is None or graph.loss is None or not graph.grads:
        return graph
    scale_var = tracker_var = None
    if scaler.dynamic:
        scale_var = graph.add_variable("loss_scale", (1,), float32, data=scaler._scale)
        tracker_var = graph.add_variable("loss_scale.growth_tracker", (1,), "int64",
                                         data=scaler._growth_tracker)
    emit = emitter(graph)
    scaled = _scale_initial_grad(graph, ctx.state[AutogradState].initial_grad,
                                 ctx.settings.loss_scale_policy, scaler, scale_var)
    inv_scale = {float32: emit("reciprocal", scale_var)} if scaler.dynamic else None
    names = list(graph.grads)
    for name in names:
        g = master_grad(graph, graph.variables[name], graph.grads[name])
        if scaler.dynamic and g.dtype not in inv_scale:  # a float64 model: 1/scale in float64
            inv_scale[g.dtype] = emit("cast", inv_scale[float32], dtype=g.dtype)
        graph.results[grad_name(name)] = (
            emit("scalar_mul_by_tensor", g, inv_scale[g.dtype]) if scaler.dynamic
            else emit("scalar_mul", g, scalar=1.0 / scaler.scale))
    counts, total = emit("multi_count_not_finite", *(graph.grads[n] for n in names))
    if ctx.state.get(DataParallelState):  # data parallel: every rank skips, rescales, together
        counts, total = emit("all_reduce", counts, total, reduce="sum")
    graph.results["nonfinite_counts"] = counts
    ctx.state[LossScaleState] = LossScaleState(
        scaled, tuple(names), total if scaler.skip_nonfinite else None,
        inv_scale[float32] if scaler.dynamic else None)
    if scaler.dynamic:
        emit("dynamic_loss_scale_schedule", total, scale_var, tracker_var,
             **scaler.schedule_attrs())
    return graph


def _scale_initial_grad(graph: Graph, diff, policy: str, scaler, scale_var):
    """Multiply the initial gradient ``diff`` by the scale right after it is made, as ``policy``
    says; its readers read the product, which is returned."""
    readers = graph.uses(diff)
    with graph.inserting_after(diff.producer):
        scaled = _scaled(emitter(graph), diff, policy, scaler, scale_var)
    graph.replace_uses(diff, scaled, nodes=readers)
    return scaled


def _scaled(emit, diff, policy: str, scaler, scale_var):
    """The nodes of ``diff * scale`` under ``policy``; returns the product."""
    dtype = diff.dtype
    if dtype is float16 and policy != "fp32" and scaler.scale > FP16_MAX:
        outcome = ("steps overflow and are skipped until the dynamic scale backs off below it"
                   if scaler.dynamic else "every step will overflow and be skipped")
        warnings.warn(f"loss scale {scaler.scale:g} > {FP16_MAX:g} cannot be represented by the "
                      f"float16 initial gradient under loss_scale_policy={policy!r}: {outcome}. "
                      "Use loss_scale_policy='fp32' or put amp.black_identity on the loss path",
                      LossScaleOverflowWarning, stacklevel=2)
    if policy == "legacy":
        if scale_var is None:
            s = emit("constant", value=scaler.scale, shape=diff.shape, dtype=dtype)
            scaled = emit("broadcast_mul", diff, s)
        else:
            s = scale_var if dtype is float32 else emit("cast", scale_var, dtype=dtype)
            scaled = emit("scalar_mul_by_tensor", diff, s)
    else:  # "cast_back" and "fp32" (whose diff is already float32: no casts)
        d32 = diff if dtype is float32 else emit("cast", diff, dtype=float32)
        if scale_var is None:
            s = emit("constant", value=scaler.scale, shape=d32.shape, dtype=float32)
            product = emit("broadcast_mul", d32, s)
        else:
            product = emit("scalar_mul_by_tensor", d32, scale_var)
        scaled = product if dtype is float32 else emit("cast", product, dtype=dtype)
    return scaled
