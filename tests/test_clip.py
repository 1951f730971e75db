"""Gradient clipping configured on the optimizer (``clip_grad_max_norm``, ``clip_grad_norm_type``,
OneFlow's param-group keys): computed in the graph on the unscaled master gradients, equal to a
NumPy float64 oracle of ``torch.nn.utils.clip_grad_norm_`` (and to PyTorch itself when
installed); a step the grad scaler skips clips nothing and changes nothing."""
import copy
import math

import numpy as np
import pytest

import miniflow as mf
from miniflow.experiments.mlp import TrainGraph, mlp
from miniflow.runtime.backend import get_backend

NORM_TYPES = [2.0, 1.0, math.inf, 3.0]


def _batch(seed=0, n=16):
    r = np.random.default_rng(seed)
    return r.random((n, 64), dtype=np.float32) * 4, r.integers(0, 10, n)


def _graphs(max_norm, norm_type, opt_cls=mf.optim.SGD, **kw):
    """Two graphs on copies of one model: without clipping, and with it."""
    mf.manual_seed(0)
    model = mlp((64, 32, 10))
    twin = copy.deepcopy(model)
    make = (lambda p, **c: opt_cls(p, lr=0.1, **c, **kw))
    plain = TrainGraph(model, make(model.parameters()))
    clipped = TrainGraph(twin, make(twin.parameters(), clip_grad_max_norm=max_norm,
                                    clip_grad_norm_type=norm_type))
    return plain, clipped


def grads_of(graph) -> dict:
    """The gradient results of the graph's last call (variable name -> NumPy array)."""
    plan = next(reversed(graph.plans.values()))
    return {k: get_backend().to_numpy(plan.buffers[v]) for k, v in plan.graph.grads.items()}


def clip_oracle(grads: list, max_norm: float, norm_type: float) -> tuple:
    """``torch.nn.utils.clip_grad_norm_`` in NumPy float64: (total norm, clipped gradients)."""
    g64 = [g.astype(np.float64) for g in grads]
    if norm_type == math.inf:
        total = max(np.abs(g).max() for g in g64)
    else:
        norms = [np.sum(np.abs(g) ** norm_type) ** (1 / norm_type) for g in g64]
        total = np.sum(np.array(norms) ** norm_type) ** (1 / norm_type)
    coef = min(max_norm / (total + 1e-6), 1.0)
    return total, [g * coef for g in g64]


@pytest.mark.parametrize("norm_type", NORM_TYPES, ids=lambda p: f"p{p:g}")
@pytest.mark.parametrize("max_norm", [0.05, 1e4], ids=["clips", "below"])
def test_clipped_gradients_equal_the_numpy_oracle(norm_type, max_norm):
    plain, clipped = _graphs(max_norm, norm_type)
    x, y = _batch()
    before = {k: v for k, v in clipped.model.state_dict().items()}
    plain(x, y)
    clipped(x, y)
    raw, got = grads_of(plain), grads_of(clipped)
    names = list(raw)
    total, want = clip_oracle([raw[n] for n in names], max_norm, norm_type)
    assert (total > max_norm) == (max_norm == 0.05)
    for n, w in zip(names, want):
        np.testing.assert_allclose(got[n], w, rtol=1e-6, atol=1e-9, err_msg=n)
    for k, p in clipped.model.state_dict().items():  # SGD used the clipped gradient
        np.testing.assert_allclose(p, before[k] - 0.1 * got[f"model.{k}"], rtol=1e-6, atol=1e-7)
    assert clipped.ir.count_ops()["clip_grad_norm"] == 1


@pytest.mark.parametrize("norm_type", NORM_TYPES, ids=lambda p: f"p{p:g}")
def test_clipped_gradients_equal_torch_clip_grad_norm(norm_type):
    torch = pytest.importorskip("torch")
    plain, clipped = _graphs(0.05, norm_type)
    x, y = _batch(1)
    plain(x, y)
    clipped(x, y)
    raw, got = grads_of(plain), grads_of(clipped)
    params = [torch.nn.Parameter(torch.zeros(g.shape)) for g in raw.values()]
    for p, g in zip(params, raw.values()):
        p.grad = torch.from_numpy(g.copy())
    total = torch.nn.utils.clip_grad_norm_(params, 0.05, norm_type=norm_type)
    assert float(total) > 0.05
    for p, n in zip(params, raw):
        np.testing.assert_allclose(got[n], p.grad.numpy(), rtol=1e-6, atol=1e-9, err_msg=n)


def test_clipping_sees_the_unscaled_gradients():
    """With a loss scaler the clip acts on the gradients after unscaling: the same clipped
    gradients as without a scaler (the scale is a power of 2: unscaling is exact)."""
    _, clipped = _graphs(0.05, 2.0)
    _, scaled = _graphs(0.05, 2.0)
    scaled.set_grad_scaler(mf.amp.GradScaler(init_scale=2.0 ** 12))
    x, y = _batch(2)
    clipped(x, y)
    scaled(x, y)
    a, b = grads_of(clipped), grads_of(scaled)
    for n in a:
        np.testing.assert_allclose(b[n], a[n], rtol=1e-6, atol=1e-10, err_msg=n)


