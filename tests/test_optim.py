"""The optimizers (``torch.optim`` semantics): every way of changing a param group (checked,
all or nothing, a compiled key recompiles), failed state-dict loads that change nothing and valid
ones that assign in place, lr = 0, and copying and pickling optimizers (PyTorch's
``test/optim/test_optim.py`` covers the same ground for ``torch.optim``)."""
import copy
import inspect
import pickle

import numpy as np
import pytest

import miniflow as mf

from graph_cases import Step, param_arrays, small_mlp, xy


# ------------------------------------------------------------------------------ 2. param groups
def _trained_step(opt_cls=mf.optim.SGD, **kw):
    model = small_mlp()
    opt = opt_cls(model.parameters(), **kw)
    g = Step(model, opt)
    g(*xy())
    return model, opt, g


def test_param_group_ior_is_checked_and_a_compiled_key_recompiles():
    _, opt, g = _trained_step(lr=0.1)
    group = opt.param_groups[0]
    with pytest.raises(ValueError, match=r"SGD: lr must be finite and in \[0, inf\), got -5.0"):
        group |= {"lr": -5.0}
    assert opt.param_groups[0]["lr"] == 0.1 and opt.version == 0
    group |= {"lr": 0.05}  # the learning-rate variable: no recompilation
    assert group is opt.param_groups[0] and group["lr"] == 0.05 and opt.version == 0
    assert opt.learning_rate[0] == 0.05 and "lr=" not in str(g.ir)
    group |= {"momentum": 0.5}
    assert opt.version == 1
    g(*xy())
    assert g.compile_count == 2 and "momentum=0.5" in str(g.ir)


def test_param_group_update_is_all_or_nothing():
    _, opt, _ = _trained_step(lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="momentum must be finite"):
        opt.param_groups[0].update(lr=0.01, momentum=-1.0)
    assert opt.hyper == {"lr": 0.1, "momentum": 0.9, "dampening": 0.0, "weight_decay": 0.0,
                         "nesterov": False, "clip_grad_max_norm": None,
                         "clip_grad_norm_type": 2.0}
    assert opt.version == 0
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['maximize'\] = True; miniflow's "
                                         r"SGD runs only PyTorch's maximize=False"):
        opt.param_groups[0].update(lr=0.01, name="x", maximize=True)
    with pytest.raises(ValueError, match="momentum must be finite"):
        opt.param_groups[0].update(name="x", momentum=-1.0)  # a kept key waits for the others
    assert "name" not in opt.param_groups[0]
    with pytest.raises(KeyError, match=r"cannot set 'params'.*make a new optimizer"):
        opt.param_groups[0]["params"] = []
    assert opt.hyper["lr"] == 0.1 and opt.version == 0


@pytest.mark.parametrize("change,what", [
    (lambda g: g.pop("lr"), r"pop\('lr'\)"),
    (lambda g: g.pop("lr", None), r"pop\('lr'\)"),
    (lambda g: g.popitem(), r"popitem\(\)"),
    (lambda g: g.clear(), r"clear\(\)"),
    (lambda g: g.__delitem__("momentum"), r"del group\['momentum'\]")])
def test_param_group_hyper_parameters_cannot_be_removed(change, what):
    _, opt, _ = _trained_step(lr=0.1)
    before = dict(opt.param_groups[0])
    with pytest.raises(TypeError, match=rf"SGD.param_groups\[0\]: {what} is refused: "
                                        "hyper-parameters and 'params' cannot be removed"):
        change(opt.param_groups[0])
    assert dict(opt.param_groups[0]) == before and opt.version == 0


def test_param_group_setdefault_of_an_existing_key_and_copies_change_nothing():
    _, opt, _ = _trained_step(lr=0.1)
    group = opt.param_groups[0]
    assert group.setdefault("lr", 3.0) == 0.1
    for snapshot in (copy.copy(group), group.copy(), dict(group), group | {"lr": -1.0},
                     copy.deepcopy(group)):
        assert type(snapshot) is dict  # a plain dict: a snapshot, not a back door
        snapshot["lr"] = -1.0
    assert group["lr"] == 0.1 and opt.version == 0


