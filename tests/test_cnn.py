"""Convolutional layers in nn: ``Conv2d``, ``BatchNorm2d`` (buffers in the state dict, bound as
graph variables, updated in the graph in training mode only), pools, ``Flatten``; ``Module.train``
/ ``eval`` and the nn.Graph recompiling when a mode changes; AMP training of a conv-bn network
(float32 statistics); and, with torch, 5 SGD steps of a conv-bn network against PyTorch's losses
and running statistics (1e-4)."""
import numpy as np
import pytest

import miniflow as mf
from miniflow import nn
from miniflow.experiments.mlp import EvalGraph as Eval

try:
    import torch
except ImportError:   # torch is optional: its comparisons skip
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


def conv_bn_net(c=2, classes=4):
    """conv(1->c, 3x3, pad 1) -> bn -> relu -> max pool 2 -> conv(c->c, 3x3) -> bn -> relu ->
    global average pool -> flatten -> linear: a small ResNet-like stack."""
    return nn.Sequential(nn.Conv2d(1, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, classes))


class Train(nn.Graph):
    def __init__(self, model, opt, amp=False):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)
        if amp:
            self.config.enable_amp(True)

    def build(self, x, y):
        loss = nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        return loss



def data(n=6, seed=0):
    r = np.random.default_rng(seed)
    return r.standard_normal((n, 1, 6, 6)).astype(np.float32), r.integers(0, 4, n)


# ----------------------------------------------------------------------------- state
def test_state_dict_has_pytorch_keys_and_order():
    m = conv_bn_net()
    assert list(m.state_dict()) == [
        "0.weight", "1.weight", "1.bias", "1.running_mean", "1.running_var",
        "1.num_batches_tracked", "4.weight", "4.bias", "5.weight", "5.bias", "5.running_mean",
        "5.running_var", "5.num_batches_tracked", "9.weight", "9.bias"]
    sd = m.state_dict()
    assert sd["1.num_batches_tracked"].dtype == np.int64 and sd["1.num_batches_tracked"].shape == ()
    assert sd["1.running_var"].tolist() == [1.0, 1.0] and sd["0.weight"].shape == (2, 1, 3, 3)
    assert [n for n, _ in m.named_parameters()] == ["0.weight", "1.weight", "1.bias", "4.weight",
                                                    "4.bias", "5.weight", "5.bias", "9.weight",
                                                    "9.bias"]
    assert [n for n, _ in m.named_buffers()] == [
        "1.running_mean", "1.running_var", "1.num_batches_tracked", "5.running_mean",
        "5.running_var", "5.num_batches_tracked"]


def test_load_state_dict_loads_buffers_and_checks_them():
    m, other = conv_bn_net(), conv_bn_net()
    sd = m.state_dict()
    sd["1.running_mean"] = np.array([1.0, 2.0], np.float32)
    sd["1.num_batches_tracked"] = np.array(7, np.int64)
    other.load_state_dict(sd)
    assert other[1].running_mean.numpy().tolist() == [1.0, 2.0]
    assert int(other[1].num_batches_tracked.item()) == 7
    bad = dict(sd, **{"5.running_var": np.ones(3, np.float32)})
    with pytest.raises(ValueError, match=r"'5.running_var' is f32\[2\] in the model but "
                                         r"float32\[3\] in the state dict"):
        other.load_state_dict(bad)
    del sd["1.running_var"]
    with pytest.raises(KeyError, match=r"missing keys \['1.running_var'\]"):
        other.load_state_dict(sd)


def test_register_buffer_rules():
    m = nn.Module()
    m.register_buffer("count", np.zeros(3, np.int64))
    m.register_buffer("scratch", np.ones(2, np.float32), persistent=False)
    assert list(m.state_dict()) == ["count"] and [n for n, _ in m.named_buffers()] == \
        ["count", "scratch"]
    m.count = np.arange(3)                 # assigning replaces the buffer
    assert m.count.numpy().tolist() == [0, 1, 2] and list(m.state_dict()) == ["count"]
    m.weight = nn.Parameter(np.zeros(2, np.float32))
    with pytest.raises(KeyError, match="'weight' is already a parameter of Module"):
        m.register_buffer("weight", np.zeros(2))
    with pytest.raises(KeyError, match="without '.'"):
        m.register_buffer("a.b", np.zeros(2))


