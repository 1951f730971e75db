"""The optimizer updates (``sgd_update``, ``adam_update``, ``adadelta_update`` and the
multi-tensor updates with cast, ``multi_tensor_sgd_update_with_cast``,
``multi_tensor_adam_update_with_cast``, ``multi_tensor_adadelta_update_with_cast``) of every
backend: their per-element math as scalar
bodies, and their builders (the multi-tensor ones hand the backend the per-tensor buffers
grouped: models, model_diffs, model_copies, state).

The bodies follow PyTorch's single-tensor rules (``torch/optim/sgd.py``, ``torch/optim/adam.py``,
``torch/optim/adadelta.py``; Adam, not AdamW: weight decay is added to the gradient). They are
plain Python functions of scalars that return tuples, compiled into each backend's loop
(``numba.njit`` via ``register_jitable`` on the CPU, ``cuda.jit(device=True)`` on CUDA): the
backends own only the loops, ``skip_if`` (nothing happens when ``skip_if[0] != 0``: OneFlow's
update kernels return early; the loss-scale pass feeds the non-finite count there) and the
conversions. The learning rate is read from its f64[1] input (``lr[0]``) when the kernel runs, so
a new lr needs no new plan. Every operand of a body is in the model's compute type (float32 for
f16/f32, float64 for f64; Numba types float literals as float64, so the bodies have none), except
:func:`adam_corrections`, which is float64 throughout.
"""
from __future__ import annotations

import math

from .table import GroupBuilder

__all__ = ["sgd_element", "adam_corrections", "adam_element", "adadelta_element", "weight_decays",
           "sgd_builder", "adam_builder", "adadelta_builder", "multi_tensor_groups",
           "multi_sgd_cast_builder", "multi_adam_cast_builder", "multi_adadelta_cast_builder",
           "multi_sgd_builder", "multi_adam_builder", "multi_adadelta_builder"]


# ----------------------------------------------------------------------------- scalar bodies
def sgd_element(p, g, buf, lr, mu, wd, momentum, nesterov, dampened, one_d, first):
    """One element of an SGD step: ``(p, buf)`` after ``g += wd*p`` (only when ``wd != 0``, as
    ``torch.optim.SGD``: an infinite ``p`` stays infinite rather than ``inf*0 = NaN``); with
    ``momentum`` ``buf = mu*buf + g`` and then ``g = buf``, or with ``nesterov`` ``g = g + mu*buf``
    (Sutskever et al. 2013's Nesterov momentum as ``torch.optim.SGD`` writes it); ``p -= lr*g``
    (buf starts at zeros, which equals PyTorch's first step ``buf = g``; without ``momentum``
    buf is returned as given and ``nesterov`` is not read). ``dampened`` (a kernel's constant,
    only with momentum): ``buf = g`` when ``first`` (PyTorch's first step, its buffer None), else
    ``buf = mu*buf + one_d*g`` (``one_d = 1 - dampening``); without it ``one_d`` and ``first`` are
    not read."""
    if wd != 0:
        g = g + wd * p
    if momentum:
        if not dampened:
            buf = mu * buf + g
        elif first:
            buf = g
        else:
            buf = mu * buf + one_d * g
        if nesterov:
            g = g + mu * buf
        else:
            g = buf
    return p - lr * g, buf


def adam_corrections(lr, beta1, beta2, t):
    """Adam's bias corrections at step ``t`` (1, 2, ...), in float64: ``(lr / bc1, sqrt(bc2))``
    with ``bc = 1 - beta**t``."""
    return lr / (1.0 - beta1 ** t), math.sqrt(1.0 - beta2 ** t)