def test_the_param_group_list_cannot_be_replaced_and_loads_update_the_group_in_place():
    _, opt, _ = _trained_step(lr=0.1)
    group = opt.param_groups[0]
    with pytest.raises(TypeError, match=r"param_groups cannot be changed .*opt.param_groups\[0\]"
                                        r"\[key\] = value"):
        opt.param_groups[0] = {"lr": -5.0, "momentum": 0.0, "weight_decay": 0.0}
    with pytest.raises(AttributeError, match="SGD.param_groups cannot be replaced"):
        opt.param_groups = [{"lr": -5.0}]
    assert opt.param_groups[0] is group and opt.hyper["lr"] == 0.1
    sd = opt.state_dict()
    sd["param_groups"][0]["lr"] = 0.25
    opt.load_state_dict(sd)
    assert group["lr"] == 0.25 and opt.param_groups[0] is group  # a held reference stays live
    group["lr"] = 0.5
    assert opt.hyper["lr"] == 0.5


# ------------------------------------------------------------------------------ 3. optimizer loads
def _other_state(opt):
    """A valid state dict of ``opt`` with every state value and hyper-parameter changed."""
    sd = opt.state_dict()
    for i, s in sd["state"].items():
        for k, v in s.items():
            s[k] = v + (i + 1) * (3 if k == "step" else 0.5)
    sd["param_groups"][0]["lr"] = 0.25
    return sd


def _sgd():
    return mf.optim.SGD(small_mlp().parameters(), lr=0.1, momentum=0.9)


def _adam():
    return mf.optim.Adam(small_mlp().parameters(), lr=0.1)


def _set(path, value):
    def change(sd):
        *head, last = path
        d = sd
        for k in head:
            d = d[k]
        d[last] = value(d[last]) if callable(value) else value
    return change


LAST = 3  # the last parameter (model.2.bias): earlier ones would be assigned first


@pytest.mark.parametrize("make,change,err,match", [
    (_sgd, _set(("state", LAST, "momentum_buffer"), np.zeros(5)), ValueError,
     r"state\[3\]\['momentum_buffer'\] has shape \[5\], expected \[3\]"),
    (_sgd, _set(("state", LAST, "momentum_buffer"), np.array(["a", "b", "c"])), TypeError,
     r"state\[3\]\['momentum_buffer'\] has dtype <U1 .*expected real numbers for a float32 "
     "state"),
    (_sgd, _set(("state", LAST, "momentum_buffer"), [1.0, "x", 2.0]), TypeError,
     r"state\[3\]\['momentum_buffer'\] has dtype"),
    (_sgd, _set(("state", LAST, "momentum_buffer"), np.array([0.0, np.nan, 1.0])), ValueError,
     r"state\[3\]\['momentum_buffer'\] must be finite; element \[1\] is nan"),
    (_sgd, _set(("state", LAST, "momentum_buffer"), np.array([0.0, 1e39, 1.0])), ValueError,
     r"must be finite; element \[1\] is 1e\+39"),
    (_sgd, _set(("state", LAST), {}), KeyError,
     r"missing state\[3\]\['momentum_buffer'\]; parameter 3 needs \['momentum_buffer'\]"),
    (_sgd, _set(("param_groups", 0, "lr"), -1.0), ValueError,
     r"SGD.load_state_dict: param_groups\[0\]: SGD: lr must be finite .*got -1.0"),
    (_sgd, _set(("param_groups", 0, "momentum"), "0.9"), TypeError,
     "momentum must be a real number, got '0.9'"),
    (_sgd, _set(("param_groups", 0, "maximize"), True), ValueError,
     r"param_groups\[0\]\['maximize'\] is True; miniflow's SGD runs only PyTorch's "
     "maximize=False"),
    (_sgd, _set(("param_groups", 0, "dampening"), 0.5), ValueError,
     r"param_groups\[0\]: SGD: dampening cannot be changed after the group was made"),
    (_sgd, _set(("param_groups", 0, "params"), [0, 1]), ValueError,
     r"doesn't match the size of optimizer's group: param_groups\[0\]\['params'\] is \[0, 1\], "
     "expected 4 indices"),
    (_sgd, _set(("param_groups", 0, "params"), [0, 1, 2, 4]), ValueError,
     r"'params'\] is \[0, 1, 2, 4\], expected \[0, 1, 2, 3\]"),
    (_sgd, _set(("param_groups",), lambda g: g * 2), ValueError,
     r"different number of parameter groups \(2; this optimizer has 1\)"),
    (_sgd, _set(("param_groups",), lambda g: [g[0], 1]), ValueError, "a list of dicts"),
    (_sgd, _set(("state",), lambda s: {**s, 4: s[0]}), ValueError,
     r"'state' must map parameter indices \(0 to 3\) to their state"),
    (_adam, _set(("state", LAST, "step"), np.array([-1])), ValueError,
     r"state\[3\]\['step'\] must be a count >= 0 that int64 holds; element \[0\] is -1"),
    (_adam, _set(("state", LAST, "step"), np.array([2.5])), ValueError,
     r"state\[3\]\['step'\] must be a count >= 0 .*element \[0\] is 2.5"),
    (_adam, _set(("state", LAST, "step"), np.array(["7"])), TypeError,
     r"state\[3\]\['step'\] has dtype <U1 .*expected real numbers for a int64 state"),
    (_adam, _set(("state", LAST, "exp_avg_sq"), np.array([0.0, -1.0, 0.0])), ValueError,
     r"state\[3\]\['exp_avg_sq'\] must be finite and >= 0; element \[1\] is -1.0"),
    (_adam, _set(("param_groups", 0, "betas"), (0.9, 1.5)), ValueError, "beta2 must be finite"),
    (_adam, _set(("param_groups", 0, "maximize"), True), ValueError,
     r"\['maximize'\] is True; miniflow's Adam runs only PyTorch's maximize=False"),
])
def test_failed_optimizer_load_changes_nothing(make, change, err, match):
    opt = make()
    sd = _other_state(opt)
    change(sd)
    before = opt.state_dict()
    with pytest.raises(err, match=match):
        opt.load_state_dict(sd)
    after = opt.state_dict()
    assert after["param_groups"] == before["param_groups"] and opt.version == 0
    for i, s in before["state"].items():
        for k, v in s.items():
            np.testing.assert_array_equal(after["state"][i][k], v, err_msg=f"state[{i}][{k}]")


