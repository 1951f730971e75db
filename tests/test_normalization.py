"""Batch norm ops: the CPU kernels against the float64 references (also with the parallel variants
and where one-pass statistics would fail), writes only in training mode, the gradient rules
against finite differences (training, eval, the statistics outputs), PyTorch's
``F.batch_norm`` forward, backward and running statistics in float64 (skipped without torch),
and the errors; ``nn.BatchNorm2d``'s ``track_running_stats`` changed after construction and
state dicts without ``num_batches_tracked``, against ``torch.nn.BatchNorm2d``."""
import copy
import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

import miniflow as mf
from miniflow import nn
from miniflow.experiments.mlp import EvalGraph
from miniflow.kernels.cpu import normalization as cpu_norm
from miniflow.ops.normalization import normalization_reference
from miniflow.dtype import bfloat16
from miniflow.testing import check_grad, gradient_graph

from op_cases import Case, assert_matches_reference, host_buffers, make_node, run_cpu as run

try:
    import torch
    import torch.nn.functional as F
except ImportError:   # torch is optional: its comparisons skip
    torch = F = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

SHAPES = [((3, 4, 5, 6), 1), ((9, 5), 1), ((2, 3, 4), 2), ((4, 3, 1, 1), 1), ((2, 5, 3), 0)]


def inputs(dt, shape, axis, seed=0, mean=1.0, std=2.0):
    r = np.random.default_rng(seed)
    pt = np.float32 if dt == np.float16 else dt
    c = shape[axis]
    x = (mean + std * r.standard_normal(shape)).astype(dt)
    mm, gamma, beta = (r.standard_normal(c).astype(pt) for _ in range(3))
    return [x, mm, r.uniform(0.5, 2.0, c).astype(pt), gamma, beta]




@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("dt", [np.float16, np.float32, np.float64], ids=lambda d: d.__name__)
@pytest.mark.parametrize("shape,axis", SHAPES)
def test_kernels_match_the_reference(shape, axis, dt, parallel):
    with mock.patch.object(cpu_norm, "use_parallel", lambda size: parallel):
        ins = inputs(dt, shape, axis)
        for training in (True, False):
            case = Case("normalization", ins, {"axis": axis, "training": training})
            assert_matches_reference(case, run(case))
        pt = np.float64 if dt == np.float64 else np.float32
        f64 = [a.astype(np.float64) for a in ins]
        _, mean, inv, _, _ = normalization_reference(f64, {"axis": axis, "epsilon": 1e-5,
                                                           "momentum": 0.9, "training": True})
        dy = np.random.default_rng(1).standard_normal(shape).astype(dt)
        case = Case("normalization_grad", [ins[0], dy, mean.astype(pt), inv.astype(pt), ins[3]],
                    {"axis": axis})
        assert_matches_reference(case, run(case))


def test_training_writes_the_moving_statistics_and_eval_writes_nothing():
    ins = inputs(np.float32, (4, 3, 5, 5), 1)
    y, mean, inv, mm, mv = run(Case("normalization", ins, {"training": True, "momentum": 0.9}))
    x = ins[0].astype(np.float64)
    np.testing.assert_allclose(mm, 0.9 * ins[1] + 0.1 * x.mean(axis=(0, 2, 3)), rtol=1e-5)
    np.testing.assert_allclose(mv, 0.9 * ins[2] + 0.1 * x.var(axis=(0, 2, 3), ddof=1), rtol=1e-5)
    case = Case("normalization", ins, {"training": False})
    node = make_node(case)
    bufs, outs = host_buffers(case, node)
    from miniflow.kernels import cpu
    for fn, args in cpu.builder_for(node.op)(node, bufs, outs):
        fn(*args)
    assert len(outs) == 1 and node.written == []
    for a, b in zip(bufs, ins):
        np.testing.assert_array_equal(a, b)