def adam_element(p, g, m, v, vmax, hyper, amsgrad):
    """One element of an Adam step: ``(p, m, v, vmax)`` after ``g += wd*p`` (only when ``wd != 0``,
    as :func:`sgd_element`), ``m = b1*m + (1-b1)*g;
    v = b2*v + (1-b2)*(g*g); p = p * decay - step_size * m / (sqrt(v)/bc2_sqrt + eps)``; with
    ``amsgrad`` (Reddi et al., "On the Convergence of Adam and Beyond", ICLR 2018, as
    ``torch.optim.Adam`` writes it) ``vmax = max(vmax, v)`` replaces ``v`` in the denominator
    (PyTorch's ``max_exp_avg_sq``); without it ``vmax`` is returned as given.

    ``hyper``: ``(step_size, bc2_sqrt, b1, b2, 1 - b1, 1 - b2, eps, wd, decay)`` in the compute
    type (the first two from :func:`adam_corrections`; ``decay = 1 - lr * decoupled_weight_decay``,
    AdamW's decoupled weight decay (Loshchilov and Hutter 2019, ``torch.optim.AdamW``: ``p *= 1 -
    lr * wd`` before the Adam step), exactly 1 without it)."""
    step_size, bc2_sqrt, b1, b2, one_b1, one_b2, eps, wd, decay = hyper
    if wd != 0:
        g = g + wd * p
    m = b1 * m + one_b1 * g
    v = b2 * v + one_b2 * (g * g)
    if amsgrad:
        vmax = vmax if vmax >= v else v     # a NaN v propagates, as torch.maximum
        denom = math.sqrt(vmax) / bc2_sqrt + eps
    else:
        denom = math.sqrt(v) / bc2_sqrt + eps
    return p * decay - step_size * (m / denom), m, v, vmax


def adadelta_element(p, g, square_avg, acc_delta, lr, rho, one_rho, eps, wd, maximize):
    """One element of an Adadelta step (Zeiler 2012, as ``torch.optim.Adadelta`` writes it):
    ``(p, square_avg, acc_delta)`` after ``g = -g`` with ``maximize``, ``g += wd*p`` (only when
    ``wd != 0``, as :func:`sgd_element`), ``square_avg = rho*square_avg + (1-rho)*(g*g);
    delta = sqrt(acc_delta + eps) / sqrt(square_avg + eps) * g;
    acc_delta = rho*acc_delta + (1-rho)*(delta*delta); p -= lr*delta`` (``one_rho = 1 - rho``)."""
    if maximize:
        g = -g
    if wd != 0:
        g = g + wd * p
    square_avg = rho * square_avg + one_rho * (g * g)
    delta = math.sqrt(acc_delta + eps) / math.sqrt(square_avg + eps) * g
    acc_delta = rho * acc_delta + one_rho * (delta * delta)
    return p - lr * delta, square_avg, acc_delta


def weight_decays(attrs) -> tuple:
    """``(weight_decay, decoupled_weight_decay)`` of an Adam update node's ``attrs``: the ``wd``
    the Adam step makers pass to their kernels (the coupled one is added to the gradient, the
    decoupled one scales the weight by ``1 - lr * decoupled``)."""
    return (float(attrs.get("weight_decay", 0.0)),
            float(attrs.get("decoupled_weight_decay", 0.0)))


# ----------------------------------------------------------------------------- builders
def _momentum(attrs, ins) -> float:
    """The momentum of ``sgd_update`` nodes with ``attrs`` and input arrays ``ins`` (one list
    per node).

    Raises:
        ValueError: ``momentum != 0`` without a momentum buffer input.
    """
    mu = float(attrs.get("momentum", 0.0))
    if mu != 0.0 and any(len(arrays) < 5 for arrays in ins):
        raise ValueError("sgd_update: momentum != 0 needs a momentum_buf input (5 inputs)")
    return mu


def _nesterov(attrs) -> bool:
    """Whether SGD update nodes with ``attrs`` use Nesterov momentum (the attribute is present
    only when true)."""
    return bool(attrs.get("nesterov", False))


def _dampening(attrs) -> float:
    """The dampening of SGD update nodes with ``attrs`` (present only when non-zero; read only
    with momentum, and then the nodes have a step input per tensor)."""
    return float(attrs.get("dampening", 0.0)) if float(attrs.get("momentum", 0.0)) else 0.0


def sgd_builder(sgd_steps):
    """The ``sgd_update`` builder over a backend's ``sgd_steps(p, grad, lr, skip_if, buf, mu,
    wd, nesterov, dampening, step)`` (``lr`` the f64[1] learning-rate array, ``buf`` None
    without momentum; mu, wd, dampening Python floats, nesterov a bool; ``step`` the buffer's
    i64[1] step count with dampening, else None)."""
    def build_sgd_update(node, ins, outs):
        """``sgd_update(model, model_diff, learning_rate, skip_if[, momentum_buf[, step]])``
        ``{momentum, weight_decay[, dampening][, nesterov]}``.

        Raises:
            ValueError: ``momentum != 0`` without a momentum buffer input.
        """
        a = node.attrs
        mu = _momentum(a, [ins])
        p, grad, lr, skip_if = ins[:4]
        damp = _dampening(a)
        return sgd_steps(p, grad, lr, skip_if, ins[4] if mu != 0.0 else None, mu,
                         float(a.get("weight_decay", 0.0)), _nesterov(a), damp,
                         ins[5] if damp else None)
    return build_sgd_update


