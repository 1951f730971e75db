"""The optimizer objects themselves (``miniflow.optim``): their lifetime and their param group.

PyTorch's ``test/optim/test_lrscheduler.py`` (``test_no_cyclic_references``): with the cyclic
collector off, deleting an optimizer or a scheduler frees it at once (nothing of theirs is in a
reference cycle); miniflow checks that for every optimizer and scheduler class it exports.
``opt.param_groups[0] |= {...}`` updates the group in place, as on PyTorch's list of dicts.
"""
import gc
import inspect
import weakref

import numpy as np
import pytest

import miniflow as mf
from miniflow import nn
from miniflow.optim import Optimizer, lr_scheduler

from graph_cases import MseFit

OPTIMIZERS = {mf.optim.SGD: dict(lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True),
              mf.optim.Adam: dict(lr=0.01, amsgrad=True),
              mf.optim.AdamW: dict(lr=0.01, amsgrad=True),
              mf.optim.Adadelta: dict(lr=1.0, rho=0.8, weight_decay=0.01, maximize=True)}
"""Every exported optimizer class -> constructor arguments."""

SCHEDULERS = {
    "LRScheduler": None,  # the base class (abstract get_lr): its subclasses are tested
    "StepLR": lambda o: lr_scheduler.StepLR(o, step_size=2),
    "MultiStepLR": lambda o: lr_scheduler.MultiStepLR(o, milestones=[1, 3]),
    "CosineAnnealingLR": lambda o: lr_scheduler.CosineAnnealingLR(o, T_max=4),
    "LinearLR": lambda o: lr_scheduler.LinearLR(o),
    "ExponentialLR": lambda o: lr_scheduler.ExponentialLR(o, gamma=0.9),
    "ConstantLR": lambda o: lr_scheduler.ConstantLR(o, total_iters=2),
    "PolynomialLR": lambda o: lr_scheduler.PolynomialLR(o, total_iters=4, power=2.0),
    "LambdaLR": lambda o: lr_scheduler.LambdaLR(o, lambda epoch: 0.5 ** epoch),
    "SequentialLR": lambda o: lr_scheduler.SequentialLR(
        o, [lr_scheduler.LinearLR(o), lr_scheduler.StepLR(o, 2)], milestones=[2]),
    "ReduceLROnPlateau": lambda o: lr_scheduler.ReduceLROnPlateau(o, patience=0),
    "MultiplicativeLR": lambda o: lr_scheduler.MultiplicativeLR(o, lambda epoch: 0.9),
    "ChainedScheduler": lambda o: lr_scheduler.ChainedScheduler(
        [lr_scheduler.ConstantLR(o, total_iters=2), lr_scheduler.ExponentialLR(o, 0.9)]),
    "CosineAnnealingWarmRestarts": lambda o: lr_scheduler.CosineAnnealingWarmRestarts(o, 2, 2),
}
"""Every name of ``lr_scheduler.__all__`` -> a factory of that scheduler on an optimizer."""


@pytest.fixture
def no_cyclic_gc():
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    yield
    if was:
        gc.enable()


def _sgd():
    return mf.optim.SGD(nn.Linear(3, 2).parameters(), lr=0.5)


def test_every_optimizer_and_scheduler_class_is_listed_here():
    exported = {c for c in vars(mf.optim).values()
                if inspect.isclass(c) and issubclass(c, Optimizer) and c is not Optimizer}
    assert exported == set(OPTIMIZERS)
    assert set(lr_scheduler.__all__) == set(SCHEDULERS)


@pytest.mark.parametrize("cls", list(OPTIMIZERS), ids=lambda c: c.__name__)
def test_an_optimizer_is_freed_on_del_without_the_cyclic_collector(no_cyclic_gc, cls):
    opt = cls(nn.Linear(3, 2).parameters(), **OPTIMIZERS[cls])
    group = opt.param_groups[0]
    group["lr"] = 0.05
    group.update(weight_decay=0.0)
    ref = weakref.ref(opt)
    del opt
    assert ref() is None
    with pytest.raises(ReferenceError, match="optimizer was deleted; its values cannot be changed"):
        group["lr"] = 0.1
    assert group["lr"] == 0.05  # a kept group still reads


