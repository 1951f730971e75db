"""Optimizer update ops. They have no outputs: they write their variable inputs in place
(``writes``), which makes them side-effecting, so dead-code elimination keeps them. Their references
return the new values of the written inputs (float64 arithmetic).

* ``sgd_update(model, model_diff, learning_rate, skip_if[, momentum_buf[, step]])`` {momentum,
  weight_decay[, dampening][, nesterov]}: PyTorch ``torch.optim.SGD``: ``g = diff + wd * p``
  (only when ``wd != 0``, in ``adam_update`` too); ``buf = momentum * buf + g; p -= lr * buf``;
  with ``nesterov`` (present only when true, and only with momentum and no dampening) ``p -= lr
  * (g + momentum * buf)``. ``dampening`` (OneFlow's attribute of its momentum update; present
  only when non-zero, and then with momentum an i64[1] ``step`` input, how many steps updated
  the buffer): ``buf = g`` at ``step`` 0 (PyTorch's first step, its buffer None), else ``buf =
  momentum * buf + (1 - dampening) * g``; then ``step += 1``. Without dampening the buffer
  starts at zeros, and ``momentum * 0 + g`` is PyTorch's first step.
* ``adam_update(model, model_diff, learning_rate, skip_if, m, v, step[, max_v])`` {beta1, beta2,
  eps, weight_decay[, decoupled_weight_decay][, amsgrad]}: PyTorch ``torch.optim.Adam`` (Kingma &
  Ba 2015, arXiv:1412.6980) with bias correction at step ``step + 1``; ``amsgrad`` (present only
  when true; Reddi et al. 2018) keeps ``max_v = max(max_v, v)`` (PyTorch's ``max_exp_avg_sq``)
  and divides by its root instead of v's; ``decoupled_weight_decay`` (present
  only when non-zero) makes it ``torch.optim.AdamW`` (Loshchilov & Hutter 2019,
  arXiv:1711.05101): ``p *= 1 - lr * decoupled_weight_decay`` before the step (OneFlow's
  ``adam_update`` calls this one ``weight_decay`` and the coupled one ``l2``).
* ``adadelta_update(model, model_diff, learning_rate, skip_if, square_avg, acc_delta, step)``
  {rho, eps, weight_decay[, maximize]}: PyTorch ``torch.optim.Adadelta`` (Zeiler 2012,
  arXiv:1212.5701): ``g = -diff`` with ``maximize`` (present only when true), ``g += wd * p``
  (only when ``wd != 0``), ``square_avg = rho * square_avg + (1 - rho) * g^2; delta =
  sqrt(acc_delta + eps) / sqrt(square_avg + eps) * g; acc_delta = rho * acc_delta + (1 - rho) *
  delta^2; p -= lr * delta; step += 1`` (PyTorch's state keys; the step count is kept, as
  PyTorch keeps it, and read by nothing).

``learning_rate`` is an f64 ``[1]`` value (OneFlow's update ops take the learning rate as the
tensor input ``learning_rate``; OneFlow's is float32, miniflow's float64, so a Python float lr is
used exactly, as the optimizer's ``param_groups[0]["lr"]`` holds it): the optimizer owns it as a
graph variable, so a new lr changes a number in memory and never the compiled graph. Adam's bias
corrections come from its ``step`` variable in the kernel (OneFlow computes them from its
``train_step`` tensor with ``adam_bias_correction_factor``): nothing step-dependent is an attribute.

``skip_if`` is an int64 ``[1]`` value; when non-zero the op changes nothing (parameters, moments, step
count), as OneFlow's update kernels return early on ``skip_if`` (loss scaling skips overflowing steps).

The multi-tensor updates with cast (OneFlow's ``multi_tensor_sgd_update_with_cast`` /
``multi_tensor_momentum_update_with_cast`` and ``multi_tensor_adam_update_with_cast``, made by
the ``fuse_model_update_cast`` pass under AMP) update several parameters in one kernel and, in
the same pass over memory, unscale the gradient and write the half copy of each weight that the
next step's matmuls read:

* ``multi_tensor_sgd_update_with_cast(learning_rate, skip_if, scale_by_tensor, model_0..n-1,
  model_diff_0.., model_copy_0..[, momentum_buf_0..[, step_0..]])`` {momentum,
  weight_decay[, dampening][, nesterov], model_copy_dtype}: per tensor ``g = model_diff *
  scale_by_tensor`` (the diff in float32 or a half type, widened; ``scale_by_tensor`` is 1 /
  loss scale, f32[1]), then ``sgd_update``'s step on the float32 model, then ``model_copy =
  model`` rounded to ``model_copy_dtype``. OneFlow has a separate momentum op; here, as
  ``sgd_update``, momentum != 0 adds the buffers (and dampening their step counts).
* ``multi_tensor_adam_update_with_cast(learning_rate, skip_if, scale_by_tensor, model_0..,
  model_diff_0.., model_copy_0.., m_0.., v_0.., step_0..[, max_v_0..])`` {beta1, beta2, eps,
  weight_decay[, amsgrad], model_copy_dtype}: the same around ``adam_update``'s step, each tensor with its step count.
* ``multi_tensor_adadelta_update_with_cast(learning_rate, skip_if, scale_by_tensor, model_0..,
  model_diff_0.., model_copy_0.., square_avg_0.., acc_delta_0.., step_0..)`` {rho, eps,
  weight_decay[, maximize], model_copy_dtype}: the same around ``adadelta_update``'s step
  (miniflow's: OneFlow has no Adadelta).

With ``skip_if`` set nothing changes: no model, no state, no copy.
"""
from __future__ import annotations