def test_statistics_are_exact_for_float16_data_at_a_large_mean():
    """Two passes: float16 data at mean 1000 and std 1 gets its variance right (one-pass
    ``E[x^2] - E[x]^2`` in float32 loses it to cancellation)."""
    ins = inputs(np.float16, (8, 2, 16, 16), 1, mean=1000.0, std=1.0)
    got = run(Case("normalization", ins, {"training": True}))
    want = normalization_reference([a.astype(np.float64) for a in ins],
                                   {"axis": 1, "epsilon": 1e-5, "momentum": 0.9,
                                    "training": True})
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_allclose(g, w, rtol=1e-4)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("shape,axis", [((3, 2, 3, 2), 1), ((4, 3, 2), 2), ((5, 3), 1)])
def test_gradients_match_finite_differences(shape, axis, training):
    """Through autograd and a plan, in float64: dx, dgamma, dbeta of y, and (training) the
    gradients through the mean and inv_variance outputs too (check_grad sums every output)."""
    check_grad("normalization", inputs(np.float64, shape, axis, seed=3),
               {"axis": axis, "training": training})


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=2, max_size=4), st.data(), st.booleans())
def test_gradients_match_finite_differences_on_random_shapes(shape, data, training):
    axis = data.draw(st.integers(0, len(shape) - 1))
    assume(not training or np.prod(shape) // shape[axis] >= 2)
    check_grad("normalization", inputs(np.float64, tuple(shape), axis, seed=len(shape)),
               {"axis": axis, "training": training})


def test_a_training_batch_needs_two_values_per_channel():
    with pytest.raises(ValueError, match=r"normalization: training needs more than 1 value per "
                                         r"channel, got x %in0 \(f32\[1,3,1,1\]\)"):
        make_node(Case("normalization", inputs(np.float32, (1, 3, 1, 1), 1), {"training": True}))


def test_training_with_eps_0_is_refused_as_by_torch():
    """A constant channel divides by sqrt(0 + eps): PyTorch refuses eps <= 0 in training
    ("batch_norm eps must be positive during training"); miniflow returned NaN. Eval mode keeps
    eps = 0, as PyTorch's."""
    bn = nn.BatchNorm1d(2, eps=0.0)
    x = mf.tensor(np.ones((3, 2), np.float32))
    with pytest.raises(ValueError, match=r"batch_norm: eps must be positive during training, "
                                         r"got 0.0"):
        bn(x)
    bn.eval()
    np.testing.assert_array_equal(bn(x).numpy(), np.ones((3, 2), np.float32))


@pytest.mark.parametrize("change,error,message", [
    (lambda a: a.__setitem__(1, a[1][:2]), ValueError,
     r"normalization: moving_mean %in1 \(f32\[2\]\) must have shape \[3\]"),
    (lambda a: a.__setitem__(3, a[3].astype(np.float16)), TypeError,
     r"normalization: moving_mean %in1 \(f32\[3\]\), moving_variance %in2 \(f32\[3\]\), "
     r"gamma %in3 \(f16\[3\]\), beta %in4 \(f32\[3\]\) must share one dtype \(all float32, "
     r"or all float16 as x\); cast them with .to\(\) so they match"),
    (lambda a: a.__setitem__(1, a[1].astype(np.float64)), TypeError,
     r"normalization: moving_mean %in1 \(f64\[3\]\) must be float32 or float16 for x of dtype "
     r"float16 \(OneFlow's parameter dtype, or x's own as in PyTorch\); make the layer with "
     r"dtype=float32 or dtype=float16, or cast it with .to\(miniflow.float32\)"),
    (lambda a: a.__setitem__(2, a[2].astype(np.int64)), TypeError,
     r"normalization: moving_variance %in2 \(i64\[3\]\) must be float32 or float16"),
    (lambda a: a.__setitem__(0, a[0].reshape(-1)), ValueError,
     r"normalization: x must have at least 2 dims"),
])
def test_bad_parameters_name_the_input(change, error, message):
    ins = inputs(np.float16, (2, 3, 2, 2), 1)
    change(ins)
    with pytest.raises(error, match=message):
        make_node(Case("normalization", ins, {"training": True}))


def test_bad_attributes():
    ins = inputs(np.float32, (2, 3, 2, 2), 1)
    with pytest.raises(ValueError, match=r"momentum \(OneFlow's: the weight of the old moving "
                                         r"value, 1 - PyTorch's momentum\) must be in \[0, 1\]"):
        make_node(Case("normalization", ins, {"momentum": 1.5}))
    with pytest.raises(ValueError, match=r"normalization: axis=4 is out of range"):
        make_node(Case("normalization", ins, {"axis": 4}))
    with pytest.raises(TypeError, match=r"increment: counter .* must be an int64 tensor of one"):
        make_node(Case("increment", [np.zeros(2, np.int64)], {}))


@needs_torch
@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (7, 5), (2, 3, 4)])
def test_kernels_match_torch_in_float64(shape):
    """The kernels against ``F.batch_norm`` (training: y and the running statistics; eval: y)
    and ``torch.autograd`` (dx, dgamma, dbeta), in float64 to 1e-5."""
    r = np.random.default_rng(1)
    c = shape[1]
    x, dy = r.standard_normal(shape) * 3 + 1, r.standard_normal(shape)
    mm, gamma, beta = r.standard_normal((3, c))
    mv = r.uniform(0.5, 2.0, c)
    tx, tg, tb = (torch.tensor(a, requires_grad=True) for a in (x, gamma, beta))
    tmm, tmv = torch.tensor(mm), torch.tensor(mv)
    ty = F.batch_norm(tx, tmm, tmv, tg, tb, training=True, momentum=0.1, eps=1e-5)
    tgx, tgg, tgb = torch.autograd.grad(ty, (tx, tg, tb), torch.tensor(dy))
    y, mean, inv, new_mm, new_mv = run(Case("normalization", [x, mm, mv, gamma, beta],
                                            {"momentum": 0.9, "training": True}))
    gd, bd, dx = run(Case("normalization_grad", [x, dy, mean, inv, gamma], {}))
    for mine, theirs in ((y, ty.detach()), (new_mm, tmm), (new_mv, tmv), (dx, tgx), (gd, tgg),
                         (bd, tgb)):
        np.testing.assert_allclose(mine, theirs.numpy(), rtol=1e-5, atol=1e-5)
    (ye,) = run(Case("normalization", [x, mm, mv, gamma, beta], {"training": False}))
    te = F.batch_norm(*(torch.tensor(a) for a in (x, mm, mv, gamma, beta)), training=False,
                      eps=1e-5)
    np.testing.assert_allclose(ye, te.numpy(), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- nn.BatchNorm2d
def _bn_pair(c=3, seed=0):
    """A trained-looking nn.BatchNorm2d and torch's with the same running statistics."""
    r = np.random.default_rng(seed)
    bn = nn.BatchNorm2d(c)
    bn.load_state_dict({"weight": r.uniform(0.5, 2, c), "bias": r.standard_normal(c),
                        "running_mean": r.standard_normal(c), "running_var": r.uniform(0.5, 2, c),
                        "num_batches_tracked": np.array(5)})
    return bn


@needs_torch
def test_track_running_stats_turned_off_after_construction_updates_nothing_as_torch():
    """PyTorch's ``_BatchNorm.forward``: with ``track_running_stats = False`` set after
    construction, a training call passes no running statistics to ``F.batch_norm`` (batch
    statistics, no buffer changes); eval still uses the running statistics. A compiled graph
    recompiles when the flag changes."""
    bn = _bn_pair()
    ref = torch.nn.BatchNorm2d(3).double()
    ref.load_state_dict({k: torch.from_numpy(v.astype(np.float64) if v.dtype.kind == "f" else v)
                         for k, v in bn.state_dict().items()})
    x = np.random.default_rng(1).standard_normal((4, 3, 5, 5)).astype(np.float32)
    g = EvalGraph(bn)
    g(x)  # compiled tracking: this call updates the running statistics
    before = bn.state_dict()
    ref(torch.from_numpy(x.astype(np.float64)))
    bn.track_running_stats = ref.track_running_stats = False
    for training in (True, False):
        bn.train(training), ref.train(training)
        out = g(x).numpy()
        want = ref(torch.from_numpy(x.astype(np.float64))).detach().numpy()
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
        for k, v in bn.state_dict().items():
            np.testing.assert_array_equal(v, before[k], err_msg=k)
            np.testing.assert_allclose(v, ref.state_dict()[k].numpy(), rtol=1e-6, err_msg=k)
    assert g.compile_count == 3  # tracking-train, then untracked train and eval
    assert list(bn.state_dict()) == list(ref.state_dict())
    bn.track_running_stats = True
    bn.train()
    g(x)
    assert int(bn.num_batches_tracked.item()) == 7 and g.compile_count == 4
    assert not np.array_equal(bn.running_mean.numpy(), before["running_mean"])


def test_track_running_stats_turned_on_for_a_module_made_without_it_tracks_nothing():
    bn = nn.BatchNorm2d(2, track_running_stats=False)
    bn.track_running_stats = True  # PyTorch: no buffers to update, batch statistics in both modes
    x = np.random.default_rng(2).standard_normal((3, 2, 4, 4)).astype(np.float32)
    g = EvalGraph(bn)
    y_train = g(x).numpy()
    bn.eval()
    np.testing.assert_array_equal(g(x).numpy(), y_train)
    assert list(bn.state_dict()) == ["weight", "bias"]


@needs_torch
@pytest.mark.parametrize("strict", [True, False])
def test_a_state_dict_without_num_batches_tracked_loads(strict):
    """Checkpoints of PyTorch before 0.4.1 (and torchvision models made from them) have no
    ``num_batches_tracked``: PyTorch's ``_BatchNorm._load_from_state_dict`` loads them, strict
    or not, the counter keeping its value (0 in a new model)."""
    sd = _bn_pair().state_dict()
    del sd["num_batches_tracked"]
    bn, ref = nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
    bn.load_state_dict(sd, strict=strict)
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=strict)
    for k, v in ref.state_dict().items():
        np.testing.assert_array_equal(bn.state_dict()[k], v.numpy(), err_msg=k)
    assert int(bn.num_batches_tracked.item()) == 0
    bn.num_batches_tracked = np.array(9)
    ref.num_batches_tracked.fill_(9)
    bn.load_state_dict(sd, strict=strict)
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=strict)
    assert int(bn.num_batches_tracked.item()) == int(ref.num_batches_tracked) == 9
    del sd["running_var"]
    with pytest.raises(KeyError, match=r"missing keys \['running_var'\]"):
        nn.BatchNorm2d(3).load_state_dict(sd)


