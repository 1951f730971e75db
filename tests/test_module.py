"""``nn.Module``'s state dict against PyTorch's ``torch.nn.Module`` (``state_dict`` /
``load_state_dict`` docs): a module or parameter reachable under two names is listed under both
(``parameters()`` yields it once) and a PyTorch checkpoint of such a model loads strictly; a value
of another real dtype is cast as ``Tensor.copy_`` casts it, and only what cannot be cast is
refused (nothing is changed then)."""
from collections import OrderedDict

import numpy as np
import pytest

import miniflow as mf
from miniflow import nn

try:
    import torch
except ImportError:   # torch is optional: its comparisons skip
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


def _shared(lib):
    """``net.a = net.b = Linear(2, 3)``, ``net.c``: a module holding ``a.weight`` too (a
    Parameter of two modules), ``net.d = Sequential(net.a)``; miniflow's (``lib=nn``) or torch's."""
    net = lib.Module()
    net.a = net.b = lib.Linear(2, 3)
    net.c = lib.Module()
    net.c.w = net.a.weight
    net.d = lib.Sequential(net.a)
    return net


EXPECTED = ["a.weight", "a.bias", "b.weight", "b.bias", "c.w", "d.0.weight", "d.0.bias"]


def test_a_module_under_two_names_is_listed_under_both_and_its_parameters_once():
    net = _shared(nn)
    assert list(net.state_dict()) == EXPECTED
    assert [n for n, _ in net.named_parameters()] == ["a.weight", "a.bias"]
    assert len(list(net.parameters())) == 2
    sd = net.state_dict()
    sd["b.weight"] = sd["b.weight"] + 1  # both names reach one tensor: the last one loaded wins
    sd["d.0.weight"] = sd["c.w"] = sd["b.weight"]
    net.load_state_dict(sd)
    np.testing.assert_array_equal(net.a.weight.numpy(), sd["b.weight"])
    with pytest.raises(KeyError, match=r"missing keys \['b.bias', 'b.weight'"):
        net.load_state_dict({k: v for k, v in sd.items() if not k.startswith("b.")})


@needs_torch
def test_a_pytorch_checkpoint_of_a_model_with_a_shared_module_loads_strictly():
    ref = _shared(torch.nn)
    assert list(ref.state_dict()) == EXPECTED
    assert len(list(ref.parameters())) == 2
    net = _shared(nn)
    net.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()}, strict=True)
    x = np.random.default_rng(0).standard_normal((5, 2)).astype(np.float32)
    want = ref.d(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(net.d(mf.tensor(x)).numpy(), want, rtol=1e-6, atol=1e-6)


@needs_torch
@pytest.mark.parametrize("src", [np.float64, np.float16, "bfloat16", np.int32, np.bool_],
                         ids=str)
def test_a_value_of_another_real_dtype_is_cast_as_torch_copy_(src):
    """``torch.nn.Module.load_state_dict`` copies with ``Tensor.copy_``, which casts."""
    r = np.random.default_rng(1)
    w = (r.standard_normal((3, 2)) * 4).astype(mf.bfloat16.np if src == "bfloat16" else src)
    lin, ref = nn.Linear(2, 3), torch.nn.Linear(2, 3)
    bias = np.arange(3, dtype=np.float64) / 3
    lin.load_state_dict({"weight": w, "bias": bias})
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(w.astype(np.float32) if src == "bfloat16" else w))
        ref.bias.copy_(torch.from_numpy(bias))
    assert lin.weight.dtype is mf.float32
    np.testing.assert_array_equal(lin.weight.numpy(), ref.weight.detach().numpy())
    np.testing.assert_array_equal(lin.bias.numpy(), ref.bias.detach().numpy())


def test_a_float64_value_beyond_float16_loads_as_inf_into_a_float16_tensor():
    m = nn.Module()
    m.w = nn.Parameter(np.zeros(2, np.float16))
    m.load_state_dict({"w": np.array([1e6, 1 / 3])})
    assert m.w.numpy().tolist() == [np.inf, np.float16(1 / 3)]