import numpy as np

from ..dtype import bfloat16, float32, float64, int64
from .common import fmt, rand, rounded
from .registry import register


N_FIXED = 4
"""Inputs every update op starts with: model, model_diff, learning_rate, skip_if."""


def _check(op, inputs, n_state):
    if len(inputs) != N_FIXED + n_state:
        raise ValueError(f"{op}: expects {N_FIXED + n_state} inputs, got {len(inputs)}")
    model, diff, lr, skip_if = inputs[:N_FIXED]
    if not model.dtype.is_float or model.kind != "variable":
        raise TypeError(f"{op}: model {fmt(model)} must be a floating-point variable")
    if diff.shape != model.shape or diff.dtype is not model.dtype:
        raise ValueError(f"{op}: model_diff {fmt(diff)} must match model {fmt(model)} in shape "
                         f"and dtype (fp16 gradients are cast to the master weight dtype first)")
    if lr.dtype is not float64 or lr.shape != (1,):
        raise TypeError(f"{op}: learning_rate {fmt(lr)} must be f64[1] (the optimizer's lr "
                        "variable)")
    if skip_if.dtype is not int64 or skip_if.shape != (1,):
        raise TypeError(f"{op}: skip_if {fmt(skip_if)} must be i64[1]")


def _no_lr_attr(op, attrs):
    if "lr" in attrs:
        raise ValueError(f"{op}: the learning rate is the input learning_rate (an f64[1] "
                         "variable), not an attribute; drop lr=")


def _sgd_norm(inputs, attrs):
    _no_lr_attr("sgd_update", attrs)
    for k in ("momentum", "weight_decay"):
        attrs[k] = float(attrs.get(k, 0.0))
    if float(attrs.get("dampening", 0.0)) != 0.0:
        attrs["dampening"] = float(attrs["dampening"])
    else:
        attrs.pop("dampening", None)
    if attrs.pop("nesterov", False):
        if attrs["momentum"] <= 0.0 or "dampening" in attrs:
            raise ValueError("sgd_update: nesterov=True needs momentum > 0 and dampening 0, got "
                             f"momentum {attrs['momentum']:g}, dampening "
                             f"{attrs.get('dampening', 0.0):g}")
        attrs["nesterov"] = True
    return attrs


