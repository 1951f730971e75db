"""``optim.Adadelta`` (the PyTorch MNIST example's ``optim.Adadelta(model.parameters(),
lr=args.lr)`` with ``StepLR(gamma=0.7)``): against a NumPy float64 implementation of
``torch.optim.Adadelta``'s documented algorithm (``reference_mlp.adadelta_step``) and against
``torch.optim.Adadelta`` itself when torch is installed; its defaults, keywords and errors; state
dicts in PyTorch's layout; AMP's float32 master weights and a skipped overflowing step."""
import inspect

import numpy as np
import pytest

import miniflow as mf
from miniflow.data import batches, load_digits
from miniflow.experiments.mlp import TrainGraph, mlp
from miniflow.optim.lr_scheduler import StepLR

from graph_cases import Step, param_arrays, small_mlp, xy
from reference_mlp import adadelta_step, forward_backward


def _f64_mlp(seed=0):
    """The digits MLP with float64 parameters."""
    mf.manual_seed(seed)
    model = mlp((64, 32, 10))
    for layer in model.children():
        if isinstance(layer, mf.nn.Linear):
            layer.weight = mf.nn.Parameter(layer.weight.numpy().astype(np.float64))
            layer.bias = mf.nn.Parameter(layer.bias.numpy().astype(np.float64))
    return model


def _digits(steps, bs=16):
    d = load_digits()
    it = batches(d.x_train, d.y_train, bs, rng=np.random.default_rng(0), drop_last=True)
    return [next(it) for _ in range(steps)]


@pytest.mark.parametrize("hyper", [{}, {"lr": 0.5, "rho": 0.8, "eps": 1e-4, "weight_decay": 0.1},
                                   {"lr": 0.1, "maximize": True}],
                         ids=["defaults", "custom", "maximize"])
def test_the_mnist_recipe_trains_as_the_float64_oracle(hyper):
    """``Adadelta(params, lr=1.0)`` and ``StepLR(step_size=1, gamma=0.7)`` (the MNIST example's
    recipe, here a step per batch) on a float64 MLP: parameters and state equal the NumPy
    Adadelta's to float64 rounding; the lr changes never recompile; ``step`` counts the steps."""
    model = _f64_mlp()
    ref = [p.numpy().copy() for p in model.parameters()]
    state = [(np.zeros_like(p), np.zeros_like(p)) for p in ref]
    opt = mf.optim.Adadelta(model.parameters(), **hyper)
    sched = StepLR(opt, step_size=1, gamma=0.7)
    graph = TrainGraph(model, opt)
    h = {"lr": 1.0, "rho": 0.9, "eps": 1e-6, "weight_decay": 0.0, "maximize": False, **hyper}
    for t, (xb, yb) in enumerate(_digits(8)):
        lr = opt.param_groups[0]["lr"]
        assert lr == pytest.approx(h["lr"] * 0.7 ** t, rel=1e-15)
        loss = float(graph(xb.astype(np.float64), yb))
        ref_loss, grads = forward_backward(ref, xb.astype(np.float64), yb)
        adadelta_step(ref, grads, state, lr, h["rho"], h["eps"], h["weight_decay"],
                      h["maximize"])
        assert loss == pytest.approx(ref_loss, rel=1e-12)
        sched.step()
    assert graph.compile_count == 1 and opt.version == 0
    got = opt.state_dict()["state"]
    for i, (p, r) in enumerate(zip(model.parameters(), ref)):
        np.testing.assert_allclose(p.numpy(), r, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got[i]["square_avg"], state[i][0], rtol=1e-10, atol=1e-15)
        np.testing.assert_allclose(got[i]["acc_delta"], state[i][1], rtol=1e-10, atol=1e-15)
        assert got[i]["step"].tolist() == [8] and got[i]["step"].dtype == np.int64


@pytest.mark.parametrize("hyper", [{}, {"lr": 0.5, "rho": 0.8, "eps": 1e-4, "weight_decay": 0.1,
                                        "maximize": True}], ids=["defaults", "custom"])