def adam_builder(adam_steps):
    """The ``adam_update`` builder over a backend's ``adam_steps(p, grad, lr, skip_if, m, v,
    step, beta1, beta2, eps, wd, vmax)`` (``lr`` the f64[1] learning-rate array; the other
    hyperparameters Python floats, ``wd`` the pair :func:`weight_decays`; ``vmax`` the
    ``max_exp_avg_sq`` array with amsgrad, else None)."""
    def build_adam_update(node, ins, outs):
        """``adam_update(model, model_diff, learning_rate, skip_if, m, v, step[, max_v])``
        ``{beta1, beta2, eps, weight_decay[, amsgrad]}``."""
        a = node.attrs
        return adam_steps(*ins[:7], float(a["beta1"]), float(a["beta2"]), float(a["eps"]),
                          weight_decays(a), ins[7] if _amsgrad(a) else None)
    return build_adam_update


def _adadelta_hyper(attrs) -> tuple:
    """``(rho, eps, weight_decay, maximize)`` of ``adadelta_update`` nodes with ``attrs``
    (``maximize`` is present only when true)."""
    return (float(attrs["rho"]), float(attrs["eps"]), float(attrs.get("weight_decay", 0.0)),
            bool(attrs.get("maximize", False)))


def adadelta_builder(adadelta_steps):
    """The ``adadelta_update`` builder over a backend's ``adadelta_steps(p, grad, lr, skip_if,
    square_avg, acc_delta, step, rho, eps, wd, maximize)`` (``lr`` the f64[1] learning-rate
    array; rho, eps, wd Python floats, maximize a bool)."""
    def build_adadelta_update(node, ins, outs):
        """``adadelta_update(model, model_diff, learning_rate, skip_if, square_avg, acc_delta,
        step)`` ``{rho, eps, weight_decay[, maximize]}``."""
        return adadelta_steps(*ins[:7], *_adadelta_hyper(node.attrs))
    return build_adadelta_update


def _amsgrad(attrs) -> bool:
    """Whether Adam update nodes with ``attrs`` keep ``max_exp_avg_sq`` (the attribute is
    present only when true)."""
    return bool(attrs.get("amsgrad", False))


def multi_tensor_groups(ins, per_tensor: int) -> tuple:
    """``(lr, skip_if, scale, groups)``: a multi-tensor update's buffers, the per-tensor ones in
    ``per_tensor`` lists (models, model_diffs, model_copies, then the state)."""
    n = (len(ins) - 3) // per_tensor
    rest = ins[3:]
    return (*ins[:3], [list(rest[g * n:(g + 1) * n]) for g in range(per_tensor)])


def multi_sgd_cast_builder(multi_sgd_steps):
    """The ``multi_tensor_sgd_update_with_cast`` builder over a backend's
    ``multi_sgd_steps(models, diffs, copies, bufs, lr, skip_if, scale, mu, wd, nesterov,
    dampening, steps)`` (``bufs`` None without momentum, ``steps`` None without dampening; mu,
    wd, dampening Python floats)."""
    def build_multi_tensor_sgd_update_with_cast(node, ins, outs):
        """``multi_tensor_sgd_update_with_cast(learning_rate, skip_if, scale_by_tensor, models,
        model_diffs, model_copies[, momentum_bufs[, steps]])`` ``{momentum, weight_decay[,
        dampening][, nesterov]}``."""
        a = node.attrs
        mu, damp = float(a.get("momentum", 0.0)), _dampening(a)
        lr, skip_if, scale, groups = multi_tensor_groups(ins, 3 + (mu != 0.0) + (damp != 0.0))
        return multi_sgd_steps(*groups[:3], groups[3] if mu != 0.0 else None, lr, skip_if, scale,
                               mu, float(a.get("weight_decay", 0.0)), _nesterov(a), damp,
                               groups[4] if damp else None)
    return build_multi_tensor_sgd_update_with_cast