def _sgd_state(attrs) -> int:
    """``sgd_update``'s state inputs: none without momentum, else the buffer (and its step
    count with dampening)."""
    if float(attrs.get("momentum", 0.0)) == 0.0:
        return 0
    return 2 if float(attrs.get("dampening", 0.0)) != 0.0 else 1


def _sgd_infer(inputs, attrs):
    n_state = _sgd_state(attrs)
    _check("sgd_update", inputs, n_state)
    if n_state and inputs[N_FIXED].shape != inputs[0].shape:
        raise ValueError(f"sgd_update: momentum buffer {fmt(inputs[N_FIXED])} must match "
                         f"{fmt(inputs[0])}")
    if n_state == 2 and (inputs[-1].dtype is not int64 or inputs[-1].shape != (1,)):
        raise TypeError(f"sgd_update: step {fmt(inputs[-1])} must be i64[1] (with dampening)")
    return []


def _adam_norm(inputs, attrs):
    _no_lr_attr("adam_update", attrs)
    for k, d in (("beta1", 0.9), ("beta2", 0.999), ("eps", 1e-8), ("weight_decay", 0.0)):
        attrs[k] = float(attrs.get(k, d))
    if float(attrs.get("decoupled_weight_decay", 0.0)) != 0.0:
        attrs["decoupled_weight_decay"] = float(attrs["decoupled_weight_decay"])
    else:
        attrs.pop("decoupled_weight_decay", None)
    if attrs.pop("amsgrad", False):
        attrs["amsgrad"] = True
    return attrs


def _adam_state(attrs) -> int:
    """Adam's state inputs per tensor: m, v, step (and max_v with amsgrad)."""
    return 4 if attrs.get("amsgrad") else 3


def _adam_writes(attrs, n_inputs: int) -> tuple:
    return (0, *range(N_FIXED, N_FIXED + _adam_state(attrs)))


def _adam_infer(inputs, attrs):
    _check("adam_update", inputs, _adam_state(attrs))
    m, v, step = inputs[N_FIXED:N_FIXED + 3]
    for s in (m, v, *inputs[N_FIXED + 3:]):
        if s.shape != inputs[0].shape or s.dtype is not inputs[0].dtype:
            raise ValueError(f"adam_update: moment {fmt(s)} must match {fmt(inputs[0])}")
    if step.dtype is not int64 or step.shape != (1,):
        raise TypeError(f"adam_update: step {fmt(step)} must be i64[1]")
    return []


def _adadelta_norm(inputs, attrs):
    _no_lr_attr("adadelta_update", attrs)
    for k, d in (("rho", 0.9), ("eps", 1e-6), ("weight_decay", 0.0)):
        attrs[k] = float(attrs.get(k, d))
    if attrs.pop("maximize", False):
        attrs["maximize"] = True
    return attrs


def _adadelta_infer(inputs, attrs):
    _check("adadelta_update", inputs, 3)
    square_avg, acc_delta, step = inputs[N_FIXED:]
    for s in (square_avg, acc_delta):
        if s.shape != inputs[0].shape or s.dtype is not inputs[0].dtype:
            raise ValueError(f"adadelta_update: state {fmt(s)} must match {fmt(inputs[0])}")
    if step.dtype is not int64 or step.shape != (1,):
        raise TypeError(f"adadelta_update: step {fmt(step)} must be i64[1]")
    return []


def _samples(n_state, lr, attrs):
    def make():
        out = []
        for skip in (0, 1):
            r = np.random.default_rng(21)
            p, g = rand(4, 3, r=r), rand(4, 3, r=r)
            state = [rand(4, 3, r=r) for _ in range(min(n_state, 1))]
            if n_state >= 3:
                state = [rand(4, 3, r=r) * 0.1, rand(4, 3, r=r, lo=0.0, hi=0.1),
                         np.array([3], np.int64)]
            if n_state == 4:                  # max_v: above v in some elements, below in others
                state.append(rand(4, 3, r=r, lo=0.0, hi=0.1))
            out.append(([p, g, np.array([lr]), np.array([skip], np.int64), *state], dict(attrs)))
        return out
    return make