@pytest.mark.parametrize("name", [n for n, f in SCHEDULERS.items() if f is not None])
def test_a_scheduler_and_its_optimizer_are_freed_on_del_after_steps(no_cyclic_gc, name):
    opt = _sgd()
    sched = SCHEDULERS[name](opt)
    metric = [1.0] if isinstance(sched, lr_scheduler.ReduceLROnPlateau) else []
    for _ in range(3):
        sched.step(*metric)
    refs = weakref.ref(opt), weakref.ref(sched)
    del sched
    assert refs[1]() is None
    del opt
    assert refs[0]() is None


def test_param_group_ior_changes_the_group_in_place_and_raises_nothing():
    """PyTorch's ``param_groups`` is a list of dicts: ``param_groups[0] |= {"lr": ...}`` updates
    the dict and puts the same dict back. miniflow's check runs first (all or nothing)."""
    opt = _sgd()
    group = opt.param_groups[0]
    opt.param_groups[0] |= {"lr": 1e-30}
    assert group["lr"] == 1e-30 and opt.learning_rate[0] == 1e-30 and opt.version == 0
    opt.param_groups[-1] |= {"momentum": 0.5}
    assert opt.hyper["momentum"] == 0.5 and opt.version == 1
    with pytest.raises(ValueError, match="lr must be finite"):
        opt.param_groups[0] |= {"lr": -1.0, "momentum": 0.1}
    assert opt.hyper["lr"] == 1e-30 and opt.hyper["momentum"] == 0.5


def test_a_refused_param_groups_assignment_changes_nothing():
    opt = _sgd()
    other = _sgd().param_groups[0]
    for value in ({"lr": 1e-30}, other, dict(opt.param_groups[0], lr=1e-30)):
        with pytest.raises(TypeError, match="param_groups cannot be changed"):
            opt.param_groups[0] = value
    with pytest.raises(TypeError, match="param_groups cannot be changed"):
        opt.param_groups[1] = opt.param_groups[0]
    with pytest.raises(TypeError, match="param_groups cannot be changed"):
        del opt.param_groups[0]
    assert opt.hyper["lr"] == 0.5 and opt.learning_rate[0] == 0.5 and opt.version == 0


# ----------------------------------------------------------------------------- trajectories
# PyTorch's ``test/optim/test_optim.py`` checks an optimizer by its trajectory on a fixed
# problem; here a linear least-squares fit, run by miniflow (float32, in an nn.Graph), by
# torch.optim (skipped without torch) and by a NumPy float64 oracle of PyTorch's documented
# algorithm (the gradient of the fit written out by hand).
_R = np.random.default_rng(11)
_X = _R.standard_normal((30, 16, 8)).astype(np.float32)
_Y = _R.standard_normal((30, 16, 4)).astype(np.float32)


def _start():
    mf.manual_seed(3)
    return nn.Linear(8, 4)


def _miniflow_run(make_opt, steps=30):
    model = _start()
    opt = make_opt(model.parameters())
    fit = MseFit(model, opt)
    for k in range(steps):
        fit(mf.tensor(_X[k]), mf.tensor(_Y[k]))
    return [model.weight.numpy(), model.bias.numpy()], opt


def _torch_run(make_opt, steps=30):
    torch = pytest.importorskip("torch")
    start = _start()
    w = torch.tensor(start.weight.numpy(), requires_grad=True)
    b = torch.tensor(start.bias.numpy(), requires_grad=True)
    opt = make_opt(torch.optim, [w, b])
    for k in range(steps):
        opt.zero_grad()
        d = torch.tensor(_X[k]) @ w.T + b - torch.tensor(_Y[k])
        (d * d).mean().backward()
        opt.step()
    return [w.detach().numpy(), b.detach().numpy()], opt


def _numpy_run(update, steps=30):
    """``update(k, params, grads, state)`` changes the float64 ``params`` in place (``state``: a
    dict per parameter, empty at first)."""
    start = _start()
    params = [start.weight.numpy().astype(np.float64), start.bias.numpy().astype(np.float64)]
    state = [{}, {}]
    for k in range(steps):
        x, y = _X[k].astype(np.float64), _Y[k].astype(np.float64)
        d = x @ params[0].T + params[1] - y
        scale = 2.0 / d.size
        update(k, params, [scale * d.T @ x, scale * d.sum(0)], state)
    return params


def _close(got, want, tol=1e-5):
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