def test_adadelta_follows_torch_with_step_lr(hyper):
    torch = pytest.importorskip("torch")
    model = small_mlp()
    tmodel = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    tmodel.load_state_dict({k: torch.tensor(v) for k, v in model.state_dict().items()})
    opt = mf.optim.Adadelta(model.parameters(), **hyper)
    topt = torch.optim.Adadelta(tmodel.parameters(), **hyper)
    sched, tsched = StepLR(opt, 2, gamma=0.7), torch.optim.lr_scheduler.StepLR(topt, 2, 0.7)
    step = Step(model, opt)
    for seed in range(12):
        x, y = xy(seed=seed)
        step(x, y)
        topt.zero_grad()
        torch.nn.functional.cross_entropy(tmodel(torch.tensor(x)), torch.tensor(y)).backward()
        topt.step()
        sched.step()
        tsched.step()
        assert opt.param_groups[0]["lr"] == pytest.approx(topt.param_groups[0]["lr"], rel=1e-15)
    for (key, want), got in zip(tmodel.state_dict().items(), param_arrays(model)):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6, err_msg=key)
    tstate = topt.state_dict()["state"]
    for i, s in opt.state_dict()["state"].items():
        for key in ("square_avg", "acc_delta"):
            np.testing.assert_allclose(s[key], tstate[i][key].numpy(), rtol=1e-4, atol=1e-9)
        assert s["step"][0] == tstate[i]["step"].item() == 12


def test_defaults_and_keywords_are_pytorchs():
    """``Adadelta(params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0, foreach=None, *,
    capturable=False, maximize=False, differentiable=False)``, as ``torch.optim.Adadelta``."""
    params = inspect.signature(mf.optim.Adadelta).parameters
    want = {"lr": 1.0, "rho": 0.9, "eps": 1e-6, "weight_decay": 0.0, "foreach": None,
            "capturable": False, "maximize": False, "differentiable": False}
    assert {k: params[k].default for k in want} == want
    assert list(params)[:6] == ["params", "lr", "rho", "eps", "weight_decay", "foreach"]
    assert all(params[k].kind is inspect.Parameter.KEYWORD_ONLY
               for k in ("capturable", "maximize", "differentiable"))
    opt = mf.optim.Adadelta(small_mlp().parameters())
    group = opt.param_groups[0]
    assert {k: group[k] for k in ("lr", "rho", "eps", "weight_decay", "maximize")} == {
        "lr": 1.0, "rho": 0.9, "eps": 1e-6, "weight_decay": 0.0, "maximize": False}
    assert set(opt.state[opt.params[0]]) == {"square_avg", "acc_delta", "step"}
    torch = pytest.importorskip("torch")
    tdefaults = torch.optim.Adadelta([torch.zeros(1, requires_grad=True)]).defaults
    assert {k: tdefaults[k] for k in want} == want


@pytest.mark.parametrize("kw,error,message", [
    ({"rho": 1.5}, ValueError, r"Adadelta: rho must be finite and in \[0, 1\], got 1.5"),
    ({"eps": -1.0}, ValueError, r"Adadelta: eps must be finite and in \[0, inf\)"),
    ({"weight_decay": -0.1}, ValueError, r"Adadelta: weight_decay must be finite"),
    ({"lr": float("nan")}, ValueError, r"Adadelta: lr must be finite"),
    ({"maximize": "yes"}, TypeError, r"Adadelta: maximize must be True or False"),
    ({"capturable": True}, ValueError, r"Adadelta: capturable=True; miniflow's Adadelta runs "
                                       r"only PyTorch's capturable=False"),
    ({"differentiable": True}, ValueError, r"Adadelta: differentiable=True; .* "
                                           r"differentiable=False"),
    ({"foreach": "yes"}, ValueError, r"Adadelta: foreach='yes'"),
    ({"fused": True}, TypeError, r"unexpected keyword argument 'fused'"),
])
def test_bad_arguments_are_refused_by_name(kw, error, message):
    with pytest.raises(error, match=message):
        mf.optim.Adadelta(small_mlp().parameters(), **kw)


def test_rho_0_and_1_and_foreach_are_taken_as_pytorch_takes_them():
    for kw in ({"rho": 0.0}, {"rho": 1.0}, {"foreach": True}, {"foreach": False}):
        mf.optim.Adadelta(small_mlp().parameters(), **kw)


def test_maximize_is_a_group_key_that_recompiles():
    model = small_mlp()
    opt = mf.optim.Adadelta(model.parameters())
    step = Step(model, opt)
    step(*xy())
    opt.param_groups[0]["maximize"] = True
    assert opt.version == 1
    step(*xy())
    assert step.compile_count == 2 and "maximize=True" in str(step.ir)
    with pytest.raises(TypeError, match="maximize must be True or False"):
        opt.param_groups[0]["maximize"] = 1