def _dampened_samples() -> list:
    """SGD with dampening: a first step (step 0: the buffer is the gradient) and a later one,
    with weight decay; skipped and not."""
    out = []
    for step, attrs in ((0, {"momentum": 0.9, "dampening": 0.5, "weight_decay": 0.01}),
                        (3, {"momentum": 0.8, "dampening": 1.0})):
        for (arrays, a) in _samples(1, 0.1, attrs)():
            out.append(([*arrays, np.array([step], np.int64)], a))
    return out


def _adadelta_samples(lr, attrs) -> list:
    """Skipped and not: square_avg and acc_delta >= 0 (sums of squares), one of them 0 in
    some elements (a first step), a step count."""
    out = []
    for skip in (0, 1):
        r = np.random.default_rng(22)
        p, g = rand(4, 3, r=r), rand(4, 3, r=r)
        square_avg, acc_delta = rand(4, 3, r=r, lo=0.0, hi=0.5), rand(4, 3, r=r, lo=0.0, hi=0.1)
        square_avg[0], acc_delta[1] = 0.0, 0.0
        out.append(([p, g, np.array([lr]), np.array([skip], np.int64), square_avg, acc_delta,
                     np.array([3], np.int64)], dict(attrs)))
    return out


def _sgd_ref(arrays, attrs):
    """PyTorch's SGD step: the new parameter (and momentum buffer, and its step count with
    dampening)."""
    p, diff, lr, skip_if, *state = arrays
    if skip_if[0] != 0:
        return [p.copy(), *(b.copy() for b in state)]
    g = diff + attrs["weight_decay"] * p if attrs["weight_decay"] else diff
    if state:
        mu, damp = attrs["momentum"], attrs.get("dampening", 0.0)
        first = len(state) == 2 and state[1][0] == 0
        buf = g.copy() if first else mu * state[0] + (1.0 - damp) * g
        g = g + mu * buf if attrs.get("nesterov") else buf
        state = [buf, *(s + 1 for s in state[1:])]
    return [p - lr[0] * g, *state]


def _adam_ref(arrays, attrs):
    """PyTorch's Adam step with bias correction: the new parameter, moments and step count
    (and max_v with amsgrad)."""
    p, diff, lr, skip_if, m, v, step, *vmax = arrays
    if skip_if[0] != 0:
        return [p.copy(), m.copy(), v.copy(), step.copy(), *(x.copy() for x in vmax)]
    b1, b2, t = attrs["beta1"], attrs["beta2"], step + 1
    g = diff + attrs["weight_decay"] * p if attrs["weight_decay"] else diff
    p = p * (1.0 - lr[0] * attrs.get("decoupled_weight_decay", 0.0))
    m = b1 * m + (1.0 - b1) * g
    v = b2 * v + (1.0 - b2) * g * g
    bc1, bc2 = 1.0 - b1 ** t[0], 1.0 - b2 ** t[0]
    vmax = [np.maximum(vmax[0], v)] if vmax else []
    denom = np.sqrt(vmax[0] if vmax else v) / np.sqrt(bc2) + attrs["eps"]
    return [p - lr[0] / bc1 * m / denom, m, v, t, *vmax]


def _adadelta_ref(arrays, attrs):
    """PyTorch's Adadelta step: the new parameter, square_avg, acc_delta and step count."""
    p, diff, lr, skip_if, square_avg, acc_delta, step = arrays
    if skip_if[0] != 0:
        return [p.copy(), square_avg.copy(), acc_delta.copy(), step.copy()]
    rho, eps = attrs["rho"], attrs["eps"]
    g = -diff if attrs.get("maximize") else diff
    g = g + attrs["weight_decay"] * p if attrs["weight_decay"] else g
    square_avg = rho * square_avg + (1.0 - rho) * g * g
    delta = np.sqrt(acc_delta + eps) / np.sqrt(square_avg + eps) * g
    acc_delta = rho * acc_delta + (1.0 - rho) * delta * delta
    return [p - lr[0] * delta, square_avg, acc_delta, step + 1]