@needs_torch
@pytest.mark.parametrize("shape", [(0, 3, 4, 4), (2, 3, 0, 4), (2, 3, 4, 0)], ids=str)
def test_an_empty_input_in_training_mode_updates_no_statistics_as_torch(shape):
    """PyTorch's ``batch_norm`` returns early for an input without elements (no statistics, no
    running-statistics update; ``num_batches_tracked`` still counts the call); gradients of
    weight and bias are zeros."""
    class Step(nn.Graph):
        def __init__(self, bn):
            super().__init__()
            self.bn = bn
            self.add_optimizer(mf.optim.SGD(bn.parameters(), lr=0.5))

        def build(self, x):
            y = self.bn(x)
            loss = y.sum()
            loss.backward()
            return y

    bn = _bn_pair()
    ref = torch.nn.BatchNorm2d(3)
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in bn.state_dict().items()})
    before = bn.state_dict()
    x = np.zeros(shape, np.float32)
    assert bn(mf.tensor(x)).shape == tuple(ref(torch.from_numpy(x)).shape) == shape
    assert Step(bn)(x).shape == shape
    ref(torch.from_numpy(x))
    for k, v in bn.state_dict().items():
        np.testing.assert_array_equal(v, ref.state_dict()[k].numpy(), err_msg=k)
        if k != "num_batches_tracked":
            np.testing.assert_array_equal(v, before[k], err_msg=k)
    assert int(bn.num_batches_tracked.item()) == 5 + 2  # the eager call and the graph's