def test_valid_optimizer_load_assigns_everything_in_place():
    opt = _adam()
    arrays = [s["exp_avg"] for s in opt.state.values()]
    sd = _other_state(opt)
    sd["state"][0]["exp_avg"] = mf.tensor(sd["state"][0]["exp_avg"])  # Tensors are accepted
    sd["state"][1]["step"] = sd["state"][1]["step"].astype(np.float64)  # whole floats: counts
    opt.load_state_dict(sd)
    assert all(a is s["exp_avg"] for a, s in zip(arrays, opt.state.values()))  # bound in graphs
    got = opt.state_dict()
    assert got["param_groups"][0]["lr"] == 0.25 and opt.version == 1
    assert got["state"][1]["step"].tolist() == [6] and got["state"][1]["step"].dtype == np.int64
    np.testing.assert_array_equal(got["state"][3]["exp_avg"], np.full(3, 2.0, np.float32))


# ------------------------------------------------------------------------------ 4. lr = 0
@pytest.mark.parametrize("opt_cls", [mf.optim.SGD, mf.optim.Adam, mf.optim.Adadelta])
def test_lr_zero_is_accepted_and_changes_no_weight(opt_cls):
    model = small_mlp()
    before = param_arrays(model)
    opt = opt_cls(model.parameters(), lr=0.0)
    g = Step(model, opt)
    g(*xy())
    assert opt.learning_rate[0] == 0.0 and "%optimizer0.learning_rate" in str(g.ir)
    for a, b in zip(before, param_arrays(model)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=rf"{opt_cls.__name__}: lr must be finite and in "
                                         r"\[0, inf\), got -1e-09"):
        opt_cls(model.parameters(), lr=-1e-9)


# ------------------------------------------------------------------------------ 4. copy, pickle
@pytest.mark.parametrize("clone", [copy.deepcopy, lambda o: pickle.loads(pickle.dumps(o))],
                         ids=["deepcopy", "pickle"])