_UPDATE_NOTE = "optimizer update: runs after AMP, writes the float32 master weights"

register("sgd_update", _sgd_infer, normalize=_sgd_norm,
         writes=(0, N_FIXED, N_FIXED + 1),
         reference=_sgd_ref,
         samples=lambda: (_samples(1, 0.1, {"momentum": 0.9, "weight_decay": 0.01})()
                          + _samples(1, 0.1, {"momentum": 0.9, "nesterov": True})()
                          + _dampened_samples()),
         amp=None, amp_note=_UPDATE_NOTE,
         doc="p -= lr * (momentum buffer of diff + wd * p); skipped when skip_if != 0")
register("adam_update", _adam_infer, normalize=_adam_norm,
         writes=_adam_writes, reference=_adam_ref,
         samples=lambda: (_samples(3, 0.01, {"weight_decay": 0.01})()
                          + _samples(3, 0.01, {"decoupled_weight_decay": 0.1})()
                          + _samples(4, 0.01, {"weight_decay": 0.01, "amsgrad": True})()),
         amp=None, amp_note=_UPDATE_NOTE,
         doc="Adam with bias correction; skipped when skip_if != 0")
register("adadelta_update", _adadelta_infer, normalize=_adadelta_norm,
         writes=(0, N_FIXED, N_FIXED + 1, N_FIXED + 2), reference=_adadelta_ref,
         samples=lambda: (_adadelta_samples(1.0, {"rho": 0.9, "eps": 1e-6, "weight_decay": 0.01})
                          + _adadelta_samples(0.5, {"rho": 0.5, "eps": 1e-3, "maximize": True})),
         amp=None, amp_note=_UPDATE_NOTE,
         doc="Adadelta (square_avg, acc_delta); skipped when skip_if != 0")


# ----------------------------------------------------------------------------- multi-tensor, with cast
MULTI_FIXED = 3
"""Inputs every multi-tensor update starts with: learning_rate, skip_if, scale_by_tensor."""


def _n_tensors(op: str, n_inputs: int, per_tensor: int) -> int:
    n, rest = divmod(n_inputs - MULTI_FIXED, per_tensor)
    if n < 1 or rest:
        raise ValueError(f"{op}: expects learning_rate, skip_if, scale_by_tensor and then "
                         f"{per_tensor} inputs per tensor, got {n_inputs} inputs")
    return n


def _sgd_cast_per_tensor(attrs) -> int:
    """model, model_diff, model_copy (and momentum_buf with momentum, and step with
    dampening)."""
    return 3 + _sgd_state(attrs)


def _sgd_cast_writes(attrs, n_inputs: int) -> tuple:
    per = _sgd_cast_per_tensor(attrs)
    n = _n_tensors("multi_tensor_sgd_update_with_cast", n_inputs, per)
    groups = (0, 2, 3, 4)[:per - 1]               # models, copies, momentum buffers, steps
    return tuple(MULTI_FIXED + g * n + i for g in groups for i in range(n))


def _adam_cast_per_tensor(attrs) -> int:
    """model, model_diff, model_copy, m, v, step (and max_v with amsgrad)."""
    return 3 + _adam_state(attrs)


def _stateful_cast_writes(op: str, per: int, n_inputs: int) -> tuple:
    """What ``op`` (models, diffs, copies, then ``per - 3`` state groups per tensor) writes: all
    but the learning rate, skip_if, scale and the diffs."""
    n = _n_tensors(op, n_inputs, per)
    return tuple(MULTI_FIXED + g * n + i for g in (0, *range(2, per)) for i in range(n))