def test_a_state_dict_round_trip_continues_the_same_training():
    """Three steps, the optimizer's and model's state dicts saved through ``miniflow.save`` and
    loaded into new ones: the next steps are the uninterrupted run's, bit for bit."""
    model = small_mlp()
    opt = mf.optim.Adadelta(model.parameters(), lr=0.5, weight_decay=0.01)
    step = Step(model, opt)
    for seed in range(3):
        step(*xy(seed=seed))
    sd, weights = opt.state_dict(), model.state_dict()
    assert sd["param_groups"][0]["rho"] == 0.9 and sd["state"][0]["step"].tolist() == [3]
    model_2 = small_mlp(seed=1)
    model_2.load_state_dict(weights)
    opt_2 = mf.optim.Adadelta(model_2.parameters())
    opt_2.load_state_dict(sd)
    assert opt_2.param_groups[0]["lr"] == 0.5 and opt_2.param_groups[0]["weight_decay"] == 0.01
    step_2 = Step(model_2, opt_2)
    for seed in (3, 4):
        step(*xy(seed=seed))
        step_2(*xy(seed=seed))
    for a, b in zip(param_arrays(model), param_arrays(model_2)):
        np.testing.assert_array_equal(a, b)
    bad = opt.state_dict()
    bad["state"][1]["acc_delta"] = -np.abs(bad["state"][1]["acc_delta"]) - 1
    with pytest.raises(ValueError, match=r"Adadelta.load_state_dict: state\[1\]\['acc_delta'\] "
                                         r"must be finite and >= 0"):
        opt_2.load_state_dict(bad)


def test_under_amp_the_update_keeps_float32_master_weights_and_skips_an_overflow():
    """AMP (float16 matmuls) with a dynamic grad scaler: the weights and Adadelta's state stay
    float32 and follow the float32 run closely, updated by the fused AMP update; a step with
    non-finite gradients changes no weight, no state and no step count."""
    model, ref = small_mlp(), small_mlp()
    scaler = mf.amp.GradScaler(init_scale=2.0 ** 10)
    amp = Step(model, mf.optim.Adadelta(model.parameters()), scaler=scaler, policy="fp32")
    plain = Step(ref, mf.optim.Adadelta(ref.parameters()))
    for seed in range(5):
        amp(*xy(seed=seed))
        plain(*xy(seed=seed))
    assert "multi_tensor_adadelta_update_with_cast" in amp.ir.count_ops()
    assert not scaler.found_inf and all(p.dtype is mf.float32 for p in model.parameters())
    for a, b in zip(param_arrays(model), param_arrays(ref)):
        np.testing.assert_allclose(a, b, rtol=1e-2, atol=1e-3)
    opt = amp._optimizers[0]
    weights, state = param_arrays(model), opt.state_dict()["state"]
    x, y = xy(seed=9)
    x[0, 0] = np.inf
    amp(x, y)
    assert scaler.found_inf and opt.num_skipped_steps == 1
    for a, b in zip(param_arrays(model), weights):
        np.testing.assert_array_equal(a, b)
    for i, s in opt.state_dict()["state"].items():
        assert s["square_avg"].dtype == np.float32 and s["step"].tolist() == [5]
        for k, v in s.items():
            np.testing.assert_array_equal(v, state[i][k])


def test_the_update_op_refuses_bad_state_by_name():
    """``adadelta_update``'s inference names the op and the offending value."""
    from miniflow.ir import Graph
    from miniflow.ops import emitter
    g = Graph()
    emit = emitter(g)
    p = g.add_variable("p", (3,), mf.float32)
    fixed = [p, g.add_variable("d", (3,), mf.float32), g.add_variable("lr", (1,), mf.float64),
             g.add_variable("skip", (1,), mf.int64)]
    good = [g.add_variable(n, (3,), mf.float32) for n in ("sq", "acc")]
    step = g.add_variable("step", (1,), mf.int64)
    with pytest.raises(ValueError, match=r"adadelta_update: state %short \(f32\[2\]\) must match "
                                         r"%p \(f32\[3\]\)"):
        emit("adadelta_update", *fixed, good[0], g.add_variable("short", (2,), mf.float32), step)
    with pytest.raises(TypeError, match=r"adadelta_update: step %fstep \(f32\[1\]\) must be "
                                        r"i64\[1\]"):
        emit("adadelta_update", *fixed, *good, g.add_variable("fstep", (1,), mf.float32))
    with pytest.raises(ValueError, match=r"adadelta_update: expects 7 inputs, got 6"):
        emit("adadelta_update", *fixed, *good)
    with pytest.raises(ValueError, match=r"adadelta_update: the learning rate is the input"):
        emit("adadelta_update", *fixed, *good, step, lr=0.1)