def test_optimizer_copies_are_complete_and_independent(clone):
    model = small_mlp()
    opt = mf.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.9))
    g = Step(model, opt)
    for _ in range(3):
        g(*xy())
    sd = opt.state_dict()
    model_2, opt_2 = clone((model, opt))  # together: the copy trains the copied model
    assert opt_2.params[0] is model_2[0].weight and opt_2.params[0] is not opt.params[0]
    sd_2 = opt_2.state_dict()
    assert sd_2["param_groups"] == sd["param_groups"] and opt_2.version == opt.version
    for i, s in sd["state"].items():
        for k, v in s.items():
            np.testing.assert_array_equal(sd_2["state"][i][k], v)
    group = opt_2.param_groups[0]
    assert all(p is q for p, q in zip(group["params"], opt_2.params))
    with pytest.raises(ValueError, match="Adam: lr must be finite"):
        group["lr"] = -1.0
    group["lr"] = 0.02  # the copy's own learning-rate array
    assert opt.hyper["lr"] == 0.01 and opt.learning_rate[0] == 0.01
    assert opt_2.learning_rate[0] == 0.02
    group["eps"] = 1e-6
    assert opt.hyper["eps"] == 1e-8 and opt_2.version == opt.version + 1
    group.update(lr=0.01, eps=1e-8)
    g_2 = Step(model_2, opt_2)
    g(*xy(seed=5))
    g_2(*xy(seed=5))  # the same step on both: the same result, separate storage
    for a, b in zip(param_arrays(model), param_arrays(model_2)):
        np.testing.assert_array_equal(a, b)
    assert opt.state_dict()["state"][0]["step"][0] == opt_2.state_dict()["state"][0]["step"][0] == 4
    g(*xy(seed=6))
    assert opt_2.state_dict()["state"][0]["step"][0] == 4
    assert not np.array_equal(param_arrays(model)[0], param_arrays(model_2)[0])


def test_optimizer_state_is_keyed_by_the_parameter_as_torchs():
    """``opt.state[p]["exp_avg"]`` (PyTorch's) was a TypeError, ``state`` a list by index: it is
    a dict keyed by the parameter, in ``params`` order, holding what torch's holds after the
    same steps; a copy's is keyed by the copy's parameters."""
    model, opt, g = _trained_step(mf.optim.Adam, lr=0.01)
    g(*xy(seed=1))
    assert list(opt.state) == opt.params and list(opt.state) == list(model.parameters())
    w = model[0].weight
    assert set(opt.state[w]) == {"exp_avg", "exp_avg_sq", "step"}
    assert opt.state[w]["exp_avg"] is next(iter(opt.state.values()))["exp_avg"]
    model_2, opt_2 = copy.deepcopy((model, opt))
    assert list(opt_2.state) == list(model_2.parameters())
    np.testing.assert_array_equal(opt_2.state[model_2[0].weight]["exp_avg"],
                                  opt.state[w]["exp_avg"])
    torch = pytest.importorskip("torch")
    tmodel = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    model = small_mlp()
    tmodel.load_state_dict({k: torch.tensor(v) for k, v in model.state_dict().items()})
    opt, topt = mf.optim.Adam(model.parameters(), lr=0.01), torch.optim.Adam(tmodel.parameters(),
                                                                              lr=0.01)
    g = Step(model, opt)
    for seed in (0, 1):
        g(*xy(seed=seed))
        topt.zero_grad()
        x, y = xy(seed=seed)
        torch.nn.functional.cross_entropy(tmodel(torch.tensor(x)), torch.tensor(y)).backward()
        topt.step()
    for p, tp in zip(model.parameters(), tmodel.parameters()):
        assert set(opt.state[p]) == set(topt.state[tp])
        for k in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_allclose(opt.state[p][k], topt.state[tp][k].numpy(), rtol=1e-5,
                                       atol=1e-7)
        assert int(opt.state[p]["step"][0]) == int(topt.state[tp]["step"]) == 2


def test_an_optimizer_copied_alone_owns_copies_of_the_parameters():
    model = small_mlp()
    opt = mf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    alone = copy.deepcopy(opt)
    assert alone.params[0] is not model[0].weight
    np.testing.assert_array_equal(alone.params[0].numpy(), model[0].weight.numpy())
    assert alone.param_groups[0]._owner is alone and opt.param_groups[0]._owner is opt


def test_a_shallow_copy_shares_the_parameters_but_not_the_group_or_the_state():
    model, opt, g = _trained_step(lr=0.1, momentum=0.9)
    shallow = copy.copy(opt)
    assert shallow.params[0] is model[0].weight
    assert shallow.param_groups[0] is not opt.param_groups[0]
    shallow.param_groups[0]["lr"] = 0.5
    assert opt.hyper["lr"] == 0.1 and opt.learning_rate[0] == 0.1
    assert shallow.learning_rate[0] == 0.5
    shallow.param_groups[0]["momentum"] = 0.5
    assert opt.hyper["momentum"] == 0.9 and opt.version == 0 and shallow.version == 1
    buf = shallow.state_dict()["state"][0]["momentum_buffer"].copy()
    g(*xy())  # trains with opt: its momentum buffer moves, the copy's does not
    np.testing.assert_array_equal(shallow.state_dict()["state"][0]["momentum_buffer"], buf)
    assert not np.array_equal(opt.state_dict()["state"][0]["momentum_buffer"], buf)


