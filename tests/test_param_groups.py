"""Optimizers with several parameter groups (``torch.optim`` semantics): per-group
hyper-parameters in the compiled updates, ``add_param_group`` (before and after compiling),
PyTorch's errors, the state dict in PyTorch's layout, schedulers and clipping acting on every
group. PyTorch's ``test/optim/test_optim.py`` checks the same things: its basic cases run every
optimizer on ``[{"params": [weight]}, {"params": [bias], "lr": ...}]`` and compare trajectories;
here the trajectories are compared with ``torch.optim`` itself (skipped without torch)."""
import numpy as np
import pytest

import miniflow as mf
from miniflow import nn

from graph_cases import MseFit

_R = np.random.default_rng(5)
_X = _R.standard_normal((20, 16, 6)).astype(np.float32)
_Y = _R.standard_normal((20, 16, 3)).astype(np.float32)
STEPS = 20


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(self.fc1(x).relu())


def _net():
    mf.manual_seed(4)
    return _Net()


def _groups(net, extra=None):
    """nanoGPT's split: weights decay, biases do not and learn at their own lr."""
    weights = [net.fc1.weight, net.fc2.weight]
    biases = [net.fc1.bias, net.fc2.bias]
    return [{"params": weights}, {"params": biases, "weight_decay": 0.0, "lr": 0.02,
                                  **(extra or {})}]


CASES = {
    "sgd": (lambda o, g: o.SGD(g, lr=0.05, momentum=0.9, weight_decay=0.1),
            {"momentum": 0.5, "nesterov": True}),
    "adamw": (lambda o, g: o.AdamW(g, lr=0.01, betas=(0.9, 0.95), weight_decay=0.1),
              {"betas": (0.8, 0.99), "eps": 1e-6}),
    "adam-amsgrad": (lambda o, g: o.Adam(g, lr=0.01, weight_decay=0.01), {"amsgrad": True}),
    "adadelta": (lambda o, g: o.Adadelta(g, lr=1.0, weight_decay=0.1),
                 {"rho": 0.8, "eps": 1e-5, "maximize": True}),
}
"""name -> (make(optim module, groups), hyper-parameters group 1 sets besides lr and wd)."""


def _miniflow(make, extra, steps=STEPS, schedule=True, add_at=None):
    net = _net()
    groups = _groups(net, extra)
    opt = make(mf.optim, groups if add_at is None else groups[:1])
    sched = mf.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps) if schedule else None
    fit = MseFit(net, opt)
    for k in range(steps):
        if k == add_at:
            opt.add_param_group(groups[1])
        fit(mf.tensor(_X[k]), mf.tensor(_Y[k]))
        if sched is not None:
            sched.step()
    return [p.numpy() for p in net.parameters()], opt, fit


def _torch(make, extra, steps=STEPS, schedule=True, add_at=None):
    torch = pytest.importorskip("torch")
    net = _net()
    w1, b1, w2, b2 = (torch.tensor(p.numpy(), requires_grad=True) for p in
                      (net.fc1.weight, net.fc1.bias, net.fc2.weight, net.fc2.bias))
    groups = [{"params": [w1, w2]}, {"params": [b1, b2], "weight_decay": 0.0, "lr": 0.02,
                                     **(extra or {})}]
    opt = make(torch.optim, groups if add_at is None else groups[:1])
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps) if schedule else None
    for k in range(steps):
        if k == add_at:
            opt.add_param_group(groups[1])
        opt.zero_grad()
        h = torch.relu(torch.tensor(_X[k]) @ w1.T + b1)
        d = h @ w2.T + b2 - torch.tensor(_Y[k])
        (d * d).mean().backward()
        opt.step()
        if sched is not None:
            sched.step()
    return [t.detach().numpy() for t in (w1, b1, w2, b2)], opt


def _close(got, want, tol=1e-6):
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