@pytest.mark.parametrize("key,value,match", [
    ("weight", np.ones((3, 2), np.complex64), r"'weight' has dtype complex64 .*real numbers"),
    ("weight", np.array([["a", "b"]] * 3), r"'weight' has dtype <U1"),
    ("count", np.array(2.5), r"'count' holds 2.5, which the model's int64 cannot hold"),
    ("count", np.array(np.nan), r"'count' holds nan"),
    ("count", np.array(2 ** 64 - 1, np.uint64), r"'count' holds 18446744073709551615"),
])
def test_what_cannot_be_cast_is_refused_and_nothing_changes(key, value, match):
    m = nn.Linear(2, 3)
    m.register_buffer("count", np.array(4, np.int64))
    before = m.state_dict()
    sd = dict(before, bias=before["bias"] + 1, **{key: value})
    with pytest.raises(TypeError, match=match):
        m.load_state_dict(sd)
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(v, before[k])
    m.load_state_dict(dict(before, count=np.array(7.0)))  # a whole float counts
    assert m.count.numpy().dtype == np.int64 and int(m.count.item()) == 7


def test_module_version_counts_every_change_a_compiled_graph_must_follow():
    """``Module.version``: ``traced`` for a replaced or removed parameter, buffer or sub-module
    and a flipped ``requires_grad`` / ``track_running_stats``; ``modes`` for a flipped
    ``training``; a no-op changes neither."""
    m = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    lin, bn = m[0], m[1]

    def bumps(change):
        before = nn.Module.version
        change()
        after = nn.Module.version
        return after.traced - before.traced, after.modes - before.modes

    assert bumps(lambda: setattr(lin, "weight", nn.Parameter(np.zeros((2, 2), np.float32)))) \
        == (1, 0)
    assert bumps(lambda: delattr(lin, "bias")) == (1, 0)
    assert bumps(lambda: setattr(bn, "running_mean", np.ones(2, np.float32))) == (1, 0)
    assert bumps(lambda: setattr(m, "1", nn.Identity())) == (1, 0)
    assert bumps(lambda: lin.weight.requires_grad_(False)) == (1, 0)
    assert bumps(lambda: lin.weight.requires_grad_(False)) == (0, 0)
    assert bumps(lambda: setattr(bn, "track_running_stats", False)) == (1, 0)
    assert bumps(lambda: setattr(bn, "track_running_stats", False)) == (0, 0)
    assert bumps(m.eval) == (0, 3)                    # m, its Linear and the Identity
    assert bumps(m.eval) == (0, 0)
    assert bumps(lambda: setattr(lin, "plain", 3)) == (0, 0)


def test_sequential_takes_an_ordered_dict_and_slices_into_a_sequential():
    """``torch.nn.Sequential``'s documentation: an ``OrderedDict`` of modules names them by its
    keys; ``seq[i:j]`` is a Sequential that keeps the names (PyTorch's
    ``test_nn.py::test_Sequential_getitem``); a name with a dot is refused (``add_module``)."""
    a, b, c = nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)
    seq = nn.Sequential(OrderedDict(fc1=a, act=b, fc2=c))
    assert list(seq.state_dict()) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert seq[0] is a and seq[-1] is c and list(seq) == [a, b, c]
    tail = seq[1:]
    assert isinstance(tail, nn.Sequential) and list(tail) == [b, c]
    assert list(tail.state_dict()) == ["fc2.weight", "fc2.bias"]
    assert list(nn.Sequential(a, b, c)[::2].state_dict()) == ["0.weight", "0.bias", "2.weight",
                                                             "2.bias"]
    with pytest.raises(ValueError, match=r"Sequential: module name 'a\.b' must be non-empty"):
        nn.Sequential(OrderedDict([("a.b", a)]))
    with pytest.raises(TypeError, match="Sequential: module 'x' is int, not a Module"):
        nn.Sequential(OrderedDict(x=1))
    if torch is None:
        pytest.skip("torch is not installed")
    want = torch.nn.Sequential(OrderedDict(fc1=torch.nn.Linear(2, 3), act=torch.nn.ReLU()))
    assert list(want[1:]._modules) == list(seq[1:2]._modules) == ["act"]