def _two_groups(params: list) -> list:
    """The weights at the optimizer's lr, the biases in a second group at lr 0.02 without
    weight decay (nanoGPT's split)."""
    return [{"params": params[0::2]}, {"params": params[1::2], "lr": 0.02, "weight_decay": 0.0}]


@pytest.mark.parametrize("grouped", [False, True], ids=["one group", "two groups"])
@pytest.mark.parametrize("name,hyper", [("SGD", dict(lr=0.1, momentum=0.9, nesterov=True)),
                                        ("Adam", dict(lr=0.01, amsgrad=True)),
                                        ("AdamW", dict(lr=0.01, weight_decay=0.1)),
                                        ("Adadelta", dict(lr=0.5, weight_decay=0.01))])
def test_a_torch_optim_state_dict_loads_and_training_continues_as_in_torch(name, hyper, grouped):
    """A ``torch.optim`` state dict (PyTorch's inert keys ``dampening``, ``maximize``,
    ``foreach``, ``differentiable``, ``fused``, ``capturable``, ``decoupled_weight_decay`` at their
    defaults; Adam's 0-d ``step``; one or two param groups) loads, and the next steps match
    torch's (``torch.optim.Optimizer.load_state_dict``'s round trip, as PyTorch's
    ``test/optim/test_optim.py`` checks it between optimizers)."""
    torch = pytest.importorskip("torch")
    model = small_mlp()
    tmodel = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    tmodel.load_state_dict({k: torch.tensor(v) for k, v in model.state_dict().items()})
    groups = _two_groups if grouped else list
    topt = getattr(torch.optim, name)(groups(list(tmodel.parameters())), **hyper)

    def torch_step(x, y):
        topt.zero_grad()
        torch.nn.functional.cross_entropy(tmodel(torch.tensor(x)), torch.tensor(y)).backward()
        topt.step()

    for seed in (1, 2):
        torch_step(*xy(seed=seed))
    opt = getattr(mf.optim, name)(groups(list(model.parameters())), **hyper)
    model.load_state_dict(tmodel.state_dict())
    opt.load_state_dict(topt.state_dict())
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in topt.param_groups]
    step = Step(model, opt)
    for seed in (3, 4, 5):
        torch_step(*xy(seed=seed))
        step(*xy(seed=seed))
    for (key, want), got in zip(tmodel.state_dict().items(), param_arrays(model)):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("name,hyper", [("SGD", dict(lr=0.1, momentum=0.9)),
                                        ("SGD", dict(lr=0.1, momentum=0.9, dampening=0.5)),
                                        ("Adam", dict(lr=0.01, amsgrad=True)),
                                        ("AdamW", dict(lr=0.01, weight_decay=0.1)),
                                        ("Adadelta", dict(lr=0.5, weight_decay=0.01))])
def test_a_miniflow_state_dict_loads_into_torch_optim_and_steps_as_miniflow(name, hyper):
    """The other way: miniflow's state dict (its arrays as tensors) loads into ``torch.optim``,
    which replaces whole param groups, so each group carries PyTorch's keys at their no-op
    values (``dampening`` for SGD: without it ``torch.optim.SGD.step`` fails with a KeyError),
    and torch's next steps are miniflow's; it loads back into miniflow too."""
    torch = pytest.importorskip("torch")
    model = small_mlp()
    opt = getattr(mf.optim, name)(model.parameters(), **hyper)
    step = Step(model, opt)
    for seed in (1, 2):
        step(*xy(seed=seed))
    state = opt.state_dict()
    tmodel = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    tmodel.load_state_dict({k: torch.tensor(v) for k, v in model.state_dict().items()})
    topt = getattr(torch.optim, name)(tmodel.parameters(), **hyper)
    topt.load_state_dict({**state, "state": {i: {k: torch.tensor(v) for k, v in s.items()}
                                             for i, s in state["state"].items()}})
    for seed in (3, 4):
        topt.zero_grad()
        x, y = xy(seed=seed)
        torch.nn.functional.cross_entropy(tmodel(torch.tensor(x)), torch.tensor(y)).backward()
        topt.step()
        step(x, y)
    for (key, want), got in zip(tmodel.state_dict().items(), param_arrays(model)):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6, err_msg=key)
    getattr(mf.optim, name)(small_mlp().parameters(), **hyper).load_state_dict(state)