def multi_adam_cast_builder(multi_adam_steps):
    """The ``multi_tensor_adam_update_with_cast`` builder over a backend's
    ``multi_adam_steps(models, diffs, copies, ms, vs, steps, lr, skip_if, scale, beta1, beta2,
    eps, wd, vmaxs)`` (``vmaxs`` None without amsgrad)."""
    def build_multi_tensor_adam_update_with_cast(node, ins, outs):
        """``multi_tensor_adam_update_with_cast(learning_rate, skip_if, scale_by_tensor, models,
        model_diffs, model_copies, m, v, steps[, max_v])`` ``{beta1, beta2, eps, weight_decay[,
        amsgrad]}``."""
        a = node.attrs
        ams = _amsgrad(a)
        lr, skip_if, scale, groups = multi_tensor_groups(ins, 7 if ams else 6)
        return multi_adam_steps(*groups[:6], lr, skip_if, scale, float(a["beta1"]),
                                float(a["beta2"]), float(a["eps"]), weight_decays(a),
                                groups[6] if ams else None)
    return build_multi_tensor_adam_update_with_cast


def multi_adadelta_cast_builder(multi_adadelta_steps):
    """The ``multi_tensor_adadelta_update_with_cast`` builder over a backend's
    ``multi_adadelta_steps(models, diffs, copies, square_avgs, acc_deltas, steps, lr, skip_if,
    scale, rho, eps, wd, maximize)``."""
    def build_multi_tensor_adadelta_update_with_cast(node, ins, outs):
        """``multi_tensor_adadelta_update_with_cast(learning_rate, skip_if, scale_by_tensor,
        models, model_diffs, model_copies, square_avgs, acc_deltas, steps)`` ``{rho, eps,
        weight_decay[, maximize]}``."""
        lr, skip_if, scale, groups = multi_tensor_groups(ins, 6)
        return multi_adadelta_steps(*groups, lr, skip_if, scale, *_adadelta_hyper(node.attrs))
    return build_multi_tensor_adadelta_update_with_cast


def multi_sgd_builder(multi_sgd_steps):
    """The group builder of ``sgd_update`` over a backend's ``multi_sgd_steps(ps, grads, lr,
    skip_if, bufs, mu, wd, nesterov, dampening, steps)`` (lists of arrays, ``bufs`` None without
    momentum, ``steps`` None without dampening)."""
    def build_multi_sgd_update(nodes, ins, outs):
        """The ``sgd_update`` nodes ``nodes`` (equal attributes, one lr and skip_if) as one.

        Raises:
            ValueError: ``momentum != 0`` without a momentum buffer input.
        """
        a = nodes[0].attrs
        mu = _momentum(a, ins)
        bufs = [arrays[4] for arrays in ins] if mu != 0.0 else None
        damp = _dampening(a)
        return multi_sgd_steps([x[0] for x in ins], [x[1] for x in ins], ins[0][2], ins[0][3],
                               bufs, mu, float(a.get("weight_decay", 0.0)), _nesterov(a), damp,
                               [arrays[5] for arrays in ins] if damp else None)
    return GroupBuilder(build_multi_sgd_update)


def multi_adam_builder(multi_adam_steps):
    """The group builder of ``adam_update`` over a backend's ``multi_adam_steps(ps, grads, lr,
    skip_if, ms, vs, steps, beta1, beta2, eps, wd, vmaxs)`` (lists of arrays, ``vmaxs`` None
    without amsgrad)."""
    def build_multi_adam_update(nodes, ins, outs):
        """The ``adam_update`` nodes ``nodes`` (equal attributes, one lr and skip_if) as one."""
        a = nodes[0].attrs
        return multi_adam_steps([x[0] for x in ins], [x[1] for x in ins], ins[0][2], ins[0][3],
                                [x[4] for x in ins], [x[5] for x in ins], [x[6] for x in ins],
                                float(a["beta1"]), float(a["beta2"]), float(a["eps"]),
                                weight_decays(a), [x[7] for x in ins] if _amsgrad(a) else None)
    return GroupBuilder(build_multi_adam_update)


def multi_adadelta_builder(multi_adadelta_steps):
    """The group builder of ``adadelta_update`` over a backend's ``multi_adadelta_steps(ps,
    grads, lr, skip_if, square_avgs, acc_deltas, steps, rho, eps, wd, maximize)`` (lists of
    arrays)."""
    def build_multi_adadelta_update(nodes, ins, outs):
        """The ``adadelta_update`` nodes ``nodes`` (equal attributes, one lr and skip_if) as
        one."""
        return multi_adadelta_steps(*([x[k] for x in ins] for k in (0, 1)), ins[0][2], ins[0][3],
                                    *([x[k] for x in ins] for k in (4, 5, 6)),
                                    *_adadelta_hyper(nodes[0].attrs))
    return GroupBuilder(build_multi_adadelta_update)