# ----------------------------------------------------------------------------- nn.BatchNorm1d
def _bn1d_oracle(x, mean, var, gamma, beta, momentum=0.1, eps=1e-5):
    """PyTorch's documented BatchNorm1d training step in float64: ``y`` and the new running
    statistics (statistics over N and L; the running variance unbiased)."""
    axes = (0,) if x.ndim == 2 else (0, 2)
    shape = (1, -1) if x.ndim == 2 else (1, -1, 1)
    mu, v = x.mean(axes), x.var(axes)
    m = x.size // x.shape[1]
    y = (x - mu.reshape(shape)) / np.sqrt(v.reshape(shape) + eps)
    y = y * gamma.reshape(shape) + beta.reshape(shape)
    return (y, (1 - momentum) * mean + momentum * mu,
            (1 - momentum) * var + momentum * v * m / (m - 1))


@pytest.mark.parametrize("shape", [(8, 3), (4, 3, 5)], ids=str)
def test_batchnorm1d_trains_as_the_float64_oracle_and_evaluates_with_running_stats(shape):
    r = np.random.default_rng(3)
    bn = nn.BatchNorm1d(3, momentum=0.2)
    gamma, beta = r.uniform(0.5, 2, 3), r.standard_normal(3)
    bn.load_state_dict({"weight": gamma, "bias": beta, "running_mean": np.zeros(3),
                        "running_var": np.ones(3), "num_batches_tracked": np.array(0)})
    g = EvalGraph(bn)
    mean, var = np.zeros(3), np.ones(3)
    for step in range(3):
        x = (r.standard_normal(shape) * 2 + 1).astype(np.float32)
        want, mean, var = _bn1d_oracle(x.astype(np.float64), mean, var, gamma, beta, 0.2)
        np.testing.assert_allclose(g(x).numpy(), want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(bn.running_mean.numpy(), mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(bn.running_var.numpy(), var, rtol=1e-5, atol=1e-6)
    assert int(bn.num_batches_tracked.item()) == 3
    bn.eval()
    x = r.standard_normal(shape).astype(np.float32)
    s = (1, -1) if len(shape) == 2 else (1, -1, 1)
    want = (x - mean.reshape(s)) / np.sqrt(var.reshape(s) + 1e-5) * gamma.reshape(s) \
        + beta.reshape(s)
    np.testing.assert_allclose(g(x).numpy(), want, rtol=1e-4, atol=1e-5)


@needs_torch
@pytest.mark.parametrize("shape", [(8, 3), (4, 3, 5)], ids=str)
def test_batchnorm1d_matches_torch_and_loads_its_state_dict(shape):
    ref = torch.nn.BatchNorm1d(3)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 2.0), ref.bias.normal_()
    bn = nn.BatchNorm1d(3)
    bn.load_state_dict({k: v.numpy() for k, v in ref.state_dict().items()})
    assert list(bn.state_dict()) == list(ref.state_dict())
    g = EvalGraph(bn)
    r = np.random.default_rng(4)
    for training in (True, True, False):
        bn.train(training), ref.train(training)
        x = r.standard_normal(shape).astype(np.float32)
        want = ref(torch.from_numpy(x)).detach().numpy()
        np.testing.assert_allclose(g(x).numpy(), want, rtol=1e-5, atol=1e-5)
    for k, v in ref.state_dict().items():
        np.testing.assert_allclose(bn.state_dict()[k], v.numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=k)


def test_batchnorm1d_refuses_other_ranks_and_one_value_per_channel():
    g = EvalGraph(nn.BatchNorm1d(3))
    with pytest.raises(ValueError, match=r"BatchNorm1d: expected a 2-D input \[N, C\] or a 3-D "
                                         r"input \[N, C, L\], got shape \[2, 3, 4, 4\]"):
        g(np.zeros((2, 3, 4, 4), np.float32))
    with pytest.raises(ValueError, match=r"BatchNorm1d\(3\): the input has 4 channels"):
        EvalGraph(nn.BatchNorm1d(3))(np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match="value per channel"):
        EvalGraph(nn.BatchNorm1d(3))(np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match="BatchNorm1d: num_features must be a positive"):
        nn.BatchNorm1d(0)


def test_batchnorm1d_under_amp_runs_in_float16_between_two_matmuls():
    """The same op, so the same AMP treatment: gray between two white matmuls, the
    normalization runs in float16 (OneFlow's rule), its statistics float32 (no-cast)."""
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))
    g = EvalGraph(model)
    g.config.enable_amp(True)
    g(np.random.default_rng(5).standard_normal((6, 4)).astype(np.float32))
    (bn,) = [n for n in g.ir.nodes if n.op.name == "normalization"]
    assert bn.inputs[0].dtype is mf.float16 and bn.outputs[0].dtype is mf.float16
    assert [v.dtype for v in bn.inputs[1:]] == [mf.float32] * 4