@pytest.mark.parametrize("case", list(CASES))
def test_two_groups_follow_torch_with_a_schedule_on_every_group(case):
    make, extra = CASES[case]
    mine, opt, fit = _miniflow(make, extra)
    theirs, t_opt = _torch(make, extra)
    _close(mine, theirs)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx(
        [g["lr"] for g in t_opt.param_groups], rel=1e-12)
    sd, t_sd = opt.state_dict(), t_opt.state_dict()
    assert [g["params"] for g in sd["param_groups"]] == [[0, 1], [2, 3]]
    assert [g["params"] for g in t_sd["param_groups"]] == [[0, 1], [2, 3]]
    for g, t in zip(sd["param_groups"], t_sd["param_groups"]):
        for k in set(g) & set(t) - {"params"}:     # PyTorch's flags (None, bools) equal
            assert g[k] == (t[k] if t[k] is None or isinstance(t[k], bool)
                            else pytest.approx(t[k], rel=1e-12, abs=1e-15)), k
    assert set(sd["state"][3]) == set(t_sd["state"][3])  # amsgrad's state in group 1 only
    assert set(sd["state"][0]) == set(t_sd["state"][0])
    # the compiled graph has the groups' own hyper-parameters and learning rates
    ir = str(fit.ir)
    assert "%optimizer0.learning_rate" in ir and "%optimizer0.group1.learning_rate" in ir


@pytest.mark.parametrize("case", ["sgd", "adamw", "adadelta"])
def test_add_param_group_after_compiling_recompiles_and_follows_torch(case):
    make, extra = CASES[case]
    mine, opt, fit = _miniflow(make, extra, schedule=False, add_at=5)
    theirs, _ = _torch(make, extra, schedule=False, add_at=5)
    _close(mine, theirs)
    assert fit.compile_count == 2 and len(opt.param_groups) == 2
    assert opt.param_groups[1]["lr"] == 0.02 and opt.param_groups[1]["weight_decay"] == 0.0
    assert opt.param_groups[1]["params"][0] is opt.params[2]


def test_per_group_clipping_clips_each_group_alone():
    torch = pytest.importorskip("torch")
    make = CASES["sgd"][0]
    mine, _, _ = _miniflow(make, {"clip_grad_max_norm": 0.01}, schedule=False)
    net = _net()
    w1, b1, w2, b2 = (torch.tensor(p.numpy(), requires_grad=True) for p in
                      (net.fc1.weight, net.fc1.bias, net.fc2.weight, net.fc2.bias))
    opt = make(torch.optim, [{"params": [w1, w2]}, {"params": [b1, b2], "lr": 0.02,
                                                    "weight_decay": 0.0}])
    for k in range(STEPS):
        opt.zero_grad()
        d = torch.relu(torch.tensor(_X[k]) @ w1.T + b1) @ w2.T + b2 - torch.tensor(_Y[k])
        (d * d).mean().backward()
        torch.nn.utils.clip_grad_norm_([b1, b2], 0.01)    # group 1 only
        opt.step()
    _close(mine, [t.detach().numpy() for t in (w1, b1, w2, b2)])


def test_group_keys_default_to_the_constructors_and_change_alone():
    net = _net()
    opt = mf.optim.AdamW(_groups(net), lr=0.01)
    assert opt.defaults["lr"] == 0.01 and opt.defaults["weight_decay"] == 0.01
    g0, g1 = opt.param_groups
    assert (g0["lr"], g0["weight_decay"], g1["lr"], g1["weight_decay"]) == (0.01, 0.01, 0.02, 0.0)
    assert g1["betas"] == (0.9, 0.999) and opt.learning_rates[1][0] == 0.02
    g1["lr"] = 0.5                         # the group's own learning-rate array: no recompile
    assert opt.learning_rates[1][0] == 0.5 and opt.learning_rate[0] == 0.01
    assert opt.version == 0
    g1["eps"] = 1e-4
    assert opt.version == 1 and g0["eps"] == 1e-8
    with pytest.raises(ValueError, match=r"AdamW: eps must be finite"):
        g1["eps"] = -1.0
    with pytest.raises(TypeError, match=r"AdamW.param_groups\[1\]: pop\('lr'\) is refused"):
        g1.pop("lr")
    assert opt.hyper == g0.hyper()