@pytest.mark.parametrize("name,hyper,torch_steps", [
    ("SGD", dict(lr=0.1), 2), ("SGD", dict(lr=0.1, momentum=0.9), 0),
    ("SGD", dict(lr=0.1, momentum=0.9, dampening=0.5), 0),
    ("Adam", dict(lr=0.01), 0), ("AdamW", dict(lr=0.01, weight_decay=0.1), 0),
    ("Adadelta", dict(lr=1.0), 0)])
def test_a_torch_state_dict_without_per_parameter_state_loads(name, hyper, torch_steps):
    """PyTorch holds no state for a parameter not stepped yet, nor any for SGD without momentum:
    its ``state`` is ``{}``. It loads (into an optimizer that has stepped: its state goes back to
    the initial zeros), and the next steps match torch's (the load refused it: "'state' must map
    each of the 2 parameter indices to its state")."""
    torch = pytest.importorskip("torch")
    model = small_mlp()
    tmodel = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    tmodel.load_state_dict({k: torch.tensor(v) for k, v in model.state_dict().items()})
    topt = getattr(torch.optim, name)(tmodel.parameters(), **hyper)

    def torch_step(x, y):
        topt.zero_grad()
        torch.nn.functional.cross_entropy(tmodel(torch.tensor(x)), torch.tensor(y)).backward()
        topt.step()

    for seed in range(torch_steps):
        torch_step(*xy(seed=seed + 1))
    assert topt.state_dict()["state"] == {}
    opt = getattr(mf.optim, name)(model.parameters(), **hyper)
    step = Step(model, opt)
    step(*xy(seed=9))                            # miniflow's own state is not zero now
    model.load_state_dict(tmodel.state_dict())
    opt.load_state_dict(topt.state_dict())
    for seed in (3, 4, 5):
        torch_step(*xy(seed=seed))
        step(*xy(seed=seed))
    for (key, want), got in zip(tmodel.state_dict().items(), param_arrays(model)):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_torch_state_dict_of_half_precision_state_loads_bit_for_bit(dtype):
    """``torch.optim.AdamW`` of bfloat16 (float16) parameters keeps ``exp_avg`` and
    ``exp_avg_sq`` in that dtype. Such a state dict loads bit for bit into the optimizer of a
    model of that dtype, and exactly (widened) into a float32 one; float32 state into a bfloat16
    optimizer is rounded, as ``torch.optim`` casts state to the parameter's dtype. bfloat16 state
    was refused ("Got unsupported ScalarType BFloat16": the load read it with ``np.asarray``),
    and float32 state not exact in bfloat16 too ("must be a count >= 0 that bfloat16 holds")."""
    torch = pytest.importorskip("torch")
    tdt = getattr(torch, dtype)
    torch.manual_seed(0)    # unseeded, 5 weights in 200 made torch's float16 exp_avg NaN
    tmodel = torch.nn.Linear(4, 3).to(tdt)
    topt = torch.optim.AdamW(tmodel.parameters(), lr=0.01)
    for seed in (1, 2):
        topt.zero_grad()
        x = torch.tensor(np.random.default_rng(seed).standard_normal((5, 4)), dtype=tdt)
        tmodel(x).square().sum().backward()
        topt.step()
    sd = topt.state_dict()
    for mdt in (getattr(mf, dtype), mf.float32):
        opt = mf.optim.AdamW(mf.nn.Linear(4, 3, dtype=mdt).parameters(), lr=0.01)
        opt.load_state_dict(sd)
        for i, state in sd["state"].items():
            got = opt.state_dict()["state"][i]
            assert int(got["step"][0]) == 2
            for key in ("exp_avg", "exp_avg_sq"):
                assert got[key].dtype == mdt.np
                want = state[key].float().numpy()
                np.testing.assert_array_equal(got[key].astype(np.float32), want,
                                              err_msg=f"{mdt.name} {i} {key}")
                assert want.any()
    wide = {**sd, "state": {i: {k: v.float() * (1 + 2 ** -12) if k != "step" else v
                                for k, v in st.items()} for i, st in sd["state"].items()}}
    opt = mf.optim.AdamW(mf.nn.Linear(4, 3, dtype=getattr(mf, dtype)).parameters())
    opt.load_state_dict(wide)                # float32 state is rounded, as torch.optim's load
    np.testing.assert_array_equal(opt.state_dict()["state"][0]["exp_avg"],
                                  wide["state"][0]["exp_avg"].to(tdt).float().numpy())
    bad = {**sd, "state": {**sd["state"], 0: {**sd["state"][0]}}}
    bad["state"][0]["exp_avg_sq"] = -bad["state"][0]["exp_avg_sq"].abs() - 1
    with pytest.raises(ValueError, match=r"AdamW.load_state_dict: state\[0\]\['exp_avg_sq'\] "
                                         r"must be finite and >= 0; element \[0, 0\] is -"):
        mf.optim.AdamW(mf.nn.Linear(4, 3, dtype=getattr(mf, dtype)).parameters()
                       ).load_state_dict(bad)