def _adam_cast_writes(attrs, n_inputs: int) -> tuple:
    return _stateful_cast_writes("multi_tensor_adam_update_with_cast",
                                 _adam_cast_per_tensor(attrs), n_inputs)


ADADELTA_CAST_PER_TENSOR = 6
"""model, model_diff, model_copy, square_avg, acc_delta, step."""


def _adadelta_cast_writes(attrs, n_inputs: int) -> tuple:
    return _stateful_cast_writes("multi_tensor_adadelta_update_with_cast",
                                 ADADELTA_CAST_PER_TENSOR, n_inputs)


def _multi_check(op, inputs, attrs, per_tensor: int) -> list:
    """Check the fixed inputs and the model / model_diff / model_copy groups; returns the groups
    of per-tensor inputs (a list of ``per_tensor`` lists)."""
    n = _n_tensors(op, len(inputs), per_tensor)
    lr, skip_if, scale = inputs[:MULTI_FIXED]
    if lr.dtype is not float64 or lr.shape != (1,):
        raise TypeError(f"{op}: learning_rate {fmt(lr)} must be f64[1] (the optimizer's lr "
                        "variable)")
    if skip_if.dtype is not int64 or skip_if.shape != (1,):
        raise TypeError(f"{op}: skip_if {fmt(skip_if)} must be i64[1]")
    if scale.dtype is not float32 or scale.shape != (1,):
        raise TypeError(f"{op}: scale_by_tensor {fmt(scale)} must be f32[1] (1 / loss scale)")
    groups = [list(inputs[MULTI_FIXED + g * n:MULTI_FIXED + (g + 1) * n])
              for g in range(per_tensor)]
    half = attrs["model_copy_dtype"]
    if len({d.dtype for d in groups[1]}) != 1:
        raise TypeError(f"{op}: every model_diff must have one dtype, got "
                        + ", ".join(fmt(d) for d in groups[1]))
    for model, diff, copy in zip(*groups[:3]):
        if model.dtype is not float32 or model.kind != "variable":
            raise TypeError(f"{op}: model {fmt(model)} must be a float32 variable (the master "
                            "weight)")
        if diff.shape != model.shape or not (diff.dtype is float32 or diff.dtype.is_half):
            raise ValueError(f"{op}: model_diff {fmt(diff)} must have the shape of model "
                             f"{fmt(model)} and be float32 or a half type")
        if copy.shape != model.shape or copy.dtype is not half or copy.kind != "variable":
            raise ValueError(f"{op}: model_copy {fmt(copy)} must be a {half.name} variable "
                             f"shaped like model {fmt(model)}")
    for group in groups[3:]:
        for state, model in zip(group, groups[0]):
            if state.dtype is int64:
                if state.shape != (1,):
                    raise TypeError(f"{op}: step {fmt(state)} must be i64[1]")
            elif state.shape != model.shape or state.dtype is not model.dtype:
                raise ValueError(f"{op}: state {fmt(state)} must match {fmt(model)}")
    return groups


def _copy_dtype_norm(op, inputs, attrs, per_tensor: int):
    """``model_copy_dtype``: the dtype of the copies (all alike), from the inputs."""
    n = _n_tensors(op, len(inputs), per_tensor)
    copies = inputs[MULTI_FIXED + 2 * n:MULTI_FIXED + 3 * n]
    dtypes = {v.dtype for v in copies}
    if len(dtypes) != 1 or not next(iter(dtypes)).is_half:
        raise TypeError(f"{op}: every model_copy must have one half dtype (float16 or "
                        f"bfloat16), got " + ", ".join(fmt(v) for v in copies))
    attrs["model_copy_dtype"] = dtypes.pop()
    return attrs


def _sgd_cast_norm(inputs, attrs):
    _sgd_norm(inputs, attrs)
    return _copy_dtype_norm("multi_tensor_sgd_update_with_cast", inputs, attrs,
                            _sgd_cast_per_tensor(attrs))