@pytest.mark.parametrize("group,err,match", [
    ("not a dict", TypeError, "param_group must be a dict"),
    ({"lr": 0.1}, TypeError, "the group has no 'params'"),
    ({"params": {1}}, TypeError, "ordered collections"),
    ({"params": [np.ones(2)]}, TypeError, "parameter 0 of group 1 is a ndarray"),
    ({"params": "first"}, ValueError, "some parameters appear in more than one parameter group"),
    ({"params": "new", "nesterov": True}, ValueError, "Nesterov momentum requires a momentum"),
    ({"params": "new", "maximize": True}, ValueError, r"maximize=True; .* runs only PyTorch's "
                                                      r"maximize=False"),
    ({"params": "new twice"}, ValueError, "a parameter appears twice in group 1"),
])
def test_a_refused_add_param_group_raises_pytorchs_error_and_changes_nothing(group, err, match):
    net = _net()
    opt = mf.optim.SGD([net.fc1.weight], lr=0.1)
    if isinstance(group, dict) and isinstance(group.get("params"), str):
        new = net.fc2.weight
        group["params"] = {"first": [new, net.fc1.weight], "new": new,
                           "new twice": [new, new]}[group["params"]]
    before = (len(opt.params), len(opt.state), len(opt.learning_rates), opt.version)
    with pytest.raises(err, match=match):
        opt.add_param_group(group)
    assert (len(opt.params), len(opt.state), len(opt.learning_rates), opt.version) == before
    assert len(opt.param_groups) == 1


def test_two_group_state_dict_round_trips_and_a_mismatch_is_pytorchs_error():
    _, opt, _ = _miniflow(*CASES["adam-amsgrad"], steps=3, schedule=False)
    sd = opt.state_dict()
    fresh = mf.optim.Adam(_groups(_net(), {"amsgrad": True}), lr=0.01, weight_decay=0.01)
    fresh.load_state_dict(sd)
    got = fresh.state_dict()
    assert got["param_groups"] == sd["param_groups"]
    for i, s in sd["state"].items():
        for k, v in s.items():
            np.testing.assert_array_equal(got["state"][i][k], v)
    assert fresh.learning_rates[1][0] == sd["param_groups"][1]["lr"]
    one = mf.optim.Adam(_net().parameters(), lr=0.01)
    with pytest.raises(ValueError, match="different number of parameter groups"):
        one.load_state_dict(sd)
    other = mf.optim.Adam([{"params": [p]} for p in _net().parameters()][:3], lr=0.01)
    with pytest.raises(ValueError, match="different number of parameter groups"):
        other.load_state_dict(sd)
    net = _net()
    sizes = mf.optim.Adam([{"params": [net.fc1.weight]},
                           {"params": [net.fc1.bias, net.fc2.weight, net.fc2.bias],
                            "amsgrad": True}], lr=0.01)
    with pytest.raises(ValueError, match="doesn't match the size of optimizer's group"):
        sizes.load_state_dict(sd)
    no_ams = mf.optim.Adam(_groups(_net()), lr=0.01, weight_decay=0.01)
    with pytest.raises(ValueError, match=r"param_groups\[1\]: Adam: amsgrad cannot be changed"):
        no_ams.load_state_dict(sd)


def test_a_param_added_to_a_group_of_another_optimizer_of_the_graph_is_refused():
    net = _net()
    a = mf.optim.SGD([net.fc1.weight, net.fc1.bias], lr=0.1)
    b = mf.optim.SGD([net.fc2.weight, net.fc2.bias], lr=0.1)

    class Two(MseFit):
        def __init__(self):
            super().__init__(net, a)
            self.add_optimizer(b)

    g = Two()
    g(mf.tensor(_X[0]), mf.tensor(_Y[0]))
    b.add_param_group({"params": [net.fc1.weight]})
    with pytest.raises(ValueError, match="also trained by another optimizer of the graph"):
        g(mf.tensor(_X[1]), mf.tensor(_Y[1]))