def _sgd_oracle(lr, momentum, weight_decay, nesterov, dampening=0.0):
    """``torch.optim.SGD``'s documented algorithm: the buffer is ``g`` at the first step, then
    ``momentum * buf + (1 - dampening) * g``."""
    def update(k, params, grads, state):
        for p, g, s in zip(params, grads, state):
            g = g + weight_decay * p
            if momentum:
                s["buf"] = g.copy() if "buf" not in s else momentum * s["buf"] + (
                    1 - dampening) * g
                g = g + momentum * s["buf"] if nesterov else s["buf"]
            p -= lr * g
    return update


@pytest.mark.parametrize("hyper", [dict(lr=0.05, momentum=0.9, nesterov=True),
                                   dict(lr=0.02, momentum=0.5, weight_decay=0.1, nesterov=True),
                                   dict(lr=0.05, momentum=0.9, weight_decay=0.1)],
                         ids=["nesterov", "nesterov-wd", "momentum-wd"])
def test_sgd_nesterov_follows_torch_and_the_float64_oracle(hyper):
    got, opt = _miniflow_run(lambda p: mf.optim.SGD(p, **hyper))
    full = dict(dict(momentum=0.0, weight_decay=0.0, nesterov=False), **hyper)
    _close(got, _numpy_run(_sgd_oracle(**full)))
    assert opt.param_groups[0]["nesterov"] is full["nesterov"]
    want, _ = _torch_run(lambda optim, p: optim.SGD(p, **hyper))
    _close(got, want, 1e-6)


def test_sgd_nesterov_errors_are_pytorchs():
    params = list(nn.Linear(2, 2).parameters())
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum"):
        mf.optim.SGD(params, lr=0.1, nesterov=True)
    with pytest.raises(TypeError, match="nesterov must be True or False, got 'yes'"):
        mf.optim.SGD(params, lr=0.1, momentum=0.9, nesterov="yes")
    opt = mf.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True)
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum"):
        opt.param_groups[0]["momentum"] = 0.0           # flipped after construction: refused
    assert opt.param_groups[0]["momentum"] == 0.9
    opt.param_groups[0].update(nesterov=False, momentum=0.0)
    assert opt.version == 1


def test_turning_nesterov_on_after_compiling_recompiles():
    model = _start()
    opt = mf.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    fit = MseFit(model, opt)
    fit(mf.tensor(_X[0]), mf.tensor(_Y[0]))
    assert not any(n.attrs.get("nesterov") for n in fit.ir.nodes)
    opt.param_groups[0]["nesterov"] = True
    fit(mf.tensor(_X[1]), mf.tensor(_Y[1]))
    assert [n.attrs.get("nesterov") for n in fit.ir.nodes if n.op.name == "sgd_update"] \
        == [True, True]