def _sgd_cast_infer(inputs, attrs):
    _multi_check("multi_tensor_sgd_update_with_cast", inputs, attrs, _sgd_cast_per_tensor(attrs))
    return []


def _adam_cast_norm(inputs, attrs):
    _adam_norm(inputs, attrs)
    return _copy_dtype_norm("multi_tensor_adam_update_with_cast", inputs, attrs,
                            _adam_cast_per_tensor(attrs))


def _adam_cast_infer(inputs, attrs):
    _multi_check("multi_tensor_adam_update_with_cast", inputs, attrs, _adam_cast_per_tensor(attrs))
    return []


def _adadelta_cast_norm(inputs, attrs):
    _adadelta_norm(inputs, attrs)
    return _copy_dtype_norm("multi_tensor_adadelta_update_with_cast", inputs, attrs,
                            ADADELTA_CAST_PER_TENSOR)


def _adadelta_cast_infer(inputs, attrs):
    _multi_check("multi_tensor_adadelta_update_with_cast", inputs, attrs,
                 ADADELTA_CAST_PER_TENSOR)
    return []


def _split(arrays, per_tensor: int):
    """``(lr, skip_if, scale, groups)`` of a multi-tensor update's arrays."""
    n = (len(arrays) - MULTI_FIXED) // per_tensor
    rest = arrays[MULTI_FIXED:]
    return (*arrays[:MULTI_FIXED], [rest[g * n:(g + 1) * n] for g in range(per_tensor)])


def _stateful_cast_ref(arrays, attrs, step_ref, per_tensor: int) -> list:
    """Per tensor: ``g = model_diff * scale_by_tensor``, ``step_ref``'s step (the single-tensor
    reference: the new model and state), ``model_copy = model`` rounded; the new models, copies
    and state groups (none changes when skip_if != 0)."""
    lr, skip_if, scale, groups = _split(arrays, per_tensor)
    models, diffs, copies, *state = groups
    if skip_if[0] != 0:
        return [a.copy() for g in (models, copies, *state) for a in g]
    new = [step_ref([p, d * scale[0], lr, skip_if, *(g[k] for g in state)], attrs)
           for k, (p, d) in enumerate(zip(models, diffs))]
    new_models = [x[0] for x in new]
    return (new_models + [rounded(p, attrs["model_copy_dtype"]) for p in new_models]
            + [x[j] for j in range(1, 1 + len(state)) for x in new])


def _sgd_cast_ref(arrays, attrs):
    """PyTorch's SGD step with the copies: the new models, copies and momentum buffers (and
    their step counts with dampening)."""
    return _stateful_cast_ref(arrays, attrs, _sgd_ref, _sgd_cast_per_tensor(attrs))


def _adam_cast_ref(arrays, attrs):
    """PyTorch's Adam step (each tensor its own step count) with the copies: the new models,
    copies, m, v and steps (and max_v with amsgrad)."""
    return _stateful_cast_ref(arrays, attrs, _adam_ref, _adam_cast_per_tensor(attrs))


def _adadelta_cast_ref(arrays, attrs):
    """PyTorch's Adadelta step with the copies: the new models, copies, square_avg, acc_delta
    and steps."""
    return _stateful_cast_ref(arrays, attrs, _adadelta_ref, ADADELTA_CAST_PER_TENSOR)