# ---------------------------------------------------------------- keys of the user's own
def test_a_groups_own_keys_are_kept_unread_by_construction_and_add_param_group():
    """PyTorch keeps a key the optimizer does not know in the group, unvalidated and unread
    (``{"params": ..., "name": "head"}``, or a misspelt ``"weight_decy"``, without a warning)."""
    net = _net()
    opt = mf.optim.SGD([{"params": [net.fc1.weight], "name": "body", "lr_mult": 0.1,
                         "weight_decy": 0.5, 7: [1, 2]}], lr=0.1, weight_decay=0.01)
    g0 = opt.param_groups[0]
    assert (g0["name"], g0["lr_mult"], g0["weight_decy"], g0[7]) == ("body", 0.1, 0.5, [1, 2])
    assert g0["weight_decay"] == 0.01 and g0["lr"] == 0.1     # the typo sets nothing
    assert g0.others() == {"name": "body", "lr_mult": 0.1, "weight_decy": 0.5, 7: [1, 2]}
    assert "name" not in opt.hyper and "name" not in opt.defaults and opt.version == 0
    opt.add_param_group({"params": net.fc2.weight, "name": "head", "lr": 0.05, "anything": None,
                         "foreach": None})
    g1 = opt.param_groups[1]
    assert (g1["name"], g1["anything"], g1["foreach"], g1["lr"]) == ("head", None, None, 0.05)
    assert "name" not in g1.hyper() and g1.hyper()["lr"] == 0.05
    with pytest.raises(ValueError, match=r"add_param_group: maximize=True; miniflow's SGD runs "
                                         "only PyTorch's maximize=False"):
        opt.add_param_group({"params": net.fc2.bias, "name": "x", "maximize": True})
    assert len(opt.param_groups) == 2


def test_a_groups_own_keys_set_changed_or_removed_later_recompile_nothing():
    net = _net()
    opt = mf.optim.Adam(_groups(net, {"name": "biases"}), lr=0.01)
    fit = MseFit(net, opt)
    fit(mf.tensor(_X[0]), mf.tensor(_Y[0]))
    g0, g1 = opt.param_groups
    g1["name"] = "b"                         # an existing key
    g0["my_key"] = 1                         # a new one
    g0.update(tag="w", lr_mult=0.5)
    g0 |= {"tag": "w2"}
    assert g0.setdefault("note", "n") == "n" and g0.setdefault("note", "m") == "n"
    assert (g1["name"], g0["my_key"], g0["tag"], g0["lr_mult"]) == ("b", 1, "w2", 0.5)
    del g0["note"]
    assert g0.pop("lr_mult") == 0.5 and g0.pop("missing", 3) == 3
    assert opt.version == 0
    fit(mf.tensor(_X[1]), mf.tensor(_Y[1]))
    assert fit.compile_count == 1
    with pytest.raises(KeyError, match="cannot set 'params'"):
        g0["params"] = []
    with pytest.raises(TypeError, match=r"del group\['eps'\] is refused"):
        del g0["eps"]
    with pytest.raises(TypeError, match=r"pop\('params'\) is refused"):
        g0.pop("params")
    with pytest.raises(ValueError, match="amsgrad cannot be changed"):
        g1.update(name="c", amsgrad=True)    # all or nothing: name unchanged
    assert g1["name"] == "b" and opt.version == 0
    g1["eps"] = 1e-6                         # a hyper-parameter still recompiles
    assert opt.version == 1