def test_a_torch_key_off_its_default_is_refused_by_name():
    opt = mf.optim.SGD(small_mlp().parameters(), lr=0.1, momentum=0.9)
    sd = opt.state_dict()
    sd["param_groups"][0].update(dampening=0, maximize=True)
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['maximize'\] is True; miniflow's "
                                         "SGD runs only PyTorch's maximize=False"):
        opt.load_state_dict(sd)
    sd["param_groups"][0].update(maximize=False, capturable=True)
    with pytest.raises(ValueError, match="capturable=False"):
        opt.load_state_dict(sd)


def test_optimizers_bind_positional_arguments_in_pytorchs_order():
    """``SGD([p], 0.1, 0.9, 0.5)`` set weight_decay=0.5 and ``SGD([p], 0.1, 0.9, 0, 5e-4)`` said
    "nesterov must be True or False, got 0.0005": PyTorch's order is (lr, momentum, dampening,
    weight_decay, nesterov), with lr=1e-3 by default.
    Adam and AdamW end their positional arguments at amsgrad, as PyTorch's."""
    params = small_mlp().parameters
    opt = mf.optim.SGD(params(), 0.1, 0.9, 0, 5e-4, True)
    assert {k: opt.hyper[k] for k in ("lr", "momentum", "weight_decay", "nesterov")} == {
        "lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4, "nesterov": True}
    assert mf.optim.SGD(params()).hyper["lr"] == 1e-3
    assert mf.optim.SGD(params(), 0.1, 0.9, 0.5).hyper["dampening"] == 0.5
    for cls in (mf.optim.Adam, mf.optim.AdamW):
        with pytest.raises(TypeError):
            cls(params(), 1e-3, (0.9, 0.999), 1e-8, 0.0, False, 1.0)   # torch's TypeError too
    torch = pytest.importorskip("torch")

    def positional(cls):
        return [(p.name, p.default) for p in inspect.signature(cls).parameters.values()
                if p.kind is p.POSITIONAL_OR_KEYWORD]
    for name in ("SGD", "Adam", "AdamW", "Adadelta"):
        assert positional(getattr(mf.optim, name)) == positional(getattr(torch.optim, name))


def test_pytorch_constructor_keywords_are_taken_at_their_no_op_values():
    """Code written for ``torch.optim`` passes ``foreach=None``, ``fused=False``,
    ``capturable=False`` ...: they were a TypeError (a new user's finding). At their no-op values
    they are taken; another value is refused naming it; an unknown keyword stays a TypeError."""
    params = small_mlp().parameters
    mf.optim.SGD(params(), lr=0.1, foreach=None, fused=False, maximize=False,
                 differentiable=False, dampening=0)
    mf.optim.Adam(params(), capturable=False, foreach=False, decoupled_weight_decay=False)
    mf.optim.AdamW(params(), fused=None, decoupled_weight_decay=True)
    mf.optim.AdamW(params(), fused=True, foreach=True)   # implementations of the same update
    with pytest.raises(ValueError, match=r"SGD: maximize=True; miniflow's SGD runs only "
                                         r"PyTorch's maximize=False"):
        mf.optim.SGD(params(), lr=0.1, maximize=True)
    with pytest.raises(ValueError, match=r"AdamW: fused='yes'; miniflow's AdamW runs only "
                                         r"PyTorch's fused=None, False or True \(leave it out"):
        mf.optim.AdamW(params(), fused="yes")
    with pytest.raises(ValueError, match=r"Adam: decoupled_weight_decay=True"):
        mf.optim.Adam(params(), decoupled_weight_decay=True)   # that is AdamW
    with pytest.raises(TypeError, match=r"Adam.__init__\(\) got an unexpected keyword argument "
                                        r"'bogus'"):
        mf.optim.Adam(params(), bogus=1)


@pytest.mark.parametrize("option", ["fused", "foreach"])
def test_a_fused_or_foreach_torch_optimizer_state_dict_loads_and_trains_as_torch(option):
    """nanoGPT makes ``torch.optim.AdamW(..., fused=True)`` on a GPU, so its checkpoints'
    param groups say ``fused: True``; miniflow refused them ("runs only PyTorch's fused=None or
    False"), although fused and foreach are implementations of the same update. They load now,
    and the next steps match torch's."""
    torch = pytest.importorskip("torch")
    model = mf.nn.Linear(4, 3, dtype=mf.float64)
    tmodel = torch.nn.Linear(4, 3).double()
    model.load_state_dict(tmodel.state_dict())
    topt = torch.optim.AdamW(tmodel.parameters(), lr=0.01, **{option: True})
    x = np.random.default_rng(0).standard_normal((8, 4))
    y = np.arange(8) % 3

    def torch_step():
        topt.zero_grad()
        torch.nn.functional.cross_entropy(tmodel(torch.tensor(x)), torch.tensor(y)).backward()
        topt.step()

    torch_step()
    opt = mf.optim.AdamW(model.parameters(), lr=0.01)
    opt.load_state_dict(topt.state_dict())
    model.load_state_dict(tmodel.state_dict())
    step = Step(model, opt)
    for _ in range(2):
        step(x, y)
        torch_step()
    for k, v in tmodel.state_dict().items():
        np.testing.assert_allclose(model.state_dict()[k], v.numpy(), rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------ 5. weight decay 0
class _EmbeddingFit(mf.nn.Graph):
    """One step of ``sum(weight[ids] ** 2)``: the rows not looked up get a zero gradient."""

    def __init__(self, emb, opt, amp=None):
        super().__init__()
        self.emb = emb
        self.add_optimizer(opt)
        if amp is not None:
            self.config.enable_amp(dtype=amp)

    def build(self, ids):
        loss = (self.emb(ids) ** 2).sum()
        loss.backward()
        return loss


@pytest.mark.parametrize("name,hyper,amp", [
    ("SGD", {"lr": 0.1}, None), ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True}, None),
    ("Adam", {"lr": 0.01}, None), ("Adam", {"lr": 0.01, "amsgrad": True}, None),
    ("AdamW", {"lr": 0.01}, None), ("SGD", {"lr": 0.1, "momentum": 0.9}, mf.bfloat16),
    ("Adam", {"lr": 0.01}, mf.float16), ("Adadelta", {"lr": 1.0}, None),
    ("Adadelta", {"lr": 1.0, "rho": 0.5}, mf.float16)], ids=str)