def test_a_channel_mismatch_says_what_to_do():
    """PyTorch's message ("running_mean should contain 8 elements not 16") names the sizes only;
    miniflow's names the layer, the shape, and the two fixes."""
    with pytest.raises(ValueError, match=r"BatchNorm2d\(16\): the input has 8 channels in dim 1 "
                                         r"\(shape \[2, 8, 4, 4\]\), expected 16: make the layer "
                                         r"BatchNorm2d\(8\), or check the layer before it"):
        EvalGraph(nn.BatchNorm2d(16))(np.zeros((2, 8, 4, 4), np.float32))


# ----------------------------------------------------------------------------- half parameters
HALF = {"float16": (mf.float16, np.float16, 4e-3), "bfloat16": (mf.bfloat16, None, 2e-2)}
"""miniflow dtype, NumPy dtype (bfloat16's: ``mf.bfloat16.np``) and the tolerance of a half
batch norm against PyTorch's (one or two roundings of the half result apart)."""
HALF_LAYERS = [(nn.BatchNorm1d, (6, 7)), (nn.BatchNorm1d, (4, 7, 5)),
               (nn.BatchNorm2d, (4, 3, 5, 5))]


def _half_close(got, want, tol, what):
    """``got`` (a miniflow half array) against ``want`` (torch's, same dtype) at ``tol`` of the
    larger of 1 and ``want``'s magnitude."""
    got, want = np.asarray(got, np.float32), want.detach().float().numpy()
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()),
                               err_msg=what)


def _half_pair(cls, c, name, seed=0):
    """``cls(c, dtype=name)`` and torch's, with the same random weight, bias and running
    statistics of that dtype."""
    mdt, _, _ = HALF[name]
    tdt = getattr(torch, name)
    r = np.random.default_rng(seed)
    state = {"weight": r.uniform(0.5, 2.0, c), "bias": r.standard_normal(c),
             "running_mean": r.standard_normal(c), "running_var": r.uniform(0.5, 2.0, c)}
    state = {k: v.astype(mdt.np) for k, v in state.items()}
    bn, ref = cls(c, dtype=mdt), getattr(torch.nn, cls.__name__)(c, dtype=tdt)
    bn.load_state_dict({**state, "num_batches_tracked": np.array(0)})
    with torch.no_grad():
        for k, v in state.items():
            getattr(ref, k).copy_(torch.from_numpy(v.astype(np.float32)).to(tdt))
    return bn, ref