@pytest.mark.parametrize("opt_cls", [mf.optim.SGD, mf.optim.Adam, mf.optim.Adadelta])
def test_an_overflowing_amp_step_changes_nothing_clipping_included(opt_cls):
    """AMP with a dynamic scaler: a step whose gradients overflow is skipped before clipping can
    act: no weight and no optimizer state moves, the clip factor of that step is 1 (nothing
    clipped), the scale backs off; the next finite step clips."""
    kw = {"momentum": 0.9} if opt_cls is mf.optim.SGD else {}
    _, graph = _graphs(0.05, 2.0, opt_cls, **kw)
    graph.config.enable_amp(True)
    scaler = mf.amp.GradScaler(init_scale=2.0 ** 10)
    graph.set_grad_scaler(scaler)
    opt = graph._optimizers[0]
    x, y = _batch(3)
    graph(x, y)                                       # a finite step: clipped
    coef = _clip_factor(graph)
    assert 0 < coef < 1
    weights, state = graph.model.state_dict(), opt.state_dict()
    bad = x.copy()
    bad[0, 0] = np.inf
    graph(bad, y)
    assert scaler.found_inf and scaler.scale == 2.0 ** 9
    assert _clip_factor(graph) == 1.0                  # a skipped step clips nothing
    for k, v in graph.model.state_dict().items():
        np.testing.assert_array_equal(v, weights[k])
    for i, s in opt.state_dict()["state"].items():
        for k, v in s.items():
            np.testing.assert_array_equal(v, state["state"][i][k])
    assert not all(np.isfinite(g).all() for g in grads_of(graph).values())  # unclipped inf/NaN
    graph(x, y)
    assert not scaler.found_inf and 0 < _clip_factor(graph) < 1
    assert graph.compile_count == 1


def _clip_factor(graph) -> float:
    """The ``clip_coef`` output of the graph's ``clip_grad_norm`` node at its last call."""
    plan = next(reversed(graph.plans.values()))
    (node,) = [n for n in plan.graph.nodes if n.op.name == "clip_grad_norm"]
    return float(get_backend().to_numpy(plan.buffers[node.outputs[1]])[0])


def test_clipping_settings_are_hyper_parameters_that_recompile():
    plain, _ = _graphs(None, 2.0)
    opt = plain._optimizers[0]
    x, y = _batch()
    plain(x, y)
    assert "clip_grad_norm" not in plain.ir.count_ops() and opt.clip_grad is None
    opt.param_groups[0].update(clip_grad_max_norm=0.05, clip_grad_norm_type=math.inf)
    assert opt.clip_grad == (0.05, math.inf)
    plain(x, y)
    assert plain.compile_count == 2 and "norm_type=inf" in str(plain.ir)
    sd = opt.state_dict()
    assert sd["param_groups"][0]["clip_grad_max_norm"] == 0.05
    fresh = mf.optim.SGD(mlp((64, 32, 10)).parameters(), lr=0.1)
    old_style = copy.deepcopy(sd)
    for k in ("clip_grad_max_norm", "clip_grad_norm_type"):
        del old_style["param_groups"][0][k]              # a state dict without the keys loads
    fresh.load_state_dict(old_style)
    assert fresh.clip_grad is None
    fresh.load_state_dict(sd)
    assert fresh.clip_grad == (0.05, math.inf)


@pytest.mark.parametrize("kw, error, match", [
    ({"clip_grad_max_norm": 0.0}, ValueError, r"SGD: clip_grad_max_norm must be > 0 \(None: no "
                                              r"clipping\), got 0"),
    ({"clip_grad_max_norm": -1.0}, ValueError, r"SGD: clip_grad_max_norm must be > 0 \(None: no "
     r"clipping\), got -1.0"),                  # one message for 0 and below (it said [0, inf))
    ({"clip_grad_max_norm": float("inf")}, ValueError, r"clip_grad_max_norm must be finite"),
    ({"clip_grad_max_norm": "1"}, TypeError, r"SGD: clip_grad_max_norm must be a real number"),
    ({"clip_grad_max_norm": 1.0, "clip_grad_norm_type": 0}, ValueError,
     r"SGD: clip_grad_norm_type must be > 0 \(1, 2, float\('inf'\) or any p > 0\), got 0"),
    ({"clip_grad_max_norm": 1.0, "clip_grad_norm_type": float("nan")}, ValueError,
     r"clip_grad_norm_type must be > 0"),
    ({"clip_grad_max_norm": 1.0, "clip_grad_norm_type": "2"}, TypeError,
     r"SGD: clip_grad_norm_type must be a real number, got '2'"),
])
def test_bad_clipping_settings_are_refused(kw, error, match):
    params = list(mlp((4, 3)).parameters())
    with pytest.raises(error, match=match):
        mf.optim.SGD(params, lr=0.1, **kw)
    opt = mf.optim.SGD(params, lr=0.1)
    with pytest.raises(error, match=match):
        opt.param_groups[0].update(kw)
    assert opt.clip_grad is None and opt.version == 0