def test_a_groups_own_keys_round_trip_through_state_dict_copy_and_pickle():
    import copy
    import pickle
    net = _net()
    opt = mf.optim.AdamW(_groups(net, {"name": "biases", "lr_mult": [0.1]}), lr=0.01)
    opt.param_groups[0]["name"] = "weights"
    sd = copy.deepcopy(opt.state_dict())     # (its values are the group's, as in PyTorch)
    assert sd["param_groups"][0]["name"] == "weights"
    assert (sd["param_groups"][1]["name"], sd["param_groups"][1]["lr_mult"]) == ("biases", [0.1])
    fresh = mf.optim.AdamW(_groups(_net(), {"stale": 1}), lr=0.01)
    fresh.load_state_dict(sd)
    f0, f1 = fresh.param_groups
    assert f0["name"] == "weights" and f1["name"] == "biases" and f1["lr_mult"] == [0.1]
    assert "stale" not in f1                 # PyTorch's load replaces the group's keys
    sd["param_groups"][1]["lr_mult"].append(2)   # the loaded group holds a copy
    assert f1["lr_mult"] == [0.1] and fresh.state_dict()["param_groups"][1]["lr_mult"] == [0.1]
    assert fresh.version == 1
    for other in (copy.deepcopy(opt), pickle.loads(pickle.dumps(opt)), copy.copy(opt)):
        o0, o1 = other.param_groups
        assert (o0["name"], o1["name"], o1["lr_mult"]) == ("weights", "biases", [0.1])
        o1["name"] = "other"                 # the copy's own group, still a ParamGroup
        o1["eps"] = 1e-6
        assert other.version == 1 and opt.param_groups[1]["name"] == "biases"
        assert "name" not in o1.hyper() and o1.hyper()["eps"] == 1e-6


def test_an_extra_key_leaves_the_training_steps_bit_for_bit():
    def losses(extra):
        net = _net()
        groups = _groups(net)
        groups[0].update(extra)
        opt = mf.optim.AdamW(groups, lr=0.01)
        fit = MseFit(net, opt)
        out = []
        for k in range(6):
            if k == 3:
                for key, value in extra.items():
                    opt.param_groups[1][key] = value
            out.append(fit(mf.tensor(_X[k]), mf.tensor(_Y[k])).numpy())
        assert fit.compile_count == 1
        return out, [p.numpy() for p in net.parameters()]

    plain, with_keys = losses({}), losses({"name": "weights", "weight_decy": 0.5})
    for a, b in zip(plain[0] + plain[1], with_keys[0] + with_keys[1]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("case", list(CASES))
def test_a_groups_own_keys_in_state_dicts_match_torch_both_ways(case):
    torch = pytest.importorskip("torch")
    make, extra = CASES[case]
    own = {"name": "biases", "lr_mult": 0.1, "weight_decy": 0.5}
    _, opt, _ = _miniflow(make, {**extra, **own}, steps=3, schedule=False)
    _, t_opt = _torch(make, {**extra, **own}, steps=3, schedule=False)
    sd, t_sd = opt.state_dict(), t_opt.state_dict()
    for g, t in zip(sd["param_groups"], t_sd["param_groups"]):
        assert {k: g[k] for k in own if k in g} == {k: t[k] for k in own if k in t}
    assert set(sd["param_groups"][1]) >= set(own) and not set(own) & set(t_sd["param_groups"][0])
    t_opt.param_groups[0]["name"] = "weights"   # set later in torch: loads into miniflow
    t_sd = t_opt.state_dict()
    fresh = make(mf.optim, _groups(_net(), extra))
    fresh.load_state_dict({**t_sd, "state": {i: {k: v.numpy() for k, v in s.items()}
                                             for i, s in t_sd["state"].items()}})
    f0, f1 = fresh.param_groups
    assert f0["name"] == "weights" and {k: f1[k] for k in own} == own
    assert f1["weight_decay"] == 0.0         # the misspelt key set nothing, as in torch
    back = make(torch.optim, [{"params": [torch.zeros(8, 6), torch.zeros(3, 8)]},
                              {"params": [torch.zeros(8), torch.zeros(3)]}])
    back.load_state_dict({**sd, "state": {i: {k: torch.tensor(v) for k, v in s.items()}
                                          for i, s in sd["state"].items()}})
    assert {k: back.param_groups[1][k] for k in own} == own


def test_named_parameters_make_param_names_as_torch():
    """PyTorch >= 2.6 takes ``model.named_parameters()`` (in a group too) and keeps the names
    in the group's ``"param_names"``, in its state dict and through a load of a state dict
    without them. miniflow refused the (name, parameter) pairs ("a tuple, not an
    nn.Parameter")."""
    net = _net()
    opt = mf.optim.SGD(net.named_parameters(), lr=0.1, momentum=0.9)
    names = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert opt.param_groups[0]["param_names"] == names
    assert opt.params == list(net.parameters())
    assert opt.param_groups[0].others() == {"param_names": names}
    sd = opt.state_dict()
    assert sd["param_groups"][0]["param_names"] == names
    two = mf.optim.Adam([{"params": list(net.named_parameters())[:2]},
                         {"params": list(net.named_parameters())[2:], "lr": 0.01}], lr=0.1)
    assert [g["param_names"] for g in two.param_groups] == [names[:2], names[2:]]
    unnamed = mf.optim.SGD(_net().parameters(), lr=0.1, momentum=0.9).state_dict()
    opt.load_state_dict(unnamed)                 # PyTorch's load keeps the group's names
    assert opt.param_groups[0]["param_names"] == names
    mixed = [("fc1.weight", net.fc1.weight), net.fc1.bias]
    with pytest.raises(ValueError, match="all optimizer params should be with/without names"):
        mf.optim.SGD(mixed, lr=0.1)
    with pytest.raises(ValueError, match="all optimizer param groups should be with/without"):
        mf.optim.SGD([{"params": [("fc1.weight", net.fc1.weight)]},
                      {"params": [net.fc1.bias]}], lr=0.1)
    torch = pytest.importorskip("torch")
    t_net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 3))
    t_sd = torch.optim.SGD(t_net.named_parameters(), lr=0.1, momentum=0.9).state_dict()
    fresh = mf.optim.SGD(_net().parameters(), lr=0.1, momentum=0.9)
    fresh.load_state_dict(t_sd)
    assert fresh.param_groups[0]["param_names"] == t_sd["param_groups"][0]["param_names"]
    with pytest.raises(ValueError, match="all optimizer params should be with/without names"):
        torch.optim.SGD([("0.weight", t_net[0].weight), t_net[0].bias], lr=0.1)
    with pytest.raises(ValueError, match="all optimizer param groups should be with/without"):
        torch.optim.SGD([{"params": [("0.weight", t_net[0].weight)]},
                         {"params": [t_net[0].bias]}], lr=0.1)


