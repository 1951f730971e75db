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


@pytest.mark.parametrize("case", ["sgd", "adamw"])
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
    ({"params": "new", "maximize": True}, KeyError, r"unknown hyper-parameters \['maximize'\]"),
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