@needs_torch
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("name", list(HALF))
@pytest.mark.parametrize("cls,shape", HALF_LAYERS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_half_batchnorm_matches_torch_with_parameters_and_statistics_of_its_dtype(cls, shape,
                                                                                  name, graph):
    """``BatchNorm1d/2d(C, dtype=float16 / bfloat16)`` on an input of that dtype (the user's
    report: the first call raised 'moving_mean (f16[7]) must be float32'): three training
    steps (y, and the running statistics stored in the half dtype), then eval, against
    ``torch.nn.BatchNorm*d(C, dtype=...)`` on the CPU (statistics in float32, running statistics
    rounded to the buffer's dtype), eagerly and in an ``nn.Graph``."""
    mdt, _, tol = HALF[name]
    bn, ref = _half_pair(cls, shape[1], name)
    run_bn = EvalGraph(bn) if graph else (lambda x: bn(mf.tensor(x, dtype=mdt)))
    r = np.random.default_rng(1)
    for training in (True, True, True, False):
        bn.train(training), ref.train(training)
        x = (r.standard_normal(shape) * 2 + 1).astype(mdt.np)
        y = run_bn(x)
        assert y.dtype is mdt
        _half_close(y.numpy(), ref(torch.from_numpy(x.astype(np.float32)).to(ref.weight.dtype)),
                    tol, f"y (training={training})")
        for k in ("running_mean", "running_var"):
            assert getattr(bn, k).dtype is mdt
            _half_close(getattr(bn, k).numpy(), getattr(ref, k), tol, k)
    assert int(bn.num_batches_tracked.item()) == int(ref.num_batches_tracked) == 3


class _Shifted(nn.Module):
    """``bn(x + shift)`` with a zero parameter ``shift``: after an SGD step with lr 1 it holds
    ``-dx``, rounded once to its dtype."""

    def __init__(self, bn, shape, dt):
        super().__init__()
        self.bn = bn
        self.shift = nn.Parameter(np.zeros(shape, dt))

    def forward(self, x):
        return self.bn(x + self.shift)


@needs_torch
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", list(HALF))
@pytest.mark.parametrize("cls,shape", HALF_LAYERS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_half_batchnorm_gradients_match_torch_autograd_in_a_training_step(cls, shape, name,
                                                                          training):
    """Two SGD steps (lr 1) of ``loss = sum(bn(x + shift) * dy)`` in an ``nn.Graph``, all in the
    half dtype: ``-dx`` (``shift`` after each step, reset to zero), weight and bias after each
    update, and the running statistics, against ``torch.autograd.grad`` of PyTorch's half layer
    and the same updates; training and eval mode (the eval-mode rule uses the running
    statistics)."""
    mdt, _, tol = HALF[name]
    bn, ref = _half_pair(cls, shape[1], name, seed=2)
    bn.train(training), ref.train(training)
    model = _Shifted(bn, shape, mdt.np)
    dy = np.linspace(-1, 1, int(np.prod(shape))).reshape(shape).astype(mdt.np)

    class Step(nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(mf.optim.SGD(model.parameters(), lr=1.0))

        def build(self, x):
            y = self.model(x)
            (y * mf.tensor(dy)).sum().backward()
            return y

    step, r, tdt = Step(), np.random.default_rng(3), ref.weight.dtype
    for _ in range(2):
        x = (r.standard_normal(shape) * 2 + 1).astype(mdt.np)
        tx = torch.from_numpy(x.astype(np.float32)).to(tdt).requires_grad_()
        ty = ref(tx)
        gx, gw, gb = torch.autograd.grad(ty, (tx, ref.weight, ref.bias),
                                         torch.from_numpy(dy.astype(np.float32)).to(tdt))
        _half_close(step(x).numpy(), ty, tol, "y")
        _half_close(model.shift.numpy(), -gx, tol, "-dx")
        with torch.no_grad():
            ref.weight -= gw
            ref.bias -= gb
        for k in ("weight", "bias", "running_mean", "running_var"):
            assert getattr(bn, k).dtype is mdt
            _half_close(getattr(bn, k).numpy(), getattr(ref, k), tol, k)
        model.load_state_dict({**model.state_dict(), "shift": np.zeros(shape, mdt.np)})


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_float64_statistics_for_a_float16_input_name_the_op_the_dtypes_and_the_fix(graph):
    """Half statistics must be x's own half dtype (or float32): a float64 layer given a float16
    input is refused when the graph is built, naming the op, both dtypes and the cast."""
    bn = nn.BatchNorm1d(7, dtype=mf.float64)
    x = np.zeros((4, 7), np.float16)
    message = (r"normalization: moving_mean %[\w.]+ \(f64\[7\]\) must be float32 or float16 "
               r"for x of dtype float16 .*make the layer with dtype=float32 or dtype=float16, or "
               r"cast it with .to\(miniflow.float32\)")
    with pytest.raises(TypeError, match=message):
        EvalGraph(bn)(x) if graph else bn(mf.tensor(x))


def test_layer_norm_names_an_input_dtype_other_than_its_parameters():
    """nn.LayerNorm (and functional.layer_norm) given an input of another dtype than its weight
    and bias: a TypeError at build time naming both dtypes and shapes and the ways out; it was
    the op's "gamma %m.weight (f32[4]) must have x's dtype float64 (cast it with .to())", which
    asked to cast a module's parameter."""
    x = np.ones((2, 4), np.float32)
    with pytest.raises(TypeError, match=r"layer_norm: input float64\[2, 4\] and weight "
                                        r"float32\[4\] have different dtypes; cast the input "
                                        r"with \.to\(miniflow\.float32\), or make the LayerNorm "
                                        r"with dtype=miniflow\.float64"):
        EvalGraph(nn.LayerNorm(4))(x.astype(np.float64))
    with pytest.raises(TypeError, match=r"input int64\[2, 4\] and weight float32\[4\] have "
                                        r"different dtypes; cast the input with "
                                        r"\.to\(miniflow\.float32\)$"):
        nn.LayerNorm(4)(mf.tensor(np.ones((2, 4), np.int64)))
    with pytest.raises(TypeError, match=r"input float32\[2, 4\] and bias float16\[4\]"):
        nn.functional.layer_norm(mf.tensor(x), (4,), None, mf.tensor(np.zeros(4, np.float16)))
    out = EvalGraph(nn.LayerNorm(4, dtype=mf.float64))(x.astype(np.float64))
    assert out.dtype == mf.float64


HALF_STATISTICS = [("normalization", (3, 4, 5), {"axis": 1, "training": True}),
                   ("layer_norm", (4, 3, 8), {"begin_norm_axis": 1, "begin_params_axis": 1})]


@pytest.mark.parametrize("dt", [np.float16, bfloat16.np], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("op,shape,attrs", HALF_STATISTICS, ids=[c[0] for c in HALF_STATISTICS])
def test_gradients_through_the_float32_statistics_of_a_half_x_match_float64(op, shape, attrs,
                                                                              dt):
    """A half ``x`` has float32 ``mean`` / ``inv_variance`` (OneFlow's): the gradient through
    them was built as ``x - mean`` of a half and a float32 operand and refused at build time.
    Every gradient (through y and both statistics, ``gradient_graph`` weighting each output)
    matches the same graph in float64 on the same values."""
    r = np.random.default_rng(5)
    x = (1.0 + r.standard_normal(shape)).astype(dt)
    if op == "normalization":
        c = shape[1]
        params = [np.zeros(c, np.float32), np.ones(c, np.float32),
                  r.uniform(0.5, 1.5, c).astype(np.float32),
                  r.standard_normal(c).astype(np.float32)]
    else:
        params = [r.uniform(0.5, 1.5, shape[1:]).astype(dt),
                  r.standard_normal(shape[1:]).astype(dt)]
    half = gradient_graph(op, [x, *params], attrs)[1].run([])
    wide = gradient_graph(op, [a.astype(np.float64) for a in (x, *params)], attrs)[1].run([])
    assert len(half) == len(wide) > 2
    for got, want in zip(half[1:], wide[1:]):
        scale = np.abs(want).max()
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=0,
                                   atol=(0.02 if dt == np.float16 else 0.1) * scale)


RMS_CASES = [((6,), None, True), ((4, 6), 1e-3, True), ((6,), 0.5, False)]


@needs_torch
@pytest.mark.parametrize("shape,eps,affine", RMS_CASES)
def test_rms_norm_gives_pytorchs_outputs_and_gradients(shape, eps, affine):
    """nn.RMSNorm loaded with torch.nn.RMSNorm's state dict: its outputs (float32, and float16
    input and weight, normalized in float32 and rounded, as PyTorch's composite) and, through
    one SGD step at lr 1 in a graph, the gradients of the input and the weight."""
    r = np.random.default_rng(3)
    x = r.standard_normal((3, 4, 6)).astype(np.float32) * 2.0
    ref = torch.nn.RMSNorm(shape, eps=eps, elementwise_affine=affine)
    if affine:
        with torch.no_grad():
            ref.weight.copy_(torch.linspace(0.5, 1.5, math.prod(shape)).reshape(shape))
    layer = nn.RMSNorm(shape, eps=eps, elementwise_affine=affine)
    assert repr(layer) == repr(ref)
    layer.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    want = ref(torch.tensor(x)).detach().numpy()
    np.testing.assert_allclose(layer(mf.tensor(x)).numpy(), want, rtol=1e-6, atol=1e-6)
    half = nn.RMSNorm(shape, eps=eps, elementwise_affine=affine, dtype=mf.float16)
    half.load_state_dict({k: np.asarray(v, np.float16) for k, v in layer.state_dict().items()})
    want = copy.deepcopy(ref).half()(torch.tensor(x).half()).detach().numpy()
    np.testing.assert_array_equal(half(mf.tensor(x.astype(np.float16))).numpy(), want)

    class Step(nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = nn.Module()
            self.m.x, self.m.norm = nn.Parameter(x), layer
            self.add_optimizer(mf.optim.SGD(self.m.parameters(), lr=1.0))

        def build(self):
            loss = (self.m.norm(self.m.x) * mf.tensor(x)).sum()
            loss.backward()
            return loss

    tx = torch.tensor(x, requires_grad=True)
    (ref(tx) * torch.tensor(x)).sum().backward()
    step = Step()
    step()
    np.testing.assert_allclose(x - step.m.x.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-5)
    if affine:
        w = ref.weight.detach().numpy()
        np.testing.assert_allclose(w - layer.weight.numpy(), ref.weight.grad.numpy(),
                                   rtol=1e-5, atol=1e-5)


def test_rms_norm_under_amp_keeps_its_mean_of_squares_float32():
    """Under AMP the mean of squares stays float32 (its chain ends in rsqrt, in no AMP list):
    between two float16 matmuls, activations above 256 (squares beyond float16's 65504) would
    make it inf and the output 0. The squares and their sum are float32, the normalized output
    float16 (between float16 ops, as a gray layer_norm), and the result is the float32 graph's
    to float16's precision."""
    class Net(nn.Graph):
        def __init__(self, amp):
            super().__init__()
            self.a, self.norm, self.b = nn.Linear(8, 8), nn.RMSNorm(8), nn.Linear(8, 4)
            self.config.enable_amp(amp)

        def build(self, x):
            return self.b(self.norm(self.a(x)))

    mf.manual_seed(0)
    net = Net(True)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32) * 500.0
    fp32 = Net(False)
    fp32.a, fp32.norm, fp32.b = net.a, net.norm, net.b
    np.testing.assert_allclose(net(x).numpy(), fp32(x).numpy(), rtol=0.02, atol=0.02)
    (total,) = [n for n in net.ir.nodes if n.op.name == "reduce_sum"]
    assert total.inputs[0].dtype is mf.float32 and total.outputs[0].dtype is mf.float32
    matmuls = [n for n in net.ir.nodes if n.op.name == "matmul"]
    assert [n.inputs[0].dtype for n in matmuls] == [mf.float16, mf.float16]


def test_rms_norm_errors_name_the_layer_and_what_is_wrong():
    with pytest.raises(ValueError, match=r"rms_norm: Given normalized_shape=\[5\], expected "
                                         r"input with shape \[\*, 5\], but got input of size"
                                         r"\[4, 6\]"):
        nn.RMSNorm(5)(mf.tensor(np.zeros((4, 6), np.float32)))
    with pytest.raises(TypeError, match=r"rms_norm: input float64\[2, 4\] and weight "
                                        r"float32\[4\] have different dtypes; cast the input "
                                        r"with \.to\(miniflow\.float32\), or make the RMSNorm "
                                        r"with dtype=miniflow\.float64"):
        EvalGraph(nn.RMSNorm(4))(np.ones((2, 4)))
    with pytest.raises(ValueError, match=r"RMSNorm: eps must be >= 0 or None, got -1"):
        nn.RMSNorm(4, eps=-1)
    with pytest.raises(ValueError, match=r"RMSNorm: normalized_shape must be a positive int"):
        nn.RMSNorm(0)


class _BatchStatistics(nn.Graph):
    """``sum(w * F.batch_norm(x, None, None, gamma, beta, training=True))`` of a parameter x,
    one SGD step of lr 1: x moves by minus its gradient."""

    def __init__(self, x, gamma, beta):
        super().__init__()
        self.m = nn.Module()
        self.m.x = nn.Parameter(x.copy())
        self.gamma, self.beta = gamma, beta
        self.add_optimizer(mf.optim.SGD(self.m.parameters(), lr=1.0))

    def build(self, w):
        y = nn.functional.batch_norm(self.m.x, None, None, self.gamma, self.beta, training=True)
        (y * w).sum().backward()
        return y


def test_batch_norm_without_running_statistics_trains_on_the_batch_statistics():
    """``F.batch_norm(x, None, None, training=True)`` (PyTorch's batch statistics alone) was a
    ValueError asking for buffers. It normalizes by the batch mean and biased variance over
    every dim but 1, eagerly and inside ``build``, with the batch-norm gradient (float64
    oracles); a half input is computed in float32; PyTorch's errors otherwise."""
    r = np.random.default_rng(4)
    x = r.standard_normal((3, 2, 5)) * 3.0 + 1.0
    gamma, beta, w = r.uniform(0.5, 2.0, 2), r.standard_normal(2), r.standard_normal(x.shape)
    mu, var = x.mean((0, 2), keepdims=True), x.var((0, 2), keepdims=True)
    xhat = (x - mu) / np.sqrt(var + 1e-5)
    want = xhat * gamma[:, None] + beta[:, None]
    F_ = nn.functional
    eager = F_.batch_norm(mf.tensor(x), None, None, mf.tensor(gamma), mf.tensor(beta), True)
    np.testing.assert_allclose(eager.numpy(), want, rtol=1e-12, atol=1e-12)
    step = _BatchStatistics(x, mf.tensor(gamma), mf.tensor(beta))
    np.testing.assert_allclose(step(w).numpy(), want, rtol=1e-12, atol=1e-12)
    grad = gamma[:, None] / np.sqrt(var + 1e-5) * (
        w - w.mean((0, 2), keepdims=True) - xhat * (w * xhat).mean((0, 2), keepdims=True))
    np.testing.assert_allclose(x - step.m.x.numpy(), grad, rtol=1e-9, atol=1e-12)
    half = F_.batch_norm(mf.tensor(x, dtype=mf.float16), None, None, training=True)
    assert half.dtype is mf.float16
    np.testing.assert_allclose(half.numpy(), xhat.astype(np.float16), rtol=2e-3, atol=2e-3)
    t = mf.tensor(x)
    with pytest.raises(RuntimeError, match="running_mean must be defined in evaluation mode"):
        F_.batch_norm(t, None, None)
    with pytest.raises(ValueError, match="must either both be None or neither be None"):
        F_.batch_norm(t, mf.zeros(2, dtype=mf.float64), None, training=True)
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
        F_.batch_norm(t[:1, :, :1], None, None, training=True)