@pytest.mark.parametrize("dampening", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_sgd_dampening_follows_torch_and_the_float64_oracle(dampening, weight_decay):
    """``SGD(dampening=0.5)`` was refused ("the update op has no dampening"): PyTorch's rule,
    the first step's buffer the gradient itself (undamped), then ``momentum * buf + (1 -
    dampening) * g``; against NumPy float64 and torch over 30 steps."""
    hyper = dict(lr=0.05, momentum=0.9, dampening=dampening, weight_decay=weight_decay)
    got, opt = _miniflow_run(lambda p: mf.optim.SGD(p, **hyper))
    _close(got, _numpy_run(_sgd_oracle(nesterov=False, **hyper)))
    assert opt.param_groups[0]["dampening"] == dampening
    assert set(opt.state_dict()["state"][0]) == {"momentum_buffer"}
    want, t_opt = _torch_run(lambda optim, p: optim.SGD(p, **hyper))
    _close(got, want, 1e-6)
    np.testing.assert_allclose(opt.state_dict()["state"][0]["momentum_buffer"],
                               t_opt.state_dict()["state"][0]["momentum_buffer"].numpy(),
                               rtol=1e-5, atol=1e-6)


def test_sgd_param_groups_with_different_dampening_follow_the_float64_oracle():
    """Two groups (the weight damped 0.5 with weight decay, the bias 0.9 without), the
    weight's dampening changed to 0.25 after 10 steps (a compiled key: the graph recompiles,
    the buffers continue) and a StepLR halving both learning rates every 7 steps."""
    model = _start()
    opt = mf.optim.SGD([{"params": [model.weight], "dampening": 0.5, "weight_decay": 0.1},
                        {"params": [model.bias], "dampening": 0.9}], lr=0.05, momentum=0.8)
    fit = MseFit(model, opt)
    schedule = lr_scheduler.StepLR(opt, step_size=7, gamma=0.5)
    wd, damp = [0.1, 0.0], [0.5, 0.9]

    def update(k, params, grads, state):
        for p, g, s, w, d in zip(params, grads, state, wd, [0.25 if k >= 10 else damp[0],
                                                             damp[1]]):
            g = g + w * p
            s["buf"] = g.copy() if k == 0 else 0.8 * s["buf"] + (1 - d) * g
            p -= 0.05 * 0.5 ** (k // 7) * s["buf"]
    for k in range(30):
        if k == 10:
            opt.param_groups[0]["dampening"] = 0.25
        fit(mf.tensor(_X[k]), mf.tensor(_Y[k]))
        schedule.step()
    _close([model.weight.numpy(), model.bias.numpy()], _numpy_run(update))
    assert [n.attrs["dampening"] for n in fit.ir.nodes if n.op.name == "sgd_update"] \
        == [0.25, 0.9]


def test_sgd_dampening_first_step_is_the_first_step_the_grad_scaler_takes():
    """The grad scaler skips the first two steps (an inf in their inputs): the buffers stay
    unset (PyTorch's scaler skips ``optimizer.step()``), so the first step taken is the
    undamped one."""
    hyper = dict(lr=0.05, momentum=0.9, dampening=0.5)
    model = _start()
    opt = mf.optim.SGD(model.parameters(), **hyper)
    fit = MseFit(model, opt)
    fit.set_grad_scaler(mf.amp.GradScaler(init_scale=1.0))
    for k in range(12):
        x = _X[k].copy()
        x[0, 0] = np.inf if k < 2 else x[0, 0]
        fit(mf.tensor(x), mf.tensor(_Y[k]))
    assert opt.num_skipped_steps == 2
    oracle = _sgd_oracle(nesterov=False, weight_decay=0.0, **hyper)
    _close([model.weight.numpy(), model.bias.numpy()],
           _numpy_run(lambda k, *a: None if k < 2 else oracle(k, *a), steps=12))


def test_sgd_dampening_resumes_from_its_own_state_dict_exactly():
    """An SGD with dampening saved after 10 steps and loaded into a new optimizer continues
    bit for bit as the one that was not stopped: a loaded ``momentum_buffer`` marks its
    parameter as stepped (the state dict holds no step count), so the next step is damped, not
    a first one. (The state became a dict keyed by the parameter: the loader read its keys as
    the states, and every loaded parameter took an undamped first step again.)"""
    hyper = dict(lr=0.05, momentum=0.9, dampening=0.5)
    model = _start()
    opt = mf.optim.SGD(model.parameters(), **hyper)
    fit = MseFit(model, opt)
    for k in range(10):
        fit(mf.tensor(_X[k]), mf.tensor(_Y[k]))
    resumed = _start()
    resumed.load_state_dict(model.state_dict())
    r_opt = mf.optim.SGD(resumed.parameters(), **hyper)
    r_opt.load_state_dict(opt.state_dict())
    r_fit = MseFit(resumed, r_opt)
    for k in range(10, 14):
        fit(mf.tensor(_X[k]), mf.tensor(_Y[k]))
        r_fit(mf.tensor(_X[k]), mf.tensor(_Y[k]))
    for a, b in zip(model.parameters(), resumed.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_sgd_dampening_state_dict_round_trips_with_torch_exactly():
    """A torch SGD state dict with dampening (taken 10 steps) loads into miniflow, which
    continues as torch continues; miniflow's state dict before any step holds no buffer (as
    PyTorch's: its buffers are None), so torch, loading it, takes the undamped first step too;
    a parameter left out of a loaded state has not stepped."""
    torch = pytest.importorskip("torch")
    hyper = dict(lr=0.05, momentum=0.9, dampening=0.5, weight_decay=0.01)
    fresh = mf.optim.SGD(_start().parameters(), **hyper)
    assert fresh.state_dict()["state"] == {}
    start = _start()
    w = torch.tensor(start.weight.numpy(), requires_grad=True)
    b = torch.tensor(start.bias.numpy(), requires_grad=True)
    t_opt = torch.optim.SGD([w, b], **hyper)

    def to_torch(sd):
        return {**sd, "state": {i: {k: torch.tensor(v) for k, v in st.items()}
                                for i, st in sd["state"].items()}}
    t_opt.load_state_dict(to_torch(fresh.state_dict()))

    def torch_steps(ks):
        for k in ks:
            t_opt.zero_grad()
            d = torch.tensor(_X[k]) @ w.T + b - torch.tensor(_Y[k])
            (d * d).mean().backward()
            t_opt.step()
    torch_steps(range(10))
    model = _start()
    model.load_state_dict({"weight": w.detach().numpy(), "bias": b.detach().numpy()})
    opt = mf.optim.SGD(model.parameters(), **hyper)
    opt.load_state_dict(t_opt.state_dict())
    fit = MseFit(model, opt)
    for k in range(10, 20):
        fit(mf.tensor(_X[k]), mf.tensor(_Y[k]))
    torch_steps(range(10, 20))
    _close([model.weight.numpy(), model.bias.numpy()], [w.detach().numpy(), b.detach().numpy()],
           1e-6)
    back = opt.state_dict()
    assert set(back["state"]) == {0, 1} and set(back["state"][0]) == {"momentum_buffer"}
    t_opt.load_state_dict(to_torch(back))
    theirs = t_opt.state_dict()["state"][0]["momentum_buffer"].numpy()
    np.testing.assert_array_equal(back["state"][0]["momentum_buffer"], theirs)
    partial = {"state": {0: {"momentum_buffer": back["state"][0]["momentum_buffer"]}},
               "param_groups": back["param_groups"]}
    opt.load_state_dict(partial)                    # the bias not stepped: its first step next
    assert set(opt.state_dict()["state"]) == {0}
    with pytest.raises(ValueError, match="dampening cannot be changed after the group was made"):
        opt.param_groups[0]["dampening"] = 0.0


def test_sgd_dampening_errors_are_pytorchs():
    params = list(nn.Linear(2, 2).parameters())
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum and zero "
                                         "dampening.*dampening 0.5"):
        mf.optim.SGD(params, lr=0.1, momentum=0.9, dampening=0.5, nesterov=True)
    with pytest.raises(ValueError, match="dampening must be finite"):
        mf.optim.SGD(params, lr=0.1, momentum=0.9, dampening=float("nan"))
    opt = mf.optim.SGD(params, lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="dampening cannot be changed after the group was made"):
        opt.param_groups[0]["dampening"] = 0.5


def _adam_oracle(lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False):
    """``torch.optim.Adam``'s documented algorithm (with AMSGrad's ``max_exp_avg_sq``)."""
    b1, b2 = betas

    def update(k, params, grads, state):
        t = k + 1
        for p, g, s in zip(params, grads, state):
            g = g + weight_decay * p
            s["m"] = b1 * s.get("m", 0.0) + (1 - b1) * g
            s["v"] = b2 * s.get("v", 0.0) + (1 - b2) * g * g
            v = s["v"]
            if amsgrad:
                s["vmax"] = v = np.maximum(s.get("vmax", 0.0), v)
            p -= lr / (1 - b1 ** t) * s["m"] / (np.sqrt(v) / np.sqrt(1 - b2 ** t) + eps)
    return update


@pytest.mark.parametrize("hyper", [dict(lr=0.05, amsgrad=True),
                                   dict(lr=0.02, betas=(0.8, 0.9), weight_decay=0.1,
                                        amsgrad=True)], ids=["amsgrad", "amsgrad-wd"])
def test_adam_amsgrad_follows_torch_and_the_float64_oracle(hyper):
    got, opt = _miniflow_run(lambda p: mf.optim.Adam(p, **hyper))
    _close(got, _numpy_run(_adam_oracle(**hyper)))
    want, t_opt = _torch_run(lambda optim, p: optim.Adam(p, **hyper))
    _close(got, want, 1e-6)
    mine, theirs = opt.state_dict()["state"], t_opt.state_dict()["state"]
    assert set(mine[0]) == set(theirs[0]) == {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"}
    for i in (0, 1):
        np.testing.assert_allclose(mine[i]["max_exp_avg_sq"],
                                   theirs[i]["max_exp_avg_sq"].numpy(), rtol=1e-5, atol=1e-9)
    assert "max_exp_avg_sq" not in mf.optim.Adam(_start().parameters()).state_dict()["state"][0]


def test_adam_amsgrad_errors_and_its_state_dict_round_trip():
    params = list(_start().parameters())
    with pytest.raises(TypeError, match="amsgrad must be True or False, got 1"):
        mf.optim.Adam(params, amsgrad=1)
    opt = mf.optim.Adam(params, amsgrad=True)
    with pytest.raises(ValueError, match="amsgrad cannot be changed after the group was made"):
        opt.param_groups[0]["amsgrad"] = False
    with pytest.raises(ValueError, match=r"param_groups\[0\]: Adam: amsgrad cannot be changed"):
        opt.load_state_dict(mf.optim.Adam(params).state_dict())
    _, trained = _miniflow_run(lambda p: mf.optim.Adam(p, lr=0.05, amsgrad=True), steps=3)
    opt.load_state_dict(trained.state_dict())
    np.testing.assert_array_equal(opt.state_dict()["state"][0]["max_exp_avg_sq"],
                                  trained.state_dict()["state"][0]["max_exp_avg_sq"])
    bad = trained.state_dict()
    bad["state"][1]["max_exp_avg_sq"] = -bad["state"][1]["max_exp_avg_sq"] - 1.0
    with pytest.raises(ValueError, match=r"state\[1\]\['max_exp_avg_sq'\] must be finite and "
                                         ">= 0"):
        opt.load_state_dict(bad)


@pytest.mark.parametrize("method", ["step", "zero_grad"])
def test_step_and_zero_grad_say_where_the_update_runs(method):
    """``opt.step()`` / ``opt.zero_grad()`` (PyTorch's loop) were a bare AttributeError; it now
    says the update runs in an nn.Graph and how to set that up (hasattr stays False)."""
    opt = mf.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(AttributeError, match=f"^'SGD' object has no attribute '{method}': the "
                                             r"update runs inside an nn.Graph .*add_optimizer"):
        getattr(opt, method)
    assert not hasattr(opt, method)
    with pytest.raises(AttributeError, match="^'SGD' object has no attribute 'nope'$"):
        opt.nope


def test_a_parameter_replaced_after_the_optimizer_was_made_is_named_as_the_cause():
    """nanoGPT's ``crop_block_size`` assigns ``wpe.weight = nn.Parameter(wpe.weight[:n])``; made
    after the optimizer, the optimizer holds the old tensor (PyTorch would train it unseen).
    The graph refuses it, and the error names this cause besides a module not assigned."""
    from graph_cases import Step
    model = nn.Sequential(nn.Linear(4, 3))
    opt = mf.optim.AdamW(model.parameters(), lr=1e-3)
    model[0].weight = nn.Parameter(model[0].weight.numpy()[:, :4])
    x, y = np.ones((2, 4), np.float32), np.array([0, 2])
    with pytest.raises(ValueError, match=r"AdamW parameter 0 \(f32\[3, 4\]\) is not a parameter "
                                         r".*new Parameter in its place.*make the optimizer "
                                         r"after that"):
        Step(model, opt)(x, y)
    Step(model, mf.optim.AdamW(model.parameters(), lr=1e-3))(x, y)


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_foreach_and_fused_are_keyword_parameters_as_in_torch(name):
    """nanoGPT's ``configure_optimizers`` passes ``fused=True`` only where ``'fused' in
    inspect.signature(torch.optim.AdamW).parameters``: miniflow's took it through ``**kwargs``,
    so the check was False. Both are keyword-only, as PyTorch's, taken at None or a bool."""
    cls = getattr(mf.optim, name)
    params = inspect.signature(cls).parameters
    for key in ("foreach", "fused"):
        assert params[key].kind is inspect.Parameter.KEYWORD_ONLY and params[key].default is None
    model = nn.Linear(2, 2)
    cls(model.parameters(), lr=0.1, fused=True, foreach=False)
    with pytest.raises(ValueError, match="fused="):
        cls(model.parameters(), lr=0.1, fused="yes")


def test_a_torch_optimizer_miniflow_has_not_is_named_with_the_ones_it_has():
    """``optim.RMSprop(model.parameters())`` was a bare "has no attribute 'RMSprop'"; the error
    names the ones miniflow has (the MNIST example's Adadelta is one)."""
    with pytest.raises(AttributeError, match=r"'RMSprop': miniflow has PyTorch's SGD, Adam, "
                                             r"AdamW and Adadelta only"):
        mf.optim.RMSprop
    with pytest.raises(AttributeError, match=r"^module 'miniflow.optim' has no attribute 'X'$"):
        mf.optim.X
