"""Optimizer pass: insert one update op per trained parameter (OneFlow ``GenerateOptimizerOpConfs``).

Assumes: the autograd pass filled the gradient results (``graph.grads``). Each param group (the
j-th) of each optimizer in ``settings.optimizers`` (the k-th) declares its learning-rate array as
the f64[1] variable ``optimizer<k>.learning_rate`` (group 0) or
``optimizer<k>.group<j>.learning_rate`` (OneFlow's ``learning_rate`` input of the update ops: a new
lr is a new value of that variable, never a new graph) and emits one update op per parameter
(``sgd_update``/``adam_update``/``adadelta_update``) with the group's hyper-parameters as
attributes, declaring its state as graph variables (the fused multi-tensor updates of AMP keep
groups apart: they fuse updates of equal attributes and learning-rate input only). ``skip_if`` is
``LossScaleState.skip_if`` when the loss-scale pass provided one, else a constant 0.

Gradient clipping (OneFlow's ``ClipGradient`` in ``GenerateOptimizerOpConfs``, per param group
that sets ``clip_grad_max_norm``): one ``clip_grad_norm`` over the group's
master gradients, then every gradient times its ``clip_coef`` (``scalar_mul_by_tensor``); the
gradient results become the clipped gradients (as ``torch.nn.utils.clip_grad_norm_`` changes
``.grad``), and each group's ``clip_coef`` is the result ``clip_coef:<k>`` (``k`` counting the
clipped groups), from which ``miniflow.logging`` reports the norm before clipping, as
``clip_grad_norm_`` returns it. It runs here, after the loss-scale pass, so it sees the unscaled gradients (and, with
gradient accumulation, their mean) and the non-finite count was taken before it: a skipped step
(``skip_if`` set) gets ``clip_coef = 1`` and clips nothing.

A gradient whose dtype differs from its parameter's (a float16 gradient of a float32 master
weight, made by a white node under AMP) is cast to the parameter's dtype by ``master_grad``: one
cast per parameter, right before its update op, unless the loss-scale or gradient-accumulation pass
cast it already. The gradient results keep the gradient as autograd/AMP (or the
loss-scale pass) made it.
"""
from __future__ import annotations

import numpy as np

from ..dtype import float64
from ..ir import Graph, grad_name
from ..ops import emitter
from .loss_scale import LossScaleState
from .master_grad import master_grad

__all__ = ["optimizer", "learning_rate_name"]


def learning_rate_name(k: int, j: int = 0) -> str:
    """The variable name of the learning rate of the k-th optimizer's param group ``j``."""
    return f"optimizer{k}.learning_rate" if j == 0 else f"optimizer{k}.group{j}.learning_rate"


def optimizer(graph: Graph, ctx) -> Graph:
    """Emit update ops for every parameter that has a gradient."""
    settings = ctx.settings
    if not graph.grads or not settings.optimizers:
        return graph
    scaling = ctx.state.get(LossScaleState)
    skip_if = scaling.skip_if if scaling is not None else None
    if skip_if is None:
        skip_if = graph.add_constant(np.zeros(1, np.int64))
    for k, opt in enumerate(settings.optimizers):
        for j, (group, first, stop) in enumerate(opt.group_slices()):
            _group_updates(graph, settings, opt, group, range(first, stop), opt.clip_grads[j],
                           learning_rate_name(k, j), opt.learning_rates[j], skip_if)
    return graph


def _group_updates(graph: Graph, settings, opt, group, indices, clip, lr_name: str, lr_array,
                   skip_if) -> None:
    """The update ops of one param group: parameters ``opt.params[i]`` for ``i`` in
    ``indices``, clipped together by ``clip`` (``(max_norm, norm_type)`` or None), reading the
    variable ``lr_name``."""
    trained = []  # (index, variable name, parameter Value, master gradient)
    for i in indices:
        name = settings.param_names[id(opt.params[i])]  # nn.Graph checked every one is a variable
        grad = graph.grads.get(name)
        if grad is None:
            continue  # like PyTorch: a parameter without a gradient is not updated
        param = graph.variables[name]
        trained.append((i, name, param, master_grad(graph, param, grad)))
    if not trained:
        return
    if clip is not None:
        trained = _clipped(graph, trained, skip_if, *clip)
    lr = graph.add_variable(lr_name, (1,), float64, data=lr_array)
    hyper = group.hyper()
    for i, name, param, grad in trained:
        opt.emit_update(graph, i, name, param, grad, lr, skip_if, hyper)


CLIP_COEF = "clip_coef:"
"""The prefix of the results holding each clipped group's ``clip_coef`` (see the module
docstring)."""


def _clipped(graph: Graph, trained: list, skip_if, max_norm: float, norm_type: float) -> list:
    """``trained`` with every gradient clipped by the global norm (the module docstring); the
    gradient results become the clipped gradients."""
    emit = emitter(graph)
    _, coef = emit("clip_grad_norm", skip_if, *(g for *_, g in trained), max_norm=max_norm,
                   norm_type=norm_type)
    graph.results[f"{CLIP_COEF}{sum(k.startswith(CLIP_COEF) for k in graph.results)}"] = coef
    out = []
    for i, name, param, grad in trained:
        clipped = emit("scalar_mul_by_tensor", grad, coef)
        graph.results[grad_name(name)] = clipped
        out.append((i, name, param, clipped))
    return out