def test_without_weight_decay_an_infinite_weight_with_no_gradient_stays_infinite(name, hyper, amp):
    """``torch.optim`` adds ``weight_decay * p`` to the gradient only when the decay is not 0,
    so a row of -inf (a mask kept as a parameter) that no step reads stays -inf; adding ``0 *
    -inf`` made it NaN. AdamW's decoupled decay ``p *= 1 - lr * wd`` keeps -inf as torch's."""
    torch = pytest.importorskip("torch")
    mf.manual_seed(0)
    emb = mf.nn.Embedding(5, 3)
    weight = emb.weight.numpy().copy()
    weight[4] = -np.inf
    emb.load_state_dict({"weight": weight})
    g = _EmbeddingFit(emb, getattr(mf.optim, name)(emb.parameters(), **hyper), amp)
    ids = np.array([0, 1, 2, 1], np.int64)
    t_weight = torch.nn.Parameter(torch.tensor(weight))
    t_opt = getattr(torch.optim, name)([t_weight], **hyper)
    for _ in range(3):
        g(ids)
        t_opt.zero_grad()
        (t_weight[torch.tensor(ids)] ** 2).sum().backward()
        t_opt.step()
    got, want = emb.weight.numpy(), t_weight.detach().numpy()
    assert not np.isnan(got).any(), got
    np.testing.assert_array_equal(got[3:], want[3:])          # never read: as it was
    tol = 2e-2 if amp is not None else 1e-5
    np.testing.assert_allclose(got[:3], want[:3], rtol=tol, atol=tol)