def _multi_samples(kind: str):
    """Two tensors (one of them 1-D), float16 and bfloat16 diffs and copies, scale 1/8 (and
    a non-finite diff that ``skip_if`` skips), skipped and not; ``kind``: ``"sgd"``, ``"adam"``
    or ``"adadelta"``."""
    adam = kind == "adam"
    def make():
        out = []
        for half in (np.float16, bfloat16.np):
            for skip in (0, 1):
                r = np.random.default_rng(5)
                shapes = [(4, 3), (5,)]
                models = [rand(*s, r=r) for s in shapes]
                diffs = [(rand(*s, r=r) * 8).astype(half) for s in shapes]
                if skip:
                    diffs[1][0] = np.inf
                copies = [m.astype(half) for m in models]
                fixed = [np.array([{"sgd": 0.1, "adam": 0.01, "adadelta": 1.0}[kind]]),
                         np.array([skip], np.int64), np.array([0.125], np.float32)]
                if kind == "adadelta":
                    state = ([rand(*s, r=r, lo=0.0, hi=0.5) for s in shapes]
                             + [rand(*s, r=r, lo=0.0, hi=0.1) for s in shapes]
                             + [np.array([3], np.int64) for _ in shapes])
                    attrs = ({"rho": 0.9, "eps": 1e-6, "weight_decay": 0.01}
                             if half == np.float16 else {"rho": 0.5, "maximize": True})
                elif adam:
                    state = ([rand(*s, r=r) * 0.1 for s in shapes]
                             + [rand(*s, r=r, lo=0.0, hi=0.1) for s in shapes]
                             + [np.array([3], np.int64) for _ in shapes])
                    attrs = ({"weight_decay": 0.01} if half == np.float16
                             else {"decoupled_weight_decay": 0.1})       # AdamW
                    if half == np.float16:                               # and AMSGrad
                        attrs["amsgrad"] = True
                        state += [rand(*s, r=r, lo=0.0, hi=0.1) for s in shapes]
                else:
                    state = [rand(*s, r=r) for s in shapes]
                    attrs = {"momentum": 0.9, "weight_decay": 0.01,
                             "nesterov": half == np.float16}
                out.append((fixed + models + diffs + copies + state, attrs))
        r = np.random.default_rng(6)
        if kind == "sgd":                           # without momentum: no buffers
            m = rand(6, r=r)
            out.append(([np.array([0.5]), np.array([0], np.int64), np.array([1.0], np.float32),
                         m, rand(6, r=r), m.astype(np.float16)], {}))
            for skip in (0, 1):                     # dampening: a first step and a later one
                ms, ds = [rand(4, 3, r=r), rand(5, r=r)], [rand(4, 3, r=r), rand(5, r=r)]
                out.append(([np.array([0.5]), np.array([skip], np.int64),
                             np.array([0.5], np.float32), *ms, *(d.astype(np.float16) for d in ds),
                             *(m.astype(np.float16) for m in ms), rand(4, 3, r=r), rand(5, r=r),
                             np.array([0], np.int64), np.array([2], np.int64)],
                            {"momentum": 0.9, "dampening": 0.3, "weight_decay": 0.01}))
        return out
    return make


_CAST_NOTE = ("optimizer update with the half copy of the weight (OneFlow's multi-tensor update "
              "with cast): made by the fuse_model_update_cast pass after AMP")

register("multi_tensor_sgd_update_with_cast", _sgd_cast_infer, normalize=_sgd_cast_norm,
         writes=_sgd_cast_writes, reference=_sgd_cast_ref, samples=_multi_samples("sgd"),
         amp=None, amp_note=_CAST_NOTE,
         doc="per tensor: g = diff * scale; SGD (momentum) on the float32 model; model_copy = "
             "half(model); skipped when skip_if != 0")
register("multi_tensor_adam_update_with_cast", _adam_cast_infer, normalize=_adam_cast_norm,
         writes=_adam_cast_writes, reference=_adam_cast_ref, samples=_multi_samples("adam"),
         amp=None, amp_note=_CAST_NOTE,
         doc="per tensor: g = diff * scale; Adam on the float32 model; model_copy = "
             "half(model); skipped when skip_if != 0")
register("multi_tensor_adadelta_update_with_cast", _adadelta_cast_infer,
         normalize=_adadelta_cast_norm, writes=_adadelta_cast_writes,
         reference=_adadelta_cast_ref, samples=_multi_samples("adadelta"), amp=None,
         amp_note=_CAST_NOTE,
         doc="per tensor: g = diff * scale; Adadelta on the float32 model; model_copy = "
             "half(model); skipped when skip_if != 0")