def test_train_and_eval_set_the_mode_of_the_whole_tree():
    m = conv_bn_net()
    assert all(x.training for x in m.modules())
    assert m.eval() is m and not any(x.training for x in m.modules())
    m.train()
    assert all(x.training for x in m.modules())
    with pytest.raises(TypeError, match="train: mode must be True or False"):
        m.train("no")


# ----------------------------------------------------------------------------- graphs and modes
def test_training_updates_statistics_in_the_graph_and_eval_does_not():
    mf.manual_seed(0)
    m = conv_bn_net()
    step = Train(m, mf.optim.SGD(m.parameters(), lr=0.1, momentum=0.9))
    x, y = data()
    for k in range(3):
        step(x, y)
        assert int(m[1].num_batches_tracked.item()) == k + 1
    mean_after_train = m[1].running_mean.numpy()
    assert np.abs(mean_after_train).max() > 0
    ir_ops = step.ir.count_ops()
    assert ir_ops["normalization"] == 2 and ir_ops["increment"] == 2
    m.eval()
    ev = Eval(m)
    before = m.state_dict()
    out = ev(x).numpy()
    assert "increment" not in ev.ir.count_ops()
    assert not any(n.written for n in ev.ir.nodes)
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)
    # eval output uses the running statistics: recompute bn 1 by hand from them
    h = nn.functional.conv2d(mf.tensor(x), m[0].weight, padding=1).numpy()
    rm, rv = m[1].running_mean.numpy(), m[1].running_var.numpy()
    g, b = m[1].weight.numpy(), m[1].bias.numpy()
    want = (h - rm[:, None, None]) / np.sqrt(rv[:, None, None] + 1e-5) * g[:, None, None] \
        + b[:, None, None]
    got = m[1](mf.tensor(h)).numpy()             # eager, eval mode
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert out.shape == (6, 4)


def test_a_graph_recompiles_when_a_module_mode_changes():
    mf.manual_seed(1)
    m = conv_bn_net()
    ev = Eval(m)
    x, _ = data()
    ev(x)
    modes = lambda: [n.attrs["training"]  # noqa: E731  (of the plan that ran last)
                     for n in next(reversed(ev.plans.values())).graph.nodes
                     if n.op.name == "normalization"]
    assert ev.compile_count == 1 and modes() == [True, True]
    ev(x)
    assert ev.compile_count == 1
    m[5].eval()                                   # one submodule's mode changes
    ev(x)
    assert ev.compile_count == 2 and modes() == [True, False]
    m[5].training = False                         # no change: no recompile
    ev(x)
    assert ev.compile_count == 2
    m.train()                                     # back to the first modes: its plan is kept
    ev(x)
    assert ev.compile_count == 2 and modes() == [True, True] and len(ev.plans) == 2


def test_eager_batch_norm_updates_its_statistics_like_pytorch_eager():
    bn = nn.BatchNorm2d(3)
    x = np.random.default_rng(2).standard_normal((4, 3, 2, 2)).astype(np.float32)
    bn(mf.tensor(x))
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.1 * x.mean(axis=(0, 2, 3)), rtol=1e-5,
                               atol=1e-7)
    np.testing.assert_allclose(bn.running_var.numpy(),
                               0.9 + 0.1 * x.var(axis=(0, 2, 3), ddof=1), rtol=1e-5)
    assert int(bn.num_batches_tracked.item()) == 1


def test_amp_training_of_a_conv_bn_network_keeps_fp32_statistics():
    mf.manual_seed(3)
    m = conv_bn_net(c=4)
    step = Train(m, mf.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), amp=True)
    step.set_grad_scaler(mf.amp.GradScaler(init_scale=2.0 ** 10))
    x, y = data(16, seed=4)
    losses = [float(step(x, y)) for _ in range(20)]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
    report = step.amp_report()
    colors = {r.op: r.color for r in report.rows}
    assert colors["conv2d"] == colors["normalization"] == colors["conv_filter_grad"] == "white"
    assert len([c for c in report.no_cast if c.startswith("normalization ")]) == 8
    assert m[1].running_mean.dtype is mf.float32 and np.isfinite(m[1].running_var.numpy()).all()
    assert int(m[1].num_batches_tracked.item()) == 20