@pytest.mark.parametrize("value", [np.ones((3, 4), np.float32), "tensor"])
def test_module_refuses_a_non_parameter_assigned_to_a_parameter_and_keeps_it(value):
    """``torch.nn.Module.__setattr__``: a parameter's name takes an ``nn.Parameter`` or None
    (TypeError "cannot assign ... as parameter 'weight'"); the parameter stays registered."""
    m = nn.Linear(4, 3)
    before = m.weight
    value = mf.tensor(np.ones((3, 4), np.float32)) if isinstance(value, str) else value
    with pytest.raises(TypeError, match="cannot assign .* as parameter 'weight'"):
        m.weight = value
    assert m.weight is before
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias"]
    m.weight = nn.Parameter(np.zeros((3, 4), np.float32))   # a Parameter replaces it
    assert np.array_equal(m.state_dict()["weight"], np.zeros((3, 4), np.float32))
    m.bias = None   # None keeps the name registered, as torch does: listed nowhere
    assert [n for n, _ in m.named_parameters()] == ["weight"]
    assert list(m.state_dict()) == ["weight"]
    m.bias = nn.Parameter(np.ones(3, np.float32))
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias"]
    with pytest.raises(TypeError, match="as child module '0'"):
        nn.Sequential(nn.Linear(2, 2)).__setattr__("0", 3)
    if torch is not None:
        ref = torch.nn.Linear(4, 3)
        with pytest.raises(TypeError, match="cannot assign .* as parameter 'weight'"):
            ref.weight = torch.ones(3, 4)


@pytest.mark.parametrize("prefix", ["model", "model."])
def test_module_named_parameters_joins_a_prefix_with_a_dot(prefix):
    """``torch.nn.Module.named_parameters(prefix="model")``: ``model.0.weight`` (it gave
    ``model0.weight``), as miniflow's ``named_modules`` / ``named_buffers`` join it."""
    net = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    names = [n for n, _ in net.named_parameters(prefix=prefix)]
    assert names[:2] == ["model.0.weight", "model.0.bias"]
    assert names == ["model." + n for n, _ in net.named_parameters()]
    assert [n for n, _ in net.named_buffers(prefix=prefix)] == \
        ["model." + n for n, _ in net.named_buffers()]
    if torch is not None:
        ref = torch.nn.Sequential(torch.nn.Linear(2, 3))
        assert [n for n, _ in ref.named_parameters(prefix="model")][:2] == names[:2]


def test_module_load_state_dict_returns_missing_and_unexpected_keys_and_strict_raises_runtime():
    """``torch.nn.Module.load_state_dict`` returns ``_IncompatibleKeys(missing_keys,
    unexpected_keys)`` (it returned None) and, with ``strict=True``, raises RuntimeError; the
    error is a KeyError too, as miniflow raised before."""
    net = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    sd = net.state_dict()
    assert net.load_state_dict(sd) == ([], [])
    del sd["0.bias"], sd["1.num_batches_tracked"]   # the counter is optional, as in torch
    sd["extra"] = np.zeros(1, np.float32)
    missing, unexpected = net.load_state_dict(sd, strict=False)
    assert (missing, unexpected) == (["0.bias"], ["extra"])
    result = net.load_state_dict(sd, strict=False)
    assert result.missing_keys == ["0.bias"] and result.unexpected_keys == ["extra"]
    for error in (RuntimeError, KeyError):
        with pytest.raises(error, match=r"^load_state_dict: missing keys \['0.bias'\], "
                                        r"unexpected keys \['extra'\]$"):
            net.load_state_dict(sd)
    if torch is not None:
        ref = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
        tsd = {k: torch.from_numpy(v) for k, v in sd.items()}
        assert tuple(ref.load_state_dict(tsd, strict=False)) == (missing, unexpected)
        with pytest.raises(RuntimeError):
            ref.load_state_dict(tsd)