def test_a_groups_params_list_cannot_change_behind_the_optimizers_back():
    """``opt.param_groups[0]["params"].append(p)`` (PyTorch's step() reads the list at each
    call) left miniflow's optimizer out of step: its state and compiled update covered the old
    parameters, the next graph build failed with "IndexError: list index out of range" and
    state_dict() listed a parameter with no state. The list is now read-only, naming
    add_param_group; copies are plain lists, and copy / pickle keep it read-only."""
    import copy
    import pickle
    net = _net()
    opt = mf.optim.SGD([net.fc1.weight], lr=0.1, momentum=0.9)
    params = opt.param_groups[0]["params"]
    changes = [lambda: params.append(net.fc1.bias), lambda: params.extend([net.fc1.bias]),
               lambda: params.insert(0, net.fc1.bias), lambda: params.remove(net.fc1.weight),
               lambda: params.pop(), lambda: params.clear(),
               lambda: params.__setitem__(0, net.fc1.bias), lambda: params.__delitem__(0)]
    for change in changes:
        with pytest.raises(TypeError, match=r"param_groups\[i\]\['params'\] cannot be changed "
                                            r"in place .* add_param_group"):
            change()
    assert params == [net.fc1.weight] and opt.params == [net.fc1.weight]
    with pytest.raises(TypeError, match="cannot be changed in place"):
        opt.param_groups[0]["params"] += [net.fc1.bias]
    assert type(params + [net.fc1.bias]) is list and type(copy.copy(params)) is list
    assert list(params) == [net.fc1.weight] and len(params) == 1 and params[0] is net.fc1.weight
    for other in (copy.deepcopy(opt), pickle.loads(pickle.dumps(opt))):
        with pytest.raises(TypeError, match="cannot be changed in place"):
            other.param_groups[0]["params"].append(net.fc1.bias)
    opt.add_param_group({"params": [net.fc1.bias]})
    assert opt.state_dict()["param_groups"][1]["params"] == [1]
