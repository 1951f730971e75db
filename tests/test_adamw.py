"""``optim.AdamW`` against ``torch.optim.AdamW`` (its documented algorithm: ``p *= 1 - lr * wd``,
then the Adam step with bias correction; PyTorch's ``test/optim`` compares trajectories the same
way): the same model, data and hyper-parameters, parameters equal to 1e-5 after 100 steps, in
float32 and through the fused AMP update (``multi_tensor_adam_update_with_cast``)."""
import numpy as np
import pytest

import miniflow as mf

R = np.random.default_rng(5)
X = R.standard_normal((100, 16, 8)).astype(np.float32)
Y = R.standard_normal((100, 16, 4)).astype(np.float32)


class _Net(mf.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = mf.nn.Linear(8, 32), mf.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(self.fc1(x).tanh())


class _Step(mf.nn.Graph):
    def __init__(self, net, opt, amp=False):
        super().__init__()
        self.net = net
        self.add_optimizer(opt)
        if amp:
            self.config.enable_amp(True)

    def build(self, x, y):
        d = self.net(x) - y
        loss = (d * d).mean()
        loss.backward()
        return loss


def _torch_run(net, steps, **hyper):
    torch = pytest.importorskip("torch")
    fc1, fc2 = torch.nn.Linear(8, 32), torch.nn.Linear(32, 4)
    with torch.no_grad():
        for t, m in ((fc1, net.fc1), (fc2, net.fc2)):
            t.weight.copy_(torch.tensor(m.weight.numpy()))
            t.bias.copy_(torch.tensor(m.bias.numpy()))
    params = [fc1.weight, fc1.bias, fc2.weight, fc2.bias]
    opt = torch.optim.AdamW(params, **hyper)
    for k in range(steps):
        opt.zero_grad()
        d = fc2(torch.tanh(fc1(torch.tensor(X[k])))) - torch.tensor(Y[k])
        (d * d).mean().backward()
        opt.step()
    return [p.detach().numpy() for p in params]


@pytest.mark.parametrize("hyper", [{}, {"lr": 1e-2, "weight_decay": 0.5, "betas": (0.8, 0.99),
                                        "eps": 1e-6}], ids=["defaults", "custom"])
def test_adamw_follows_torch_over_100_steps(hyper):
    mf.manual_seed(0)
    net = _Net()
    want = _torch_run(net, 100, **hyper)
    step = _Step(net, mf.optim.AdamW(net.parameters(), **hyper))
    for k in range(100):
        step(mf.tensor(X[k]), mf.tensor(Y[k]))
    got = [net.fc1.weight, net.fc1.bias, net.fc2.weight, net.fc2.bias]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-5)


def test_adamw_defaults_are_pytorchs_and_the_decay_is_decoupled():
    torch = pytest.importorskip("torch")
    want = torch.optim.AdamW([torch.zeros(1, requires_grad=True)]).defaults
    got = mf.optim.AdamW([mf.nn.Parameter(np.zeros(1, np.float32))]).param_groups[0]
    for key in ("lr", "betas", "eps", "weight_decay"):
        assert got[key] == pytest.approx(want[key]), key
    mf.manual_seed(1)
    net = _Net()
    step = _Step(net, mf.optim.AdamW(net.parameters(), weight_decay=0.1))
    step(mf.tensor(X[0]), mf.tensor(Y[0]))
    (update, *_) = [n for n in step.ir.nodes if n.op.name == "adam_update"]
    assert update.attrs["weight_decay"] == 0.0
    assert update.attrs["decoupled_weight_decay"] == pytest.approx(0.1)


def test_adamw_under_amp_decays_in_the_fused_update():
    mf.manual_seed(2)
    net, ref = _Net(), _Net()
    ref.load_state_dict(net.state_dict())
    amp = _Step(net, mf.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.5), amp=True)
    plain = _Step(ref, mf.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.5))
    for k in range(20):
        amp(mf.tensor(X[k]), mf.tensor(Y[k]))
        plain(mf.tensor(X[k]), mf.tensor(Y[k]))
    fused = [n for n in amp.ir.nodes if n.op.name == "multi_tensor_adam_update_with_cast"]
    assert fused and all(n.attrs["decoupled_weight_decay"] == 0.5 for n in fused)
    for a, b in zip(net.parameters(), ref.parameters()):   # float16 compute: close, not equal
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0.05, atol=0.02)


@pytest.mark.parametrize("kw,message", [
    ({"betas": (1.5, 0.9)}, r"AdamW: beta1 must be finite and in \[0, 1\)"),
    ({"betas": 0.9}, r"AdamW: betas must be a pair"),
    ({"eps": -1.0}, r"AdamW: eps must be finite"),
    ({"weight_decay": -0.1}, r"AdamW: weight_decay must be finite"),
    ({"amsgrad": "yes"}, r"AdamW: amsgrad must be True or False"),
])
def test_adamw_errors_name_adamw(kw, message):
    """A bad hyper-parameter of ``AdamW`` was reported as ``Adam: ...``, the base class the user
    never named; PyTorch's ``AdamW`` errors ("Invalid beta parameter at index 0: 1.5") are
    raised by the class called."""
    p = mf.nn.Parameter(np.zeros(2, np.float32))
    with pytest.raises((ValueError, TypeError), match=message):
        mf.optim.AdamW([p], **kw)