def test_bad_layer_input_is_named():
    bn = nn.BatchNorm2d(3)
    with pytest.raises(ValueError, match=r"BatchNorm2d\(3\): the input has 2 channels"):
        bn(mf.tensor(np.zeros((1, 2, 2, 2), np.float32)))
    with pytest.raises(ValueError, match=r"BatchNorm2d: expected a 4-D input"):
        bn(mf.tensor(np.zeros((2, 3), np.float32)))
    with pytest.raises(ValueError, match=r"Conv2d: groups=2 must divide in_channels=3"):
        nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match=r"BatchNorm2d: momentum must be a number in \[0, 1\]"):
        nn.BatchNorm2d(3, momentum=None)
    conv = nn.Conv2d(3, 4, 3)
    with pytest.raises(ValueError, match=r"conv2d: the input has 2 channels but the weight "
                                         r"expects 3"):
        conv(mf.tensor(np.zeros((1, 2, 5, 5), np.float32)))


def test_layers_shapes_and_repr():
    x = mf.tensor(np.random.default_rng(0).standard_normal((2, 3, 9, 9)).astype(np.float32))
    assert nn.Conv2d(3, 4, 3, stride=2, padding=1)(x).shape == (2, 4, 5, 5)
    assert nn.Conv2d(3, 4, 3, padding="same", dilation=2)(x).shape == (2, 4, 9, 9)
    assert nn.MaxPool2d(3, 2, 1)(x).shape == (2, 3, 5, 5)
    y, ind = nn.MaxPool2d(2, return_indices=True)(x)
    assert y.shape == ind.shape == (2, 3, 4, 4) and ind.dtype is mf.int64
    assert nn.AvgPool2d(3, ceil_mode=True)(x).shape == (2, 3, 3, 3)
    assert nn.AdaptiveAvgPool2d((None, 2))(x).shape == (2, 3, 9, 2)
    assert nn.Flatten()(x).shape == (2, 243) and nn.Identity()(x) is x
    assert repr(nn.Conv2d(3, 4, 3, bias=False)) == \
        "Conv2d(3, 4, kernel_size=(3, 3), stride=(1, 1), bias=False)"


# ----------------------------------------------------------------------------- PyTorch
def torch_conv_bn_net(c=2, classes=4):
    t = torch.nn
    return t.Sequential(t.Conv2d(1, c, 3, padding=1, bias=False), t.BatchNorm2d(c), t.ReLU(),
                        t.MaxPool2d(2), t.Conv2d(c, c, 3, padding=1), t.BatchNorm2d(c), t.ReLU(),
                        t.AdaptiveAvgPool2d(1), t.Flatten(), t.Linear(c, classes))


@needs_torch
def test_five_training_steps_match_pytorch():
    """Same initial weights, same batches: the losses of 5 SGD-momentum steps and the running
    statistics after them equal PyTorch's to 1e-4 (float32 on both sides)."""
    torch.manual_seed(0)
    ref = torch_conv_bn_net(c=3)
    m = conv_bn_net(c=3)
    assert list(m.state_dict()) == list(ref.state_dict())
    m.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    step = Train(m, mf.optim.SGD(m.parameters(), lr=0.1, momentum=0.9))
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for k in range(5):
        x, y = data(8, seed=10 + k)
        loss = float(step(x, y))
        opt.zero_grad()
        tl = torch.nn.functional.cross_entropy(ref(torch.from_numpy(x)), torch.from_numpy(y))
        tl.backward()
        opt.step()
        assert abs(loss - tl.item()) <= 1e-4 * max(1.0, abs(tl.item())), (k, loss, tl.item())
    for key, value in ref.state_dict().items():
        np.testing.assert_allclose(m.state_dict()[key], value.numpy(), rtol=1e-4, atol=1e-4,
                                   err_msg=key)
    ref.eval()
    m.eval()
    x, _ = data(5, seed=99)
    np.testing.assert_allclose(Eval(m)(x).numpy(), ref(torch.from_numpy(x)).detach().numpy(),
                               rtol=1e-4, atol=1e-5)
